"""What a full disk on a server host can lose: old ml-env releases and model revisions that nothing uses.

A candidate is a folder directly under one of the candidate roots (``/opt/ml-env/releases/<id>``) or, with depth 2,
two levels under it (``/srv/models/<name>/<revision>``). A candidate is kept when it is (or holds, or lies inside) the
target of a kept link (ml_env's ``current`` and ``previous``) or a path named in a kept file (the server's unit, the
last-known-good and previous-good manifests: their release, ``--model-path``). The others are removed oldest first
(by modification time), and only while their filesystem has less free space than the target ratio. A folder
changed within ``min_age_s`` is never removed (a release or a download being written).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass


@dataclass
class Candidate:
    path: str
    mtime: float
    device: int


def candidates(roots: list[dict]) -> list[Candidate]:
    """The folders under each root ({path, depth}: 1 = its children, 2 = its grandchildren), never a link nor a
    hidden folder."""
    found: list[Candidate] = []
    for root in roots:
        level = [root["path"]]
        for _level in range(int(root.get("depth", 1))):
            level = [
                os.path.join(parent, name)
                for parent in level
                if os.path.isdir(parent) and not os.path.islink(parent)
                for name in sorted(os.listdir(parent))
                if not name.startswith(".")  # a cache or a partial download of another tool
            ]
        for path in level:
            if os.path.isdir(path) and not os.path.islink(path):
                st = os.stat(path)
                found.append(Candidate(path, st.st_mtime, st.st_dev))
    return sorted(found, key=lambda c: (c.mtime, c.path))


def kept_paths(links: list[str], files: list[str]) -> tuple[list[str], list[str]]:
    """(paths in use, texts of the kept files): the resolved targets of the links that exist, and the files' texts."""
    paths = [os.path.realpath(link) for link in links if os.path.exists(link)]
    texts = []
    for name in files:
        try:
            with open(name, encoding="utf-8", errors="replace") as handle:
                texts.append(handle.read())
        except FileNotFoundError:
            continue
    return paths, texts


def in_use(path: str, paths: list[str], texts: list[str]) -> bool:
    """Whether ``path`` is a kept path, holds one or lies inside one, or a kept file names it (or a path in it)."""
    real = os.path.realpath(path)
    for kept in paths:
        if real == kept or kept.startswith(real + os.sep) or real.startswith(kept + os.sep):
            return True
    return any(path in text or real in text for text in texts)


def folder_bytes(path: str) -> int:
    total = 0
    for parent, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total


def prune(
    roots, links, files, target_ratio, min_age_s=3600, remove=True, statvfs=os.statvfs, rmtree=shutil.rmtree, now=None
) -> dict:
    """Remove the candidates nothing uses, oldest first, while their filesystem's free ratio is under the target.
    ``remove`` false (check mode) removes nothing and counts what each candidate would free."""
    paths, texts = kept_paths(links, files)
    found = candidates(roots)
    now = time.time() if now is None else now
    kept = [c.path for c in found if in_use(c.path, paths, texts) or now - c.mtime < min_age_s]
    where: dict[int, str] = {}  # a folder of each filesystem that stays (a candidate's parent)
    freed: dict[int, int] = {}
    removed = []

    def ratio(device: int) -> float:
        """The filesystem's free share as a root-less process sees it (f_bavail), with what check mode would free."""
        st = statvfs(where[device])
        if not st.f_blocks:
            return 1.0
        planned = 0 if remove else freed.get(device, 0) / st.f_frsize
        return (st.f_bavail + planned) / st.f_blocks

    for cand in found:
        where.setdefault(cand.device, os.path.dirname(cand.path))
    before = {device: ratio(device) for device in where}
    for cand in found:
        if cand.path in kept or ratio(cand.device) >= target_ratio:
            continue
        size = folder_bytes(cand.path)
        if remove:
            rmtree(cand.path)
        freed[cand.device] = freed.get(cand.device, 0) + size
        removed.append({"path": cand.path, "bytes": size})
    after = {device: ratio(device) for device in where}
    return {
        "removed": removed,
        "kept": kept,
        "freed_bytes": sum(freed.values()),
        "free_ratio_before": min(before.values()) if before else None,
        "free_ratio_after": min(after.values()) if after else None,
    }
