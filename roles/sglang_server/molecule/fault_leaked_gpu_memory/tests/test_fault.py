"""GPU memory leaked by the old process: a last-known-good that never stopped is marked so;
its leak on the stop is detected and named, nothing is started into the held memory (no rollback into it),
it is never a rollback target again, and the opt-in GPU reset frees the memory so that the new version serves."""

import json
import re

import pytest
from sglang_molecule import LAB_ENV, UNIT_PATH, ask, health, props, report, run_playbook, unit_processes

HOST = "sglang-01"
STATE = "/var/lib/gpufleet/sglang-server"
# The new version: no leak, one flag changed (a restart).
NEW = {
    "sglang_server_environment": LAB_ENV,
    "sglang_server_args_host": {"max-running-requests": 32},
}


def manifest(host, which: str) -> dict:
    return json.loads(host.file(f"{STATE}/{which}/manifest.json").content_string)


def compute_apps(host) -> list[str]:
    return host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()


def test_converged_leaker_is_last_good_but_never_stopped(host):
    r = report(HOST)  # the converge run's report
    assert r["result"] == "ok"
    assert r["last_good"]["stop_record"] == "never stopped"
    assert manifest(host, "last-good")["stopped_cleanly"] is None


@pytest.fixture(scope="module")
def held_deploy(host):
    before = props(host)
    old_pids = set(compute_apps(host))
    since = host.check_output("date +%s")
    rc, out = run_playbook("playbooks/deploy_server.yml", NEW)
    return before, old_pids, rc, out, since


def test_leak_after_the_stop_is_named_and_nothing_starts_into_it(host, held_deploy):
    before, old_pids, rc, out, since = held_deploy
    assert rc != 0
    assert "GPU memory stays held after stopping sglang-server.service (GPUs 0,1,2,3,4,5,6,7)" in out
    gone = r"pid (\d+) \(sglang::scheduler_TP\d, GPUs \d, \d+ MiB, process gone: leaked allocation"
    named = set(re.findall(gone, out))
    assert named and named == old_pids
    assert "Nothing was started into it" in out and "sglang_server_held_memory_gpu_reset=true" in out
    assert "SERVER STOPPED" in out and "ROLLBACK FAILED" not in out
    after = props(host)
    assert after["ActiveState"] in ("inactive", "failed") and after["MainPID"] == "0"
    assert after["InvocationID"] == before["InvocationID"]  # nothing was started after the stop
    assert unit_processes(host) == []
    journal = host.check_output(f"journalctl -u sglang-server --no-pager --since @{since}")
    assert "Load weight begin" not in journal and "CUDA out of memory" not in journal
    r = report(HOST)
    assert r["result"] == "memory_held" and r["failure"]["phase"] == "stop"
    assert r["rollback"]["performed"] is False
    assert sorted(r["held_memory"]["gone_pids"]) == sorted(int(p) for p in old_pids)
    assert manifest(host, "last-good")["stopped_cleanly"] is False  # a leaker: never a rollback target


def test_next_deploy_without_a_remedy_is_refused_before_anything(host, held_deploy):
    rc, out = run_playbook("playbooks/deploy_server.yml", NEW)
    assert rc != 0
    assert "are held by processes outside sglang-server.service" in out
    assert "sglang_server_held_memory_gpu_reset=true" in out
    assert report(HOST)["result"] == "failed" and report(HOST)["failure"]["phase"] == "validate"


def test_gpu_reset_frees_the_leak_and_the_new_version_serves(host, held_deploy):
    rc, out = run_playbook("playbooks/deploy_server.yml", {**NEW, "sglang_server_held_memory_gpu_reset": True})
    assert rc == 0, out[-3000:]
    r = report(HOST)
    assert r["result"] == "ok"
    assert r["remedy"]["tried"] == ["gpu-reset 0,1,2,3,4,5,6,7"] and r["remedy"]["rc"] == 0
    assert "was successfully reset" in r["remedy"]["output"]
    assert props(host)["ActiveState"] == "active" and health(host) == "200"
    assert "Paris" in ask(host, "What is the capital of France?")
    assert "--max-running-requests 32" in host.file(UNIT_PATH).content_string
    ours = {str(p["pid"]) for p in unit_processes(host)}
    assert compute_apps(host) and set(compute_apps(host)) <= ours  # only the new server's schedulers
    assert r["last_good"]["stop_record"] == "never stopped"
    assert manifest(host, "previous-good")["stopped_cleanly"] is False


def test_the_leaker_is_not_restored_on_demand(host, held_deploy):
    before = props(host)
    rc, out = run_playbook("playbooks/rollback.yml")
    assert rc != 0
    assert "left GPU memory held when it was stopped" in out and "never a rollback target" in out
    assert props(host) == before and health(host) == "200"


# The reboot remedy: a leaking version serves again and is last-known-good, never stopped; the next
# deploy stops it, the memory stays held, and with sglang_server_held_memory_reboot=true (no GPU reset) the
# role reboots the VM (ansible.builtin.reboot; the lab host's supervisor boots it again, a new boot ID and an
# empty /dev/shm, where the simulated GPUs keep their state) and starts the new version into the freed GPUs.
LEAKER = {"sglang_server_environment": {**LAB_ENV, "SGLANG_SIM_FAULT": "leak-gpu-memory"}}
AFTER_REBOOT = {
    **NEW,
    "sglang_server_args_host": {"max-running-requests": 16},
    "sglang_server_held_memory_reboot": True,
}


@pytest.fixture(scope="module")
def reboot_deploy(host, held_deploy):
    rc, out = run_playbook("playbooks/deploy_server.yml", LEAKER)
    assert rc == 0, out[-3000:]
    assert manifest(host, "last-good")["stopped_cleanly"] is None  # the leaker again, never stopped
    boot_id = host.check_output("cat /proc/sys/kernel/random/boot_id")
    rc, out = run_playbook("playbooks/deploy_server.yml", AFTER_REBOOT)
    return boot_id, rc, out


def test_the_reboot_remedy_frees_the_leak_and_the_new_version_serves(host, reboot_deploy):
    boot_id, rc, out = reboot_deploy
    assert rc == 0, out[-3000:]
    assert "TASK [sglang_server : Reboot]" in out
    assert host.check_output("cat /proc/sys/kernel/random/boot_id") != boot_id  # the VM did reboot
    r = report(HOST)
    assert r["result"] == "ok"
    assert r["remedy"]["tried"] == ["reboot"] and r["remedy"]["rebooted"] is True
    assert props(host)["ActiveState"] == "active" and health(host) == "200"
    assert "Paris" in ask(host, "What is the capital of France?")
    assert "--max-running-requests 16" in host.file(UNIT_PATH).content_string
    assert host.check_output("systemctl is-enabled sglang-server.service") == "enabled"  # disabled for the reboot only
    ours = {str(p["pid"]) for p in unit_processes(host)}
    assert compute_apps(host) and set(compute_apps(host)) <= ours  # only the new server's schedulers
    assert manifest(host, "previous-good")["stopped_cleanly"] is False  # the leaker: never a rollback target
