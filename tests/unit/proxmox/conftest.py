"""Fixtures of the proxmox tests: the simulated Proxmox VE API on loopback (lab/pvesim) and a playbook runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pvesim.server import PveSim, PveSimServer

sys.path.insert(0, str(Path(__file__).parent))
from cluster import cluster  # noqa: E402
from proxmox_runner import Runner  # noqa: E402


@pytest.fixture
def pve(tmp_path):
    with PveSimServer(PveSim(cluster()), tmp_path) as server:
        yield server


@pytest.fixture
def runner(pve, tmp_path):
    return Runner(pve, tmp_path)
