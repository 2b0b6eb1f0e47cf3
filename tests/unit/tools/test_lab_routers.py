"""The lab tool's gateway hosts (--routers): names, and their own inventory group fleet_routers."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))

from gpufleet_lab.cli import _parse_args, router_names, write_inventory  # noqa: E402
from gpufleet_lab.lab import Lab  # noqa: E402


def test_router_hosts_form_their_own_group(tmp_path):
    lab = Lab("demo")
    instances = [
        {"name": "demo-01", "address": "10.0.0.2", "profile": "rtx-pro-6000x8-vm"},
        {"name": "demo-02", "address": "10.0.0.3", "profile": "rtx-pro-6000x8-vm"},
        {"name": "demo-router-01", "address": "10.0.0.4", "profile": "none"},
    ]
    path = tmp_path / "hosts.yml"
    assert write_inventory(path, lab, instances, router_names("demo", 1))
    groups = yaml.safe_load(path.read_text().split("\n", 2)[2])["all"]["children"]
    assert list(groups["sglang_servers"]["hosts"]) == ["demo-01", "demo-02"]
    assert list(groups["fleet_routers"]["hosts"]) == ["demo-router-01"]
    assert set(groups["gpufleet_lab"]["hosts"]) == {"demo-01", "demo-02", "demo-router-01"}
    # Without routers the inventory is as before: no fleet_routers group.
    write_inventory(path, lab, instances[:2])
    assert "fleet_routers" not in yaml.safe_load(path.read_text().split("\n", 2)[2])["all"]["children"]


def test_routers_option():
    assert _parse_args(["--name", "x", "up", "--hosts", "4", "--routers", "1"]).routers == 1
    assert _parse_args(["up"]).routers == 0
    assert router_names("lab", 2) == ["lab-router-01", "lab-router-02"]
