"""Render a role's templates through Ansible (its defaults and vars loaded, the inventory's values as extra vars),
as the role's own template tasks would on a host, so tests can hand the files to the programs that read them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from role_flags import local_ansible_env

REPO = Path(__file__).resolve().parents[2]

PLAY = """
- name: Render the {role} role's templates
  hosts: {host}
  gather_facts: false
  vars_files: ["{role_dir}/defaults/main.yml", "{role_dir}/vars/main.yml"]
  tasks:
    - name: Render
      ansible.builtin.template:
        src: "{role_dir}/templates/{{{{ item }}}}.j2"
        dest: "{out}/{{{{ item }}}}"
        mode: "0644"
      loop: {files}
"""


def render_role_templates(tmp_path: Path, role: str, files: list[str], extra_vars: dict, host: str = "gpu-01",
                          host_vars: dict | None = None) -> Path:  # fmt: skip
    """The folder (``tmp_path``/out) that holds ``files`` rendered from roles/``role``/templates/<file>.j2 on the
    local ``host`` (with ``host_vars`` besides its local connection), ``extra_vars`` passed with -e."""
    out = tmp_path / "out"
    out.mkdir()
    role_dir = REPO / "roles" / role
    (tmp_path / "play.yml").write_text(
        PLAY.format(role=role, host=host, role_dir=role_dir, out=out, files=json.dumps(files))
    )
    variables = {**(host_vars or {}), "ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {host: variables}}}))
    (tmp_path / "extra.json").write_text(json.dumps(extra_vars))
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
         "-e", f"@{tmp_path / 'extra.json'}"],
        cwd=REPO, env=local_ansible_env(), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out
