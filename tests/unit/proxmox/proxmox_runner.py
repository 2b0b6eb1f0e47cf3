"""The playbook runner of the proxmox tests (a module of its own: `from conftest import` would pick whichever
conftest.py pytest loaded last when several test directories are given)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from cluster import PASSWORD, cluster, inventory
from pvesim.server import PveSim, PveSimServer

ROOT = Path(__file__).resolve().parents[3]


class Runner:
    def __init__(self, server: PveSimServer, tmp: Path, hosts: dict | None = None):
        """hosts: the VMs' variables to start from (a provisioned cluster's inventory), else the test inventory's."""
        self.server, self.tmp = server, tmp
        self.inventory = inventory(server.port)
        if hosts is not None:
            self.inventory["all"]["children"]["proxmox_gpu_vms"]["hosts"] = copy.deepcopy(hosts)
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


@dataclass
class Provisioned:
    """The tests' cluster after provision.yml created its three VMs (gpu-a1 with the experimental GPUDirect clique),
    the inventory that made it, and what that run printed and left."""

    sim: PveSim
    hosts: dict
    run: subprocess.CompletedProcess
    report_files: dict[str, str]  # host -> its report file's text

    @property
    def reports(self) -> dict[str, dict]:
        return {host: json.loads(text) for host, text in self.report_files.items()}


@contextmanager
def simulated_cluster(tmp: Path, start: Provisioned | None = None) -> Iterator[tuple[PveSimServer, Runner]]:
    """pvesim serving the tests' cluster on loopback (a copy of a provisioned one if given), and a Runner of the test
    inventory (or the provisioned one's) against it; files in tmp."""
    sim = start.sim.snapshot() if start else PveSim(cluster())
    with PveSimServer(sim, tmp) as server:
        r = Runner(server, tmp, start.hosts if start else None)
        if start:  # the controller's files as the provisioning run left them
            r.reports.mkdir(parents=True, exist_ok=True)
            for host, text in start.report_files.items():
                (r.reports / f"{host}.json").write_text(text)
        yield server, r


def provision(tmp: Path) -> Provisioned:
    """Provision the tests' cluster once: the scenarios that start from running VMs copy it (Provisioned.sim)."""
    with simulated_cluster(tmp) as (server, r):
        r.hosts()["gpu-a1"]["proxmox_gpu_vm_gpudirect_clique"] = True
        p = r.run("playbooks/provision.yml", "-v")
        reports = {h: f.read_text() for h in r.hosts() if (f := r.reports / f"{h}.json").exists()}
        return Provisioned(server.sim.snapshot(), copy.deepcopy(r.hosts()), p, reports)
