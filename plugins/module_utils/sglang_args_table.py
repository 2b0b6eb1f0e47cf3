"""SGLang's launch_server argument tables, one per engine version (``sglang_args/sglang-args-<version>.json``, beside
this file): option strings, dest, kind (flag, value, list, optional, deprecated), type and choices, reduced from the
version's own parser (``ServerArgs.add_cli_args``; lab/real-engine/dump_parser.py dumps it, lab/real-engine/
reduce_table.py reduces the dump). One per engine lane (docs/engine-lanes.md): 0.5.9 (sglang-cu128), 0.5.10.post1
(sglang-cu128-0.5.10), 0.5.23 (sglang-cu130).

The filters read the tables through here, never by a path into a role.
"""

from __future__ import annotations

import json
import os
import re

TABLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_args")
# The engine version the fleet is pinned to: the table used when a caller names none.
DEFAULT_VERSION = "0.5.9"
_FILE_RE = re.compile(r"sglang-args-([0-9][^/]*)\.json$")
_CACHE: dict[str, dict] = {}


def table_file(table=None) -> str:
    """The file of ``table``: None (the pinned version), a version such as ``0.5.9``, or a path to a table file."""
    table = os.fspath(table) if table else DEFAULT_VERSION
    if os.sep in table or table.endswith(".json"):
        return os.path.normpath(table)
    return os.path.join(TABLES_DIR, f"sglang-args-{table}.json")


def version_order(version: str):
    """0.5.9 < 0.5.10rc0 < 0.5.10 < 0.5.10.post1 < 0.5.23: the release numbers, then pre-release < final < post."""
    m = re.match(r"^(\d+(?:\.\d+)*)\.?([a-z]*)\.?(\d*)$", version)
    if not m:
        return ((), 0, 0, version)
    rank = {"": 0, "post": 1}.get(m.group(2), -1)
    return tuple(int(p) for p in m.group(1).split(".")), rank, int(m.group(3) or 0), version


def table_versions() -> list[str]:
    """The engine versions that have a table here, oldest first."""
    found = [m.group(1) for m in (_FILE_RE.search(name) for name in os.listdir(TABLES_DIR)) if m]
    return sorted(found, key=version_order)


def table_version(table=None) -> str:
    """The engine version a table is for (from its file name), ``?`` for a file named otherwise."""
    m = _FILE_RE.search(table_file(table))
    return m.group(1) if m else "?"


def load_table(table=None) -> dict:
    """``{"--option": entry}`` for every option string of the table (entries shared by aliases)."""
    path = table_file(table)
    if path not in _CACHE:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        _CACHE[path] = {opt: entry for entry in data["arguments"] for opt in entry["options"]}
    return _CACHE[path]
