"""Two labs brought up at once (parallel Molecule scenarios) never get the same subnet.

Picking a free /24 and putting the gateway on the lab's bridge is one step under a machine-wide flock
(/var/lib/gpufleet-lab/network.lock): this test holds that lock, starts two `up` calls for labs whose
names start on the same /24, checks that both wait, then lets them go.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import LAB_ENV, lab
from gpufleet_lab.lab import short_id, subnet_candidates

LOCK = Path("/var/lib/gpufleet-lab/network.lock")


def colliding_names() -> tuple[str, str]:
    """Two lab names whose first subnet candidate is the same /24."""
    first: dict = {}
    for i in range(5000):
        name = f"t-par-{i}"
        subnet = subnet_candidates(name, 1)[0]
        if subnet in first:
            return first[subnet], name
        first[subnet] = name
    raise AssertionError("no two names share a first subnet candidate")


def bridge_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", f"gfl-{short_id(name)}"], capture_output=True).returncode == 0


def test_two_labs_coming_up_at_once_get_different_subnets():
    names = colliding_names()
    assert subnet_candidates(names[0], 1) == subnet_candidates(names[1], 1)
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            procs = [
                subprocess.Popen(
                    [sys.executable, "-m", "gpufleet_lab", "--name", name, "up", "--hosts", "1", "--json"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=LAB_ENV,
                )  # fmt: skip
                for name in names
            ]
            time.sleep(3)
            # While another holds the lock, neither picks a subnet nor makes its bridge.
            assert [p.poll() for p in procs] == [None, None]
            assert [bridge_exists(n) for n in names] == [False, False]
            fcntl.flock(lock, fcntl.LOCK_UN)
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            results.append(json.loads(out))
        subnets = [json.loads(Path(f"/var/lib/gpufleet-lab/{n}/state.json").read_text())["subnet"] for n in names]
        assert subnets[0] != subnets[1], subnets
        assert str(subnet_candidates(names[0], 1)[0]) in subnets
        for name, result in zip(names, results, strict=True):
            out = lab("--name", name, "exec", f"{name}-01", "--", "ip", "-4", "-o", "addr", "show", "eth0").stdout
            assert result["hosts"][0]["address"] in out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.wait(timeout=300)
        for name in names:
            lab("--name", name, "down", check=False)
