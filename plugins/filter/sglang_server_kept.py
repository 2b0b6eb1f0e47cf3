"""Filters over the manifests of the kept versions (last-good, previous-good): how long a restored version
may take to get ready, and how its stops went, in words for the report."""

from __future__ import annotations

import math

# Readiness bound of a restored version when its manifest records how long it took: at least this many
# times that, so a host a bit slower than on the day it was proven is still waited for.
READY_AFTER_FACTOR = 2


def _number(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 and math.isfinite(number) else None


def sglang_rollback_ready_timeout(manifest, fallback) -> int:
    """Seconds a rollback waits for the restored version's /health: the readiness timeout that version was
    proven under (``ready_timeout_s``), and at least ``READY_AFTER_FACTOR`` x the time it needed then
    (``ready_after_s``); ``fallback`` (the start timeout) only for a manifest that records neither. Never the
    new version's ``sglang_server_ready_timeout_s``: the version that failed says nothing about the old one."""
    manifest = manifest if isinstance(manifest, dict) else {}
    timeout = _number(manifest.get("ready_timeout_s"))
    after = _number(manifest.get("ready_after_s"))
    bound = timeout if timeout is not None else (_number(fallback) or 0)
    if after is not None:
        bound = max(bound, after * READY_AFTER_FACTOR)
    if bound <= 0:
        raise ValueError(f"no readiness bound for the restored version: manifest {manifest!r}, fallback {fallback!r}")
    return int(math.ceil(bound))


def sglang_stop_record(manifest) -> str:
    """``stopped_cleanly`` of a kept version in words: never stopped / stopped cleanly / left GPU memory held."""
    manifest = manifest if isinstance(manifest, dict) else {}
    value = manifest.get("stopped_cleanly")
    if value is True:
        return "stopped cleanly"
    if value is False:
        return "left GPU memory held when stopped (never a rollback target)"
    return "never stopped"


class FilterModule:
    def filters(self):
        return {
            "sglang_rollback_ready_timeout": sglang_rollback_ready_timeout,
            "sglang_stop_record": sglang_stop_record,
        }
