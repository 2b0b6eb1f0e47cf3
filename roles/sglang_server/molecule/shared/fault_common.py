"""Shared checks of the fault scenarios: the good version was converged; a bad version is deployed with
the real playbook (captured); the host must fail with a clear message naming the exact phase, the previous
version must be what serves again (the engine process runs the last-good release, flags and environment,
and answers correctly), and the report must record the rollback with the failed start's own journal.

The scenario `faults` runs them for every kind of FAULTS in turn on one host (its conftest parametrizes
`fault`); each kind starts from the good version the previous kind's rollback restored.

GPUFLEET_FAULT_AUTO_ROLLBACK=false runs the bad deploy with sglang_server_auto_rollback=false: these tests
must then fail (proof that they test the rollback, docs/sglang-server.md; in `faults` the first kind fails and
the later ones error, since the good version no longer serves when they start)."""

from __future__ import annotations

import hashlib
import os

import pytest
from sglang_molecule import LAB_ENV, REPORTS, UNIT_PATH, ask, health, props, report, run_playbook, serving, tp_size

HOST = "sglang-01"
RELEASE_A = "/opt/ml-env/releases/sim-a"
READY = "The server is fired up and ready to roll!"
# A crash at start is reported one of two ways, both naming it, by when the readiness job first looks:
# the unit no longer running, or (when systemd's Restart= already started it again, as under a loaded lab)
# the restart loop (plugins/module_utils/sglang_server_ready.py). CI under load saw the second.
CRASHED_AT_START = ("is no longer running during start-up", "crashed during start-up and is in a restart loop")
# fault -> extra vars of the bad version, words the failure message must contain (one of them, for a tuple),
# the exact failure phase,
# journal lines that only this fault produces (in the excerpt of the failed start), and lines a healthy start
# prints that this fault's start must not reach.
FAULTS = {
    "crash-on-start": {
        # also a new ml-env release (sim-b, `current` switched by ml_env): the rollback must switch it back
        "vars": {"sglang_server_ml_env_release": "/opt/ml-env/releases/sim-b"},
        "message": CRASHED_AT_START,
        "phase": "start",
        "journal": ["CUDA driver initialization failed"],
        "not_reached": ["Load weight begin", READY],
    },
    "crash-after-load": {
        "vars": {},
        "message": "during start-up",
        "phase": "start",
        "journal": ["an illegal memory access was encountered"],
        "not_reached": [READY],
    },
    "never-ready": {
        "vars": {"sglang_server_ready_timeout_s": 6},
        "message": "not ready",
        "phase": "start",
        # stuck in the CUDA graph capture: it begins and never ends, the server never gets ready
        "journal": ["fault injection active: never-ready", "Capture cuda graph begin"],
        "not_reached": ["Capture cuda graph end", READY],
    },
    "nan-output": {
        "vars": {},
        "message": "looks like garbage",
        "phase": "start",
        "journal": ["fault injection active: nan-output", READY],
        "not_reached": [],
    },
    "wrong-answer": {
        "vars": {},
        "message": "does not match",
        "phase": "start",
        # a healthy-looking start (ready) of the faulty engine: only generation shows the fault
        "journal": ["fault injection active: wrong-answer", READY],
        "not_reached": ["Traceback"],
    },
    "port-taken": {
        "vars": {},
        "message": CRASHED_AT_START,
        # the cause is in the failure message itself, not only in the journal excerpt after it
        "cause": "ERROR: [Errno 98] error while attempting to bind on address",
        "phase": "start",
        "journal": ["address already in use"],
        "not_reached": [READY],
    },
    "hang-after-ready": {
        "vars": {},
        # named as soon as the engine's own health check fails after its ready line (about 20 s), not after the
        # start-up timeout (120 s) as "not ready"
        "message": "the engine logged that it is fired up and ready, but",
        "cause": "(the engine hangs after start-up); not waiting for the timeout",
        "phase": "start",
        "journal": ["fault injection active: hang-after-ready", READY, "Health check failed"],
        "not_reached": [],
    },
}


def says(text: str, expected) -> bool:
    """The text contains the expected words (a string) or one of them (a tuple)."""
    return any(words in text for words in ((expected,) if isinstance(expected, str) else expected))


def auto_rollback() -> bool:
    return os.environ.get("GPUFLEET_FAULT_AUTO_ROLLBACK", "true").lower() not in ("false", "0", "no")


def bad_vars(fault: str) -> dict:
    spec = FAULTS[fault]
    extra = {} if auto_rollback() else {"sglang_server_auto_rollback": False}
    return {"sglang_server_environment": {**LAB_ENV, "SGLANG_SIM_FAULT": fault}, **spec["vars"], **extra}


def unit_sha(host) -> str:
    return hashlib.sha256(host.file(UNIT_PATH).content).hexdigest()


@pytest.fixture(scope="module")
def bad_deploy(host, fault):
    assert health(host) == "200"
    before = {"props": props(host), "unit_sha": unit_sha(host), "serving": serving(host)}
    assert before["serving"]["engine"] is not None, before["serving"]["processes"]
    if fault == "crash-on-start":  # what the ml_env role does when it builds a new release
        host.run("ln -sfn /opt/ml-env/releases/sim-b /opt/ml-env/current")
    rc, out = run_playbook("playbooks/deploy_server.yml", bad_vars(fault))
    return before, rc, out


def test_host_failed_with_a_clear_message(bad_deploy, fault):
    _before, rc, out = bad_deploy
    assert rc != 0
    assert f"SGLANG SERVER DEPLOY FAILED on {HOST} in phase {FAULTS[fault]['phase']} " in out
    assert says(out, FAULTS[fault]["message"]), out[-3000:]
    if "cause" in FAULTS[fault]:  # in the message, before the rollback's account and the journal excerpt
        message = " ".join(out.split(f"SGLANG SERVER DEPLOY FAILED on {HOST}", 1)[1].split("==>", 1)[0].split())
        assert FAULTS[fault]["cause"] in message, message
    assert "ROLLED BACK: restored the last-known-good version (release sim-a" in out
    assert "Journal excerpt of the failed start:" in out
    assert "failed=1" in out.split("PLAY RECAP")[-1]


def test_previous_version_serves_and_is_healthy(host, bad_deploy):
    """The process that serves now is the last-good version: same unit file, same release, same flags, no
    fault in its environment, and it answers correctly; not only a unit file that says so."""
    before, _rc, _out = bad_deploy
    after = props(host)
    assert after["ActiveState"] == "active"
    assert after["MainPID"] != before["props"]["MainPID"]  # it was stopped for the bad version, then restored
    assert unit_sha(host) == before["unit_sha"]
    now = serving(host)
    engine, old = now["engine"], before["serving"]["engine"]
    assert engine is not None, now["processes"]
    assert engine["pid"] != old["pid"]
    assert engine["argv"][0] == f"{RELEASE_A}/bin/python"
    assert engine["argv"] == old["argv"]  # the last-good release, module and flags
    assert "SGLANG_SIM_FAULT" not in engine["env"]
    assert {k: engine["env"].get(k) for k in LAB_ENV} == LAB_ENV
    info, old_info = now["server_info"], before["serving"]["server_info"]
    for key in ("model_path", "served_model_name", "max_running_requests"):
        assert info[key] == old_info[key], key
    assert tp_size(info) == tp_size(old_info) == 8
    assert health(host) == "200"
    assert "Paris" in ask(host, "What is the capital of France?")
    assert host.file("/opt/ml-env/current").linked_to == RELEASE_A
    apps = host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()
    assert len(apps) == 8
    unit_pids = {str(p["pid"]) for p in now["processes"]}
    assert set(apps) <= unit_pids  # every GPU holder is a process of the restored server


def test_report_records_the_rollback(bad_deploy, fault):
    r = report(HOST)
    assert r["result"] == "rolled_back"
    assert r["rollback"]["performed"] is True and r["rollback"]["healthy"] is True
    assert r["rollback"]["restored"]["release_id"] == "sim-a"
    assert r["failure"]["phase"] == FAULTS[fault]["phase"]
    assert says(r["failure"]["message"], FAULTS[fault]["message"]), r["failure"]["message"]
    assert r["health"]["ok"] is True  # the restored version's health
    failed_start = r["failure"]["invocation_id"]
    assert failed_start and failed_start != r["restart"]["rollback"]["invocation_id"]
    excerpt = r["journal_excerpt"]
    assert excerpt.startswith(str(REPORTS))
    with open(excerpt) as fh:
        text = fh.read()
    assert f"(invocation {failed_start})" in text.splitlines()[0]  # the failed start's journal, not the restore's
    for line in FAULTS[fault]["journal"]:
        assert line in text, line
    for line in FAULTS[fault]["not_reached"]:
        assert line not in text, line
