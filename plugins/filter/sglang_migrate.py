"""Filters of engine lanes (docs/engine-lanes.md): a lock's lane, server flags from one engine version to another, the
migration shown as a diff. The data and the logic are module_utils/sglang_flag_migration.py's; these wrap them.

``sglang_migrate_lane(lock, locks_dir[, var])``   -> {lock, dir, engine_version, cuda_version, table, problem}
``sglang_migrate_flags(flags, from_v, to_v)``     -> {flags, changes, unmapped}
``sglang_migrate_layers(layers, from_v, to_v)``   -> {layers, changes, unmapped} (each naming its layer)
``sglang_migrate_diff(migration)``                -> ["- --nsa-prefill-backend trtllm", "+ --dsa-prefill-...", ...]
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_flag_migration import (
    MigrationError,
    engine_lane,
    migrate_flags,
    migrate_layers,
)
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.filter_errors import as_filter_error


def sglang_migrate_lane(lock, locks_dir=None, variable="ml_env_lock") -> dict:
    """The engine lane of lock ``lock`` under ``locks_dir`` (its pinned sglang, CUDA version, argument table);
    ``variable`` is what a problem calls the setting that named the lock."""
    return engine_lane(lock, locks_dir, variable)


def sglang_migrate_flags(flags, from_version, to_version) -> dict:
    """The flags for ``to_version``, the changes made and the flags no rule maps (by name)."""
    return migrate_flags(flags, from_version, to_version)


def sglang_migrate_layers(layers, from_version, to_version) -> dict:
    """The inventory's flag layers migrated one by one, each change and unmapped flag naming its layer."""
    return migrate_layers(layers, from_version, to_version)


def _render(option: str, value) -> str:
    option = option if str(option).startswith("--") else f"--{option}"
    if value is True:
        return option
    if isinstance(value, (list, tuple)):
        return " ".join([option, *map(str, value)])
    if isinstance(value, dict):
        return f"{option} {json.dumps(value, separators=(',', ':'))}"
    return f"{option} {value}"


def sglang_migrate_diff(migration) -> list[str]:
    """A migration (sglang_migrate_flags' or sglang_migrate_layers' result) as diff lines: ``- old`` / ``+ new  # why``
    per change, ``! option value: why`` per unmapped flag, under a ``<layer>:`` line per layer for a layers' result.
    Flags it leaves as they are do not show."""
    if not isinstance(migration, dict) or "changes" not in migration:
        raise MigrationError(
            "sglang_migrate_diff takes the result of gpufleet.fleet.sglang_migrate_flags or sglang_migrate_layers"
        )
    lines: list[str] = []
    layer = None
    entries = [("change", c) for c in migration["changes"]] + [("unmapped", u) for u in migration.get("unmapped", [])]
    order = list(migration.get("layers") or {})
    entries.sort(key=lambda e: order.index(e[1]["layer"]) if e[1].get("layer") in order else 0)
    for what, entry in entries:
        if entry.get("layer") and entry["layer"] != layer:
            layer = entry["layer"]
            lines.append(f"{layer}:")
        if what == "unmapped":
            lines.append(f"! {_render(entry['option'], entry['value'])}: {entry['why']}")
            continue
        lines += [f"- {_render(o, v)}" for o, v in entry["from"].items()]
        added = [f"+ {_render(o, v)}" for o, v in entry["to"].items()] or ["+ (nothing)"]
        added[-1] += f"  # {entry['why']}"
        lines += added
    return lines


class FilterModule:
    def filters(self):
        return {
            name: as_filter_error(func, MigrationError, name)
            for name, func in (
                ("sglang_migrate_lane", sglang_migrate_lane),
                ("sglang_migrate_flags", sglang_migrate_flags),
                ("sglang_migrate_layers", sglang_migrate_layers),
                ("sglang_migrate_diff", sglang_migrate_diff),
            )
        }
