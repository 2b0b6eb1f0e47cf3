"""Fixtures of the proxmox tests: the simulated Proxmox VE API on loopback (lab/pvesim) and a playbook runner."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pvesim.server import PveSim, PveSimServer

sys.path.insert(0, str(Path(__file__).parent))
from cluster import PASSWORD, cluster, inventory  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def pve(tmp_path):
    with PveSimServer(PveSim(cluster()), tmp_path) as server:
        yield server


class Runner:
    def __init__(self, server: PveSimServer, tmp: Path):
        self.server, self.tmp = server, tmp
        self.inventory = inventory(server.port)
        self.reports = tmp / "reports"

    def hosts(self) -> dict:
        return self.inventory["all"]["children"]["proxmox_gpu_vms"]["hosts"]

    def run(self, playbook: str = "playbooks/provision.yml", *extra: str, env: dict | None = None):
        inv = self.tmp / "hosts.yml"
        inv.write_text(yaml.safe_dump(copy.deepcopy(self.inventory)))
        penv = {
            **os.environ,
            "PROXMOX_USER": "root@pam",
            "PROXMOX_PASSWORD": PASSWORD,
            "ANSIBLE_FORCE_COLOR": "0",
            **(env or {}),
        }
        for k in ("PROXMOX_TOKEN_ID", "PROXMOX_TOKEN_SECRET", "PROXMOX_HOST"):
            penv.pop(k, None) if not env or k not in env else None
        cmd = [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            str(inv),
            playbook,
            "-e",
            f"proxmox_gpu_vm_report_dir={self.reports}",
            *extra,
        ]
        p = subprocess.run(cmd, cwd=ROOT, env=penv, capture_output=True, text=True, timeout=240)
        return p

    def writes(self) -> list[dict]:
        return self.server.sim.writes


@pytest.fixture
def runner(pve, tmp_path):
    return Runner(pve, tmp_path)
