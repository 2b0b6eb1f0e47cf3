"""fleet_common's no-op fast path (tasks_from: converged), run by Ansible against this machine: one command reads the
files, packages and units a role would write; the host is converged only when every file has the content this run
would write, every package is installed and every unit is active and enabled, and each difference is named."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from role_flags import local_ansible_env

REPO = Path(__file__).resolve().parents[3]
PLAY = """
- name: Compare
  hosts: here
  gather_facts: false
  tasks:
    - name: The fast path's comparison
      ansible.builtin.include_role:
        name: fleet_common
        tasks_from: converged
      vars:
        fleet_common_converged_files: {files}
        fleet_common_converged_packages: {packages}
        fleet_common_converged_units: []
    - name: Show
      ansible.builtin.debug:
        msg: "VERDICT {{{{ {{'converged': fleet_common_converged, 'why': fleet_common_converged_why}} | to_json }}}}"
"""


def verdict(tmp_path: Path, files: dict, packages: list) -> dict:
    (tmp_path / "play.yml").write_text(PLAY.format(files=json.dumps(files), packages=json.dumps(packages)))
    (tmp_path / "hosts.yml").write_text(
        f"all:\n  hosts:\n    here: {{ansible_connection: local, ansible_python_interpreter: {sys.executable}}}\n"
    )
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
        env=local_ansible_env(ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACK_RESULT_FORMAT="json"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = next(s for s in proc.stdout.splitlines() if '"msg": "VERDICT ' in s)
    return json.loads(json.loads("{" + line.strip() + "}")["msg"].removeprefix("VERDICT "))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_host_as_this_run_would_leave_it_is_converged_and_each_difference_is_named(tmp_path):
    a, b = tmp_path / "a.conf", tmp_path / "with space.conf"
    a.write_text("listen 1\n")
    b.write_text("x")
    files = {str(a): sha("listen 1\n"), str(b): sha("x")}
    assert verdict(tmp_path, files, ["bash"]) == {"converged": True, "why": []}
    a.write_text("listen 2\n")  # a hand edit
    missing = tmp_path / "missing.conf"
    got = verdict(tmp_path, files | {str(missing): sha("y")}, ["bash", "no-such-package-gpufleet"])
    assert got["converged"] is False
    assert got["why"] == [f"differs: {a}", f"missing or unreadable: {missing}",
                          "package no-such-package-gpufleet absent"]  # fmt: skip
