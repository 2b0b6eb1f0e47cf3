"""GPU memory leaked by the old process: detected after the stop (PIDs named), previous version restored;
a later deploy is refused before the stop while the leak holds the GPUs."""

import re

import pytest
from fault_common import auto_rollback
from sglang_molecule import LAB_ENV, UNIT_PATH, ask, health, props, report, run_playbook

HOST = "sglang-01"
OLD = {
    "sglang_server_args_host": {"mem-fraction-static": 0.4},
    "sglang_server_environment": {**LAB_ENV, "SGLANG_SIM_FAULT": "leak-gpu-memory"},
}
NEW = {**OLD, "sglang_server_args_host": {"mem-fraction-static": 0.4, "max-running-requests": 32}}


@pytest.fixture(scope="module")
def bad_deploy(host):
    before = props(host)
    old_pids = set(host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader").split())
    extra = {} if auto_rollback() else {"sglang_server_auto_rollback": False}  # GPUFLEET_FAULT_AUTO_ROLLBACK
    rc, out = run_playbook("playbooks/deploy_server.yml", {**NEW, **extra})
    return before, old_pids, rc, out


def test_leak_is_detected_after_the_stop_naming_the_pids(bad_deploy):
    _before, old_pids, rc, out = bad_deploy
    assert rc != 0
    assert "GPU memory not released" in out and "process gone: leaked allocation" in out
    named = set(re.findall(r"pid (\d+) \(sglang::scheduler_TP", out))
    assert named and named <= old_pids
    assert "ROLLED BACK: restored the last-known-good version" in out


def test_previous_version_serves_beside_the_leak(host, bad_deploy):
    before, _old, _rc, _out = bad_deploy
    after = props(host)
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    assert health(host) == "200"
    assert "Paris" in ask(host, "What is the capital of France?")
    assert "--max-running-requests 64" in host.file(UNIT_PATH).content_string
    r = report(HOST)
    assert r["result"] == "rolled_back" and r["rollback"]["healthy"] is True
    assert r["failure"]["phase"] == "stop"


def test_next_deploy_is_refused_before_the_stop(host, bad_deploy):
    before = props(host)
    rc, out = run_playbook("playbooks/deploy_server.yml", NEW)
    assert rc != 0
    assert "are held by processes outside sglang-server.service" in out
    assert "The running server was not stopped" in out
    assert props(host) == before
    assert health(host) == "200"
    assert report(HOST)["result"] == "failed"
