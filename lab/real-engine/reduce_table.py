#!/usr/bin/env python3
"""Reduce a dump of sglang's own launch_server parser (lab/real-engine/dump_parser.py, the format of
lab/sglang-sim/src/sglang_sim/data/server-args-<version>.json) to the role's argument table
(plugins/module_utils/sglang_args/sglang-args-<version>.json): option strings, dest, kind, type and choices.

    python lab/real-engine/reduce_table.py lab/sglang-sim/src/sglang_sim/data/server-args-0.5.23.json \
        -o plugins/module_utils/sglang_args/sglang-args-0.5.23.json

kind: ``deprecated`` (sglang's DeprecatedAction: retired, a no-op or an error), ``flag`` (no value: store_true,
BooleanOptionalAction's --x/--no-x, DeprecatedStoreTrueAction), ``list`` (nargs + or *), ``optional`` (nargs ?),
``value`` (one value). ``type`` is the parser's type name (absent for flags and deprecated options); ``choices`` as the
dump lists them; ``"deprecated": true`` on a deprecated spelling that still works (Deprecated{StoreTrue,StoreConst,
AliasStore}Action). Arguments keep the parser's order, one a line.
Reducing the 0.5.9 dump gives the committed sglang-args-0.5.9.json byte for byte
(tests/unit/sglang_server/test_engine_lanes.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NOTE = (
    "Argument table of sglang {version}'s launch_server parser (ServerArgs.add_cli_args), reduced to what gpufleet "
    "needs to render argv: option strings, dest, kind (flag = store_true, value, list = nargs +/*, optional = nargs ?, "
    "deprecated), type and choices. The exact-flag check uses the installed engine's --help."
)


# sglang's deprecated spellings that still work (0.5.10+: arg_groups/argparse_actions.py): the option does what its
# replacement does and warns; the table marks them "deprecated": true (the migration table names the replacement).
STILL_WORKING_DEPRECATED = {"DeprecatedStoreTrueAction", "DeprecatedStoreConstAction", "DeprecatedAliasStoreAction"}


def kind_of(argument: dict) -> str:
    """How the role renders the option: by sglang's action and nargs (a value-less action is a switch)."""
    action, nargs = argument["action"], argument["nargs"]
    if action == "DeprecatedAction":  # retired: a no-op that warns, or an error naming the replacement
        return "deprecated"
    if nargs == 0:  # store_true, BooleanOptionalAction (--x/--no-x), DeprecatedStoreTrueAction, ...
        return "flag"
    if nargs in ("+", "*"):
        return "list"
    if nargs == "?":
        return "optional"
    if nargs is None:
        return "value"
    raise SystemExit(f"{argument['options']}: nargs {nargs!r} has no kind in the role's table (extend kind_of)")


def reduce_argument(argument: dict) -> dict:
    entry = {"options": argument["options"], "dest": argument["dest"], "kind": kind_of(argument)}
    if entry["kind"] not in ("flag", "deprecated") and argument["type"] is not None:
        entry["type"] = argument["type"]
    if argument["choices"] is not None:
        entry["choices"] = argument["choices"]
    if argument["action"] in STILL_WORKING_DEPRECATED:
        entry["deprecated"] = True
    return entry


def reduce_dump(dump: dict) -> dict:
    if dump.get("package") != "sglang" or not str(dump.get("parser", "")).startswith("ServerArgs.add_cli_args"):
        raise SystemExit("not a dump of sglang's ServerArgs.add_cli_args (lab/real-engine/dump_parser.py)")
    return {
        "package": "sglang",
        "version": dump["version"],
        "note": NOTE.format(version=dump["version"]),
        "arguments": [reduce_argument(a) for a in dump["arguments"] if a["options"]],
    }


def render(table: dict) -> str:
    """The committed layout: the header keys indented, one argument a line."""
    head = ",\n".join(f"  {json.dumps(k)}: {json.dumps(table[k])}" for k in ("package", "version", "note"))
    rows = ",\n".join(f"    {json.dumps(a)}" for a in table["arguments"])
    return "{\n" + head + ',\n  "arguments": [\n' + rows + "\n  ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", help="a parser dump (dump_parser.py's output)")
    parser.add_argument("-o", "--output", help="the table file to write (default: stdout)")
    args = parser.parse_args(argv)
    text = render(reduce_dump(json.loads(Path(args.dump).read_text())))
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
