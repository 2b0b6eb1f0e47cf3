"""Files of a staged model directory: the state and manifest names, hashes, free space, JSON state, errors."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from pathlib import Path

MANIFEST = ".gpufleet-manifest.json"
STATE = ".gpufleet-stage.json"
PARTIAL = ".gpufleet-partial"
MANIFEST_FORMAT = "gpufleet-model-manifest/1"
HF_META_DIR = ".cache/huggingface"
COMMIT_RE_LEN = 40
BUF = 4 * 1024 * 1024


class StageError(Exception):
    """A refusal or failure with a message for the operator."""


def is_commit(revision: str | None) -> bool:
    return bool(revision) and len(revision) == COMMIT_RE_LEN and all(c in "0123456789abcdef" for c in revision)


def human(n: float, digits: int = 2) -> str:
    """A byte count for people: ``512 B``, ``1.50 GiB`` (``digits`` decimals above bytes)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"


def hash_file(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file in one pass."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    blob = hashlib.sha1(b"blob %d\0" % size)  # noqa: S324 - git's object id, not a security hash
    with path.open("rb") as fh:
        while chunk := fh.read(BUF):
            sha256.update(chunk)
            blob.update(chunk)
    return sha256.hexdigest(), blob.hexdigest()


def filter_paths(paths, allow, ignore):
    out = []
    for p in paths:
        if allow and not any(fnmatch.fnmatch(p, pat) for pat in allow):
            continue
        if ignore and any(fnmatch.fnmatch(p, pat) for pat in ignore):
            continue
        out.append(p)
    return out


def free_space(dest: Path) -> int:
    probe = dest
    while not probe.exists():
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict, mode: int | None = None) -> None:
    """Write ``data`` as JSON atomically (a temporary file beside it, then a rename); with ``mode``, the file has that
    mode from the moment it appears (set on the temporary file, whatever the umask)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)
