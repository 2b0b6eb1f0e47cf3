"""Rollout and rollback paths that a single-host fault scenario cannot show, on two lab hosts.

In order (each test leaves both hosts serving the good version again):
1. serial: a restart of both hosts proves host 1 healthy before host 2 is stopped;
2. the first failed host stops the rollout: host 2 is never touched;
3. sglang_server_auto_rollback=false: the failed version stays installed (not rolled back) and is reported;
4. the rollback itself fails (the last-good release is gone): the server is left STOPPED, and the message
   and the report say so;
5. a first deploy that fails: nothing to roll back to, reported as such.
"""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from sglang_molecule import LAB_ENV, UNIT, UNIT_PATH, ask, health, report, run_playbook, serving, unit_processes

HOSTS = ("sglang-01", "sglang-02")
RELEASE_A = "/opt/ml-env/releases/sim-a"


def fault_vars(fault: str, **extra) -> dict:
    return {"sglang_server_environment": {**LAB_ENV, "SGLANG_SIM_FAULT": fault}, **extra}


def state(h) -> dict:
    out = h.check_output(f"systemctl show {UNIT} --property=ActiveState,MainPID,ExecMainStartTimestamp")
    props = dict(line.split("=", 1) for line in out.splitlines())
    props["unit_sha"] = hashlib.sha256(h.file(UNIT_PATH).content).hexdigest() if h.file(UNIT_PATH).exists else ""
    return props


def started_at(h) -> float:
    """The server's start time (epoch seconds; lab hosts share the controller's clock)."""
    return float(h.check_output(f'date -d "$(systemctl show {UNIT} -p ExecMainStartTimestamp --value)" +%s.%N'))


def assert_serving_good(h) -> None:
    s = serving(h)
    assert s["engine"] is not None, s["processes"]
    assert s["engine"]["argv"][0] == f"{RELEASE_A}/bin/python"
    assert "SGLANG_SIM_FAULT" not in s["engine"]["env"]
    assert health(h) == "200"
    assert "Paris" in ask(h, "What is the capital of France?")


def assert_stopped(h) -> None:
    """Nothing of the server runs: unit not active, no process of it, no GPU memory held, port closed."""
    st = state(h)
    assert st["ActiveState"] in ("inactive", "failed") and st["MainPID"] == "0", st
    assert unit_processes(h) == []
    assert h.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader") == ""
    assert h.run("curl -s --max-time 5 http://127.0.0.1:8000/health").rc != 0


def redeploy_good(h, name: str) -> None:
    rc, out = run_playbook("playbooks/deploy_server.yml", limit=name)
    assert rc == 0, out[-3000:]
    assert report(name)["result"] in ("ok", "unchanged")
    assert_serving_good(h)


@pytest.fixture(scope="module")
def hosts(host_by_name):
    return {name: host_by_name(name) for name in HOSTS}


def test_both_hosts_serve_the_good_version(hosts):
    for h in hosts.values():
        assert_serving_good(h)


def test_serial_rollout_proves_host_1_healthy_before_host_2_stops(hosts):
    rc, out = run_playbook("playbooks/restart.yml")
    assert rc == 0, out[-3000:]
    assert out.count("PLAY [SGLang server - safe restart]") == 2  # one batch per host
    finished = dt.datetime.fromisoformat(report("sglang-01")["finished_at"])  # UTC (now(utc=true))
    first_done = (finished if finished.tzinfo else finished.replace(tzinfo=dt.UTC)).timestamp()
    assert report("sglang-01")["result"] == "ok" and report("sglang-01")["health"]["ok"] is True
    assert started_at(hosts["sglang-02"]) > first_done
    assert report("sglang-02")["result"] == "ok"


def test_first_failed_host_stops_the_rollout(hosts):
    untouched = state(hosts["sglang-02"])
    report_before = report("sglang-02")
    rc, out = run_playbook("playbooks/deploy_server.yml", fault_vars("crash-after-load"))
    assert rc != 0
    assert "SGLANG SERVER DEPLOY FAILED on sglang-01" in out and "ROLLED BACK" in out
    # The restart play (batches of sglang_server_serial=1) stopped at sglang-01's batch: no task ran on sglang-02.
    restart_play = out.split("PLAY [SGLang server - restart")[1].split("PLAY RECAP")[0]
    assert "sglang-01" in restart_play and "sglang-02" not in restart_play
    assert report("sglang-01")["result"] == "rolled_back"
    assert state(hosts["sglang-02"]) == untouched  # not stopped, unit not replaced
    assert report("sglang-02") == report_before
    assert_serving_good(hosts["sglang-01"])
    assert_serving_good(hosts["sglang-02"])


def test_auto_rollback_off_leaves_the_failed_version_and_reports_it(hosts):
    h = hosts["sglang-01"]
    rc, out = run_playbook(
        "playbooks/deploy_server.yml", fault_vars("wrong-answer", sglang_server_auto_rollback=False), limit="sglang-01"
    )
    assert rc != 0
    assert "does not match" in out
    assert "NOT ROLLED BACK: automatic rollback is off (sglang_server_auto_rollback=false)" in out
    assert "ROLLED BACK: restored" not in out
    r = report("sglang-01")
    assert r["result"] == "failed" and r["rollback"]["performed"] is False
    assert "automatic rollback is off" in r["rollback"]["reason"]
    # The failed version is what is installed: its unit (with the fault) was not replaced by the last-good one.
    assert 'Environment="SGLANG_SIM_FAULT=wrong-answer"' in h.file(UNIT_PATH).content_string
    assert_stopped(h)  # docs/sglang-server.md: the failed version is stopped, not left answering wrongly
    redeploy_good(h, "sglang-01")


def test_rollback_that_fails_leaves_the_server_stopped_and_says_so(hosts):
    h = hosts["sglang-01"]
    # The last-good version cannot start any more: its ml-env release was removed from the host.
    h.check_output(f"mv {RELEASE_A} {RELEASE_A}.away")
    try:
        rc, out = run_playbook(
            "playbooks/deploy_server.yml",
            fault_vars("crash-on-start", sglang_server_ml_env_release="/opt/ml-env/releases/sim-b"),
            limit="sglang-01",
        )
        assert rc != 0
        assert "SGLANG SERVER DEPLOY FAILED on sglang-01 in phase start" in out
        assert "ROLLBACK FAILED: the previous version (release sim-a) failed too" in out
        assert "the server is STOPPED" in out
        r = report("sglang-01")
        assert r["result"] == "rollback_failed"
        assert r["rollback"]["performed"] is True and r["rollback"]["healthy"] is False and r["rollback"]["error"]
        assert "the server is STOPPED" in r["message"]
        assert_stopped(h)
    finally:
        h.run(f"test -d {RELEASE_A}.away && mv {RELEASE_A}.away {RELEASE_A}")
    redeploy_good(h, "sglang-01")


def test_first_deploy_that_fails_has_nothing_to_roll_back_to(hosts):
    h = hosts["sglang-02"]
    # A fresh host: no server, no kept version (what a new VM has before its first deploy).
    h.check_output(
        f"systemctl disable --now {UNIT} && rm -rf {UNIT_PATH} /etc/sglang-server /var/lib/gpufleet/sglang-server"
        " && systemctl daemon-reload"
    )
    rc, out = run_playbook("playbooks/deploy_server.yml", fault_vars("crash-on-start"), limit="sglang-02")
    assert rc != 0
    assert "SGLANG SERVER DEPLOY FAILED on sglang-02 in phase start" in out
    assert "NOT ROLLED BACK: no last-known-good version on the host (first deploy)" in out
    r = report("sglang-02")
    assert r["result"] == "failed" and r["rollback"]["performed"] is False
    assert "first deploy" in r["rollback"]["reason"]
    assert_stopped(h)
    redeploy_good(h, "sglang-02")
