"""Render an expression on inventory hosts after the sglang_server role's own `flags` entry point ran.

The server flags have one owner (roles/sglang_server/tasks/flags.yml, wired by playbooks/vars/fleet.yml);
tests that need the merged flags of an inventory run that entry point instead of copying the merge.
``sglang_server_flags`` (the role's `comm_flags` entry point: inventory flags + the communication flags derived from
gpu_facts_comm on top, as tasks/launch_spec.yml runs it) is defined for the expression when ``gpu_facts_comm`` is
among the extra vars.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PLAY = """
- hosts: {hosts}
  gather_facts: false
  vars_files: ["{repo}/playbooks/vars/fleet.yml"]
  tasks:
    - ansible.builtin.import_role: {{name: sglang_server, tasks_from: flags}}
    - ansible.builtin.import_role: {{name: sglang_server, tasks_from: comm_flags}}
      when: gpu_facts_comm is defined
    - ansible.builtin.debug:
        msg: {expr}
"""


def local_ansible_env(**more: str) -> dict:
    """The environment of a controller-only Ansible run of this checkout (its ansible.cfg and collections, no
    fact cache on disk, no colour); ``more`` adds or replaces variables."""
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_NOCOLOR="1",
        **more,
    )


def render_hosts(inventory, hosts: list[str], expr: str, extra_vars: dict, tmp: Path, *cli: str) -> dict:
    """``{host: value of expr}``; ``extra_vars`` go in with -e (highest precedence), ``cli`` are more arguments."""
    (tmp / "extra.json").write_text(json.dumps(extra_vars))
    (tmp / "play.yml").write_text(PLAY.format(hosts=",".join(hosts), repo=REPO, expr=json.dumps(expr)))
    env = local_ansible_env(ANSIBLE_STDOUT_CALLBACK="json")
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(tmp / "play.yml"),
         "-e", f"@{tmp / 'extra.json'}", *cli],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # ansible.cfg's timing callbacks print around the json callback's document
    doc, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("\n{") + 1 :])
    result = doc["plays"][0]["tasks"][-1]["hosts"]
    return {host: result[host]["msg"] for host in hosts}


def render(inventory, host: str, expr: str, extra_vars: dict, tmp: Path):
    """The value of ``expr`` on ``host``."""
    return render_hosts(inventory, [host], expr, extra_vars, tmp)[host]
