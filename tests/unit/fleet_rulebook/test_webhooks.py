"""fleet_rulebook's entry point webhooks (what fleet_monitor renders Alertmanager's receiver from), on two local hosts:
each rulebook host's own settings, else the role's defaults (never the calling host's); a monitor refuses a rulebook
on another host's loopback, naming it and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from role_flags import local_ansible_env

REPO = Path(__file__).resolve().parents[3]
PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: fleet_rulebook, tasks_from: webhooks}
    - ansible.builtin.debug: {msg: "HOOKS {{ fleet_rulebook_webhooks | map(attribute='url') | list | to_json }}"}
"""


def run(tmp_path: Path, eda: dict) -> subprocess.CompletedProcess:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"mon": local, "eda": {**local, "ansible_host": "10.0.0.9", **eda}},
                         "children": {"fleet_rulebooks": {"hosts": {"mon": {}, "eda": {}}}}}}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    return subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
        cwd=REPO, env=local_ansible_env(), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_each_rulebook_host_is_reached_by_its_own_settings_and_a_loopback_one_only_from_its_host(tmp_path):
    proc = run(tmp_path, {"fleet_rulebook_listen_host": "0.0.0.0", "fleet_rulebook_token": "0123456789abcdef0"})
    out = " ".join(proc.stdout.split())
    # mon keeps the role's default (loopback), whatever eda's inventory says
    assert 'HOOKS ["http://10.0.0.9:5000/alerts", "http://127.0.0.1:5000/alerts"]' in out, out[-3000:]
    assert proc.returncode != 0
    assert (
        "the rulebook service on mon listens on loopback (fleet_rulebook_listen_host), which Alertmanager on eda "
        "cannot reach" in out
    )
    assert "0123456789abcdef0" not in proc.stdout  # the token is never shown


def test_a_service_on_the_ipv6_loopback_is_reached_there_and_ipv6_addresses_in_brackets(tmp_path):
    """A service listening on ::1 only is not reached at 127.0.0.1 (Alertmanager's posts would find nothing there);
    one on an IPv6 address gets it in brackets, as a URL needs."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"mon": {**local, "fleet_rulebook_listen_host": "::1"},
                                   "eda": {**local, "fleet_rulebook_listen_host": "fd00::9",
                                           "fleet_rulebook_token": "0123456789abcdef0"}},
                         "children": {"fleet_rulebooks": {"hosts": {"mon": {}, "eda": {}}}}}}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
         "-l", "mon"],
        cwd=REPO, env=local_ansible_env(), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, out[-3000:]
    assert 'HOOKS ["http://[fd00::9]:5000/alerts", "http://[::1]:5000/alerts"]' in out, out[-3000:]
