"""Reports are kept per fleet: playbooks/vars/fleet.yml puts every report of a run under reports/<fleet>/, the fleet
being the inventory's fleet_name or its folder's name, so two inventories run from one checkout never write into
each other's deploy reports, baselines or fleet report; the benchmark and the rollout read the deploy reports where
sglang_server wrote them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from role_flags import local_ansible_env

REPO = Path(__file__).resolve().parents[3]
SHOWN = [
    "gpufleet_fleet_name",
    "gpufleet_reports_dir",
    "serving_bench_deploy_report_dir",
]
SHOW = "{" + ", ".join(f"'{n}': {n}" for n in SHOWN) + "}"
PLAY = f"""
- name: Show the report folders
  hosts: sglang_servers
  gather_facts: false
  vars_files: ["{REPO}/playbooks/vars/fleet.yml"]
  tasks:
    - name: The folders
      ansible.builtin.debug:
        msg: "FOLDERS {{{{ {SHOW} | to_json }}}}"
"""


def folders(project: Path, inventory: Path) -> dict:
    (project / "playbooks").mkdir(exist_ok=True)
    (project / "playbooks/show.yml").write_text(PLAY)
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), "playbooks/show.yml"]
    proc = subprocess.run(
        argv,
        cwd=project,
        env=local_ansible_env(ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACK_RESULT_FORMAT="json"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(s for s in proc.stdout.splitlines() if '"msg": "FOLDERS ' in s)
    return json.loads(json.loads("{" + line.strip() + "}")["msg"].removeprefix("FOLDERS "))


def inventory(path: Path, group_vars: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "hosts.yml").write_text("all:\n  children:\n    sglang_servers:\n      hosts:\n        gpu-01: {}\n")
    if group_vars:
        (path / "group_vars").mkdir()
        (path / "group_vars/all.yml").write_text(json.dumps(group_vars))
    return path / "hosts.yml"


def test_two_inventories_from_one_checkout_keep_their_own_reports(tmp_path):
    a = folders(tmp_path, inventory(tmp_path / "inventory/staging"))
    b = folders(tmp_path, inventory(tmp_path / "inventory/production"))
    assert a["gpufleet_fleet_name"] == "staging" and b["gpufleet_fleet_name"] == "production"
    assert a["gpufleet_reports_dir"] == f"{tmp_path}/reports/staging"
    assert b["gpufleet_reports_dir"] == f"{tmp_path}/reports/production"
    # the benchmark reads the deploy reports where sglang_server writes them, also in a play that does not load
    # sglang_server (bench.yml's fleet report; this play loads no role either)
    for shown in (a, b):
        assert shown["serving_bench_deploy_report_dir"] == shown["gpufleet_reports_dir"] + "/deploy"


def test_deploy_reports_the_inventory_moves_are_read_there(tmp_path):
    shown = folders(tmp_path, inventory(tmp_path / "inventory/lab", {"sglang_server_report_dir": "/srv/reports"}))
    assert shown["serving_bench_deploy_report_dir"] == "/srv/reports"


def test_the_inventory_names_its_fleet(tmp_path):
    shown = folders(tmp_path, inventory(tmp_path / "inventory/lab", {"fleet_name": "eu-west-h200"}))
    assert shown["gpufleet_fleet_name"] == "eu-west-h200"
    assert shown["gpufleet_reports_dir"] == f"{tmp_path}/reports/eu-west-h200"
