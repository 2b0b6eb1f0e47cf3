"""SGLang's launch_server argument tables, one per engine version (``sglang_args/sglang-args-<version>.json``, beside
this file): option strings, dest, kind (flag, value, list, optional, deprecated), type and choices, reduced from the
version's own parser (``ServerArgs.add_cli_args``; lab/real-engine/dump_parser.py dumps it).

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


def table_versions() -> list[str]:
    """The engine versions that have a table here, oldest first."""
    found = [m.group(1) for m in (_FILE_RE.search(name) for name in os.listdir(TABLES_DIR)) if m]
    return sorted(found, key=lambda v: [int(p) if p.isdigit() else p for p in re.split(r"[.+-]", v)])


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
