"""Dump sglang's own launch_server parser (ServerArgs.add_cli_args) as JSON, in the format of
lab/sglang-sim/src/sglang_sim/data/server-args-0.5.9.json. Run with the python of a release holding sglang:
    <release>/bin/python dump_parser.py > parser.json

Where sglang has general plugins (sglang.srt.plugins.load_plugins, 0.5.11 and later), they are loaded first, as
`python -m sglang.launch_server` loads them before it builds its parser: a plugin may add options (smg-grpc-servicer,
in sglang's own dependencies, adds --servicer-impl and --metrics-port/--metrics-host through a hook on
ServerArgs.add_cli_args). The dump then names the loaded plugins ("plugins") and the parser
"ServerArgs.add_cli_args after sglang.srt.plugins.load_plugins()".
"""

import argparse
import json
import sys

import sglang

try:  # sglang >= 0.5.11: launch_server runs load_plugins() before prepare_server_args() builds the parser
    from sglang.srt.plugins import load_plugins
except ImportError:
    load_plugins = None
if load_plugins is not None:
    load_plugins()
from sglang.srt.server_args import ServerArgs  # noqa: E402 - after the plugins, as launch_server imports it


def plain(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def choices_list(choices):
    return sorted(choices, key=str) if isinstance(choices, (set, frozenset)) else list(choices)


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
            # a set (0.5.9's and 0.5.23's --sampling-backend) in sorted order: its iteration order changes per process
            "choices": None if action.choices is None else plain(choices_list(action.choices)),
            "default": plain(action.default),
        }
    )
dump = {
    "package": "sglang",
    "version": sglang.__version__,
    "parser": "ServerArgs.add_cli_args",
    "allow_abbrev": parser.allow_abbrev,
    "arguments": arguments,
}
if load_plugins is not None:
    from importlib.metadata import entry_points

    dump["parser"] = "ServerArgs.add_cli_args after sglang.srt.plugins.load_plugins()"
    dump["plugins"] = sorted(f"{ep.name} = {ep.value}" for ep in entry_points(group="sglang.srt.plugins"))
json.dump(
    dump,
    sys.stdout,
    indent=1,
)
sys.stdout.write("\n")
