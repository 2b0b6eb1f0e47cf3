"""Dump sglang's own launch_server parser (ServerArgs.add_cli_args) as JSON, in the format of
lab/sglang-sim/src/sglang_sim/data/server-args-0.5.9.json. Run with the python of a release holding sglang:
    <release>/bin/python dump_parser.py > parser.json
"""

import argparse
import json
import sys

import sglang
from sglang.srt.server_args import ServerArgs


def plain(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
arguments = []
for action in parser._actions:
    if isinstance(action, argparse._HelpAction):
        continue
    arguments.append(
        {
            "options": list(action.option_strings),
            "dest": action.dest,
            "action": type(action).__name__,
            "nargs": action.nargs,
            "type": getattr(action.type, "__name__", None) if action.type is not None else None,
            "choices": plain(list(action.choices)) if action.choices is not None else None,
            "default": plain(action.default),
        }
    )
json.dump(
    {
        "package": "sglang",
        "version": sglang.__version__,
        "parser": "ServerArgs.add_cli_args",
        "allow_abbrev": parser.allow_abbrev,
        "arguments": arguments,
    },
    sys.stdout,
    indent=1,
)
sys.stdout.write("\n")
