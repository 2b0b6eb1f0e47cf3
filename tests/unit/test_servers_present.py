"""playbooks/servers_present.yml, the first play of deploy.yml, rollout.yml, restart.yml and rollback.yml: an inventory
with no host in sglang_servers (a mistyped group name, an empty source) or a --limit that names no server is refused
with a message that says so and names the groups it has, before any host is contacted; it never ends as an rc 0
"fleet deploy" of nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from role_flags import local_ansible_env

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
MISTYPED = "all:\n  children:\n    sglang_server:\n      hosts:\n        gpu-01: {ansible_host: 192.0.2.10}\n"
FLEET = (
    "all:\n  children:\n    sglang_servers:\n      hosts:\n        gpu-01: {ansible_host: 192.0.2.10}\n"
    "    fleet_routers:\n      hosts:\n        gw-01: {ansible_host: 192.0.2.20}\n"
)


def run(inventory: Path, playbook: str, *args: str) -> subprocess.CompletedProcess:
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args]
    env = local_ansible_env()
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize(
    "playbook", ["deploy.yml", "playbooks/rollout.yml", "playbooks/restart.yml", "playbooks/rollback.yml"]
)
def test_a_mistyped_server_group_is_refused_naming_the_groups(tmp_path, playbook):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(MISTYPED)
    proc = run(inventory, playbook)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2, out[-2000:]
    assert f"No server to act on: the inventory ({inventory}) has 0 host(s) in group sglang_servers" in out
    assert "the inventory's groups: sglang_server)" in out
    # the refusal is the run's only task (an assert: no host is contacted), and it fails the run
    assert out.count("TASK [") == 1 and "unreachable=0 failed=1" in out


def test_a_limit_that_names_no_server_is_refused_and_one_that_does_is_not(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(FLEET)
    proc = run(inventory, "deploy.yml", "-l", "gw-01")
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2 and "has 1 host(s) in group sglang_servers and --limit gw-01 names none of them" in out
    proc = run(inventory, "playbooks/servers_present.yml", "-l", "gpu-01")
    assert proc.returncode == 0 and "gpu-01 : ok=1" in " ".join(proc.stdout.split()), proc.stdout[-2000:]


def test_a_monitor_group_with_no_host_is_refused(tmp_path):
    """A fleet_monitors group with no host would leave the fleet unwatched while the inventory says it is monitored:
    refused by the first play, before any host is contacted; no group at all is a fleet without monitoring."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(FLEET + "    fleet_monitors:\n      hosts: {}\n")
    proc = run(inventory, "playbooks/servers_present.yml")
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2, out[-2000:]
    assert "has a group fleet_monitors with no host: the fleet would run unwatched" in out
    inventory.write_text(FLEET)
    assert run(inventory, "playbooks/servers_present.yml").returncode == 0


def test_a_bad_serial_is_refused_by_the_first_play_whether_or_not_the_hosts_are_converged(tmp_path):
    """sglang_server_serial is not part of the converged record (how a run goes), so a converged host skipped the
    validation that checked it: deploy.yml's converged play checks it first, on every run, before it looks at a host."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(FLEET)
    proc = run(inventory, "deploy.yml", "-e", "sglang_server_serial=abc")
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2, out[-2000:]
    assert 'sglang_server_serial="abc" is out of range: a positive integer or a percentage' in out
    assert "Compare inputs and unit with the last converged deploy" not in out  # refused before any host is read


def test_two_server_hosts_with_one_address_are_refused_naming_them(tmp_path):
    """One server per inventory host: two names for one machine (its GPUs, port, unit and directories shared; the
    router would reach one server under both names) are refused before any host is contacted, whatever their ssh
    ports."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    sglang_servers:\n      hosts:\n"
        "        gpu-01: {ansible_host: 192.0.2.10}\n"
        "        gpu-01b: {ansible_host: 192.0.2.10, ansible_port: 2222}\n"
        "        gpu-02: {ansible_host: 192.0.2.11}\n"
    )
    proc = run(inventory, "deploy.yml")
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2, out[-2000:]
    assert "One address, several server hosts: gpu-01, gpu-01b have the address 192.0.2.10." in out
    assert "gpufleet runs one SGLang server per inventory host" in out and "gpu-02" not in out.split("PLAY RECAP")[0]
