"""The manifests of the kept (last-known-good) versions of the SGLang server: reading one, and recording the
outcome of a stop (``stopped_cleanly``) into those whose unit was stopped.
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import json
import os


def read_manifest(path: str) -> dict:
    """A kept version's manifest (JSON object), {} when the path is empty, missing or not a JSON object."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_stop(manifests, unit_sha256, released, held, at, waited_s):
    """Write the outcome of a stop into the kept versions' manifests whose unit is the one stopped:
    ``stopped_cleanly`` true (every GPU released), false (memory stayed held by what it left behind).
    Returns the paths written."""
    written = []
    if not unit_sha256:
        return written
    for path in manifests:
        try:
            with open(path, encoding="utf-8") as fh:
                manifest = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(manifest, dict) or manifest.get("unit_sha256") != unit_sha256:
            continue
        clean = bool(released) or not (held or {}).get("caused_by_stop", True)
        if manifest.get("stopped_cleanly") is False and clean:
            clean = False  # once seen to leak, always a leaker (never a rollback target again)
        manifest["stopped_cleanly"] = clean
        manifest["last_stop"] = {
            "at": at,
            "released": bool(released),
            "waited_s": waited_s,
            "held": (held or {}).get("text", ""),
        }
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=4, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        written.append(path)
    return written
