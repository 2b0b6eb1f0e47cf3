"""The shape of the tree a newcomer meets (one way through the code): the launch spec's flags are merged by the
sglang_server role itself, with one playbook (the benchmark's) calling its `flags` entry point by hand; no
third-party code copied into the tree; a README read in five minutes. (No private ansible-core API under plugins/:
tests/unit/tools/test_ansiballz_cache.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def tracked(*pathspec: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *pathspec], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]


def test_at_most_one_playbook_calls_the_flags_entry_point_by_hand():
    callers = [p.name for p in tracked("playbooks") if p.suffix == ".yml" and "tasks_from: flags\n" in p.read_text()]
    assert len(callers) <= 1, callers


def test_no_vendored_package_in_the_tree():
    vendored = sorted({str(p.parent.relative_to(REPO)) for p in tracked() if "_vendor" in p.parts})
    assert vendored == []


def test_the_readme_is_at_most_12_kb():
    assert (REPO / "README.md").stat().st_size <= 12 * 1024
