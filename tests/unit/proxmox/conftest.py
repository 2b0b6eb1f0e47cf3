"""Fixtures of the proxmox tests: the simulated Proxmox VE API on loopback (lab/pvesim), a playbook runner, and the
cluster provisioned once for the scenarios that start from running VMs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pvesim.server import PveSim, PveSimServer

sys.path.insert(0, str(Path(__file__).parent))
from cluster import cluster  # noqa: E402
from proxmox_runner import Provisioned, Runner, provision  # noqa: E402


@pytest.fixture(scope="session")
def provisioned(tmp_path_factory) -> Provisioned:
    """The tests' cluster provisioned once by provision.yml (three running VMs); scenarios start from copies."""
    return provision(tmp_path_factory.mktemp("provisioned"))


@pytest.fixture
def pve(tmp_path):
    with PveSimServer(PveSim(cluster()), tmp_path) as server:
        yield server


@pytest.fixture
def runner(pve, tmp_path):
    return Runner(pve, tmp_path)
