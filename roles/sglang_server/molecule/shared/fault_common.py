"""Shared checks of the fault scenarios: the good version was converged; a bad version is deployed with
the real playbook (captured); the host must fail with a clear message, the previous version must serve
and be healthy again, and the report must record the rollback."""

from __future__ import annotations

import pytest
from sglang_molecule import LAB_ENV, REPORTS, UNIT, UNIT_PATH, ask, exec_start_argv, health, props, report, run_playbook

HOST = "sglang-01"
# fault -> extra vars of the bad version, words the failure message must contain, a journal line of the fault
FAULTS = {
    "crash-on-start": {
        # also a new ml-env release (sim-b, `current` switched by ml_env): the rollback must switch it back
        "vars": {"sglang_server_ml_env_release": "/opt/ml-env/releases/sim-b"},
        "message": "is no longer running during start-up",
        "journal": "CUDA driver initialization failed",
    },
    "crash-after-load": {
        "vars": {},
        "message": "during start-up",
        "journal": "an illegal memory access was encountered",
    },
    "never-ready": {
        "vars": {"sglang_server_ready_timeout_s": 6},
        "message": "not ready",
        "journal": "Capture cuda graph begin",
    },
    # 0.5.9 logs NaN logits only with --enable-nan-detection; the garbage ("!!!!") shows either way
    "nan-output": {
        "vars": {"sglang_server_args_host": {"enable-nan-detection": True}},
        "message": "looks like garbage",
        "journal": "NaN in the logits",
    },
    "wrong-answer": {"vars": {}, "message": "does not match", "journal": "fired up and ready to roll"},
    "port-taken": {"vars": {}, "message": "is no longer running during start-up", "journal": "address already in use"},
}


def bad_vars(fault: str) -> dict:
    spec = FAULTS[fault]
    return {"sglang_server_environment": {**LAB_ENV, "SGLANG_SIM_FAULT": fault}, **spec["vars"]}


@pytest.fixture(scope="module")
def bad_deploy(host, fault):
    assert health(host) == "200"
    before = props(host)
    if fault == "crash-on-start":  # what the ml_env role does when it builds a new release
        host.run("ln -sfn /opt/ml-env/releases/sim-b /opt/ml-env/current")
    rc, out = run_playbook("playbooks/deploy_server.yml", bad_vars(fault))
    return before, rc, out


def test_host_failed_with_a_clear_message(bad_deploy, fault):
    _before, rc, out = bad_deploy
    assert rc != 0
    assert f"SGLANG SERVER DEPLOY FAILED on {HOST}" in out
    assert FAULTS[fault]["message"] in out
    assert "ROLLED BACK: restored the last-known-good version" in out
    assert "Journal excerpt of the failed start:" in out
    assert "failed=1" in out.split("PLAY RECAP")[-1]


def test_previous_version_serves_and_is_healthy(host, bad_deploy):
    before, _rc, _out = bad_deploy
    after = props(host)
    assert after["ActiveState"] == "active"
    assert after["MainPID"] != before["MainPID"]  # it was stopped for the bad version, then restored
    assert health(host) == "200"
    assert "Paris" in ask(host, "What is the capital of France?")
    assert "SGLANG_SIM_FAULT" not in host.file(UNIT_PATH).content_string
    assert exec_start_argv(host)[0] == "/opt/ml-env/releases/sim-a/bin/python"
    assert host.file("/opt/ml-env/current").linked_to == "/opt/ml-env/releases/sim-a"
    assert len(host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()) == 8
    assert host.service(UNIT).is_running


def test_report_records_the_rollback(bad_deploy, fault):
    r = report(HOST)
    assert r["result"] == "rolled_back"
    assert r["rollback"]["performed"] is True and r["rollback"]["healthy"] is True
    assert r["rollback"]["restored"]["release_id"] == "sim-a"
    assert r["failure"]["phase"] in ("start", "stop")
    assert FAULTS[fault]["message"] in r["failure"]["message"]
    assert r["health"]["ok"] is True  # the restored version's health
    excerpt = r["journal_excerpt"]
    assert excerpt.startswith(str(REPORTS))
    with open(excerpt) as fh:
        assert FAULTS[fault]["journal"] in fh.read()
