"""Lab tests: they bring real lab hosts (systemd-nspawn containers) up and down; root needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB_ENV = dict(os.environ, PYTHONPATH=str(ROOT / "lab"))
if str(ROOT / "lab") not in sys.path:
    sys.path.insert(0, str(ROOT / "lab"))  # tests import the lab tool's pure helpers


def lab(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the lab tool's CLI as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", *args],
        capture_output=True,
        text=True,
        env=LAB_ENV,
        check=False,
        timeout=600,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"gpufleet_lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def lab_json(*args: str) -> dict:
    return json.loads(lab(*args, "--json").stdout)


NOT_ROOT = (
    "lab tests need root: they create network namespaces, bridges, NAT rules, overlay mounts, cgroups and "
    "systemd-nspawn hosts. Run them as root (sudo make lab-tests); they are not skipped, so a run without "
    "root cannot pass as green."
)


@pytest.fixture(scope="session", autouse=True)
def _root_only():
    # A refusal, not a skip: a skipped lab suite reads as a pass in CI summaries.
    if os.geteuid() != 0:
        pytest.fail(NOT_ROOT, pytrace=False)


def cgroup_mounts() -> list[Path]:
    """cgroup2 and name=systemd hierarchies, read from /proc/self/mounts (independently of the lab tool)."""
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options, *_ = line.split()
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
            points.append(Path(point))
    return points


class ClientThreads:
    """``workers`` client threads, each running the subclass's ``_run(index)`` from entering the ``with`` block
    until ``stop`` is set at its end (then joined, 90 s at most each)."""

    def __init__(self, workers: int):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)]

    def _run(self, index: int) -> None:
        raise NotImplementedError

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)
