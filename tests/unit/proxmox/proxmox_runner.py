"""The playbook runner of the proxmox tests (a module of its own: `from conftest import` would pick whichever
conftest.py pytest loaded last when several test directories are given)."""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from cluster import PASSWORD, cluster, inventory
from pvesim.server import PveSim, PveSimServer

ROOT = Path(__file__).resolve().parents[3]


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


@contextmanager
def simulated_cluster(tmp: Path) -> Iterator[tuple[PveSimServer, Runner]]:
    """pvesim serving the tests' cluster on loopback, and a Runner of the test inventory against it (files in tmp)."""
    with PveSimServer(PveSim(cluster()), tmp) as server:
        yield server, Runner(server, tmp)
