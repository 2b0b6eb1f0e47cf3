"""The readiness job that sglang_server_swap starts after a start (module_utils/sglang_server_ready.py): it runs
detached from the module run, which returns at once, and leaves ansible-core async_wrapper's record for
gpufleet.fleet.job_wait; then the wait for /health 200 and the health check by generation, here against the lab's
simulated engine on loopback (systemd's answers faked: a unit test has no systemd; the role's Molecule scenarios and
the lab tests run the whole start on hosts with one)."""

from __future__ import annotations

import json
import os
import time

import pytest
from ansible_collections.gpufleet.fleet.plugins.action import job_wait
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_ready as ready
from test_server_modules import KEY, serve, smoke_args  # noqa: F401  (the fixture)


def wait_for_file(path, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if predicate(text):
            return text
        time.sleep(0.05)
    raise AssertionError(f"{path}: {text!r}")


def test_the_module_run_returns_at_once_and_the_job_leaves_async_wrappers_record(tmp_path):
    job_file = tmp_path / "state" / "ready-job.json"
    marker = tmp_path / "job-ran"

    def work():
        time.sleep(1.0)
        marker.write_text(str(os.getpid()))
        return {"changed": False, "state": "ready", "secret_echo": "tok-123"}

    started = time.monotonic()
    record = ready.start_job(str(job_file), work, {"tok-123"})
    assert time.monotonic() - started < 0.8  # the module does not wait for the work
    assert record["started"] == 1 and record["finished"] == 0 and record["results_file"] == str(job_file)
    running = job_file.read_text()
    assert job_wait.job_file_ended(running) is False  # job_wait reads it as a running async job
    text = wait_for_file(job_file, job_wait.job_file_ended)
    result = job_wait.async_result(text, record["ansible_job_id"])
    assert result["finished"] is True and result["state"] == "ready"
    assert "tok-123" not in text  # censored as AnsibleModule censors a result
    assert int(marker.read_text()) != os.getpid()  # it ran in another process


def test_a_job_that_raises_ends_with_a_failed_record_naming_the_error(tmp_path):
    job_file = tmp_path / "ready-job.json"

    def work():
        raise OSError("no such unit")

    ready.start_job(str(job_file), work, set())
    result = json.loads(wait_for_file(job_file, job_wait.job_file_ended))
    assert result["failed"] is True and result["msg"] == "the job failed: OSError: no such unit"


@pytest.fixture
def fake_systemd(monkeypatch):
    """systemd's view of one running start (InvocationID inv-1, no restarts); no journal lines."""
    state = {
        "invocation_id": "inv-1",
        "n_restarts": 0,
        "active_state": "active",
        "sub_state": "running",
        "result": "success",
        "exec_main_status": 0,
        "main_pid": 4242,
        "exec_main_pid": 4242,
        "exec_main_start_monotonic_us": 0,
    }
    monkeypatch.setattr(ready, "unit_state", lambda unit: dict(state))
    monkeypatch.setattr(ready, "journal_lines", lambda *a, **k: [])
    return state


def ready_args(sim, tmp_path, **smoke):
    return {
        "url": f"http://127.0.0.1:{sim.port}/health",
        "timeout": 30,
        "job_file": str(tmp_path / "job.json"),
        "progress_file": str(tmp_path / "progress.json"),
        "smoke": smoke_args(sim, **smoke) if smoke is not None else {},
    }


def test_ready_then_a_generation_proves_the_start(serve, fake_systemd, tmp_path):  # noqa: F811
    sim = serve()
    result = ready.wait_ready("sglang-server.service", "inv-1", 0, ready_args(sim, tmp_path), set())
    assert "failed" not in result, result
    assert result["state"] == "ready" and result["health_status"] == 200
    assert result["smoke"]["ok"] is True and "Paris" in result["smoke"]["prompts"][0]["answer"]
    assert json.loads((tmp_path / "progress.json").read_text())["phase"] == "health by generation"


def test_readiness_alone_for_a_node_that_serves_no_generation(serve, fake_systemd, tmp_path):  # noqa: F811
    sim = serve()
    args = dict(ready_args(sim, tmp_path), smoke={})
    result = ready.wait_ready("sglang-server.service", "inv-1", 0, args, set())
    assert result["state"] == "ready" and "smoke" not in result and "failed" not in result


def test_a_ready_engine_that_answers_wrong_fails_the_job_with_the_generations_message(serve, fake_systemd, tmp_path):  # noqa: F811
    sim = serve("wrong-answer")
    result = ready.wait_ready("sglang-server.service", "inv-1", 0, ready_args(sim, tmp_path), set())
    assert result["failed"] is True and result["state"] == "ready"  # up and "healthy": only the generation fails
    assert result["msg"].startswith("health by generation failed: prompt 'What is the capital of France?")
    assert "does not match" in result["msg"]
    assert result["smoke"]["ok"] is False


def test_the_key_read_from_the_secrets_file_is_censored_in_the_jobs_record(serve, fake_systemd, tmp_path):  # noqa: F811
    sim = serve(args=("--api-key", KEY))
    secrets = tmp_path / "secrets.env"
    secrets.write_text('SGLANG_SERVER_API_KEY="unit-Key-00017 #x"\n')
    args = ready_args(sim, tmp_path, secrets_file=str(secrets))
    job_file = tmp_path / "job.json"

    def work():
        result = ready.wait_ready("sglang-server.service", "inv-1", 0, args, no_log_values)
        result["echo"] = f"key was {KEY}"  # a value that leaked into the result is censored too
        return result

    no_log_values: set = set()
    ready.start_job(str(job_file), work, no_log_values)
    text = wait_for_file(job_file, job_wait.job_file_ended, timeout=60)
    assert KEY not in text
    result = json.loads(text)
    assert result["smoke"]["ok"] is True, result


def test_a_crashed_start_fails_fast_naming_the_unit_state(fake_systemd, tmp_path):
    fake_systemd.update(active_state="failed", sub_state="failed", main_pid=0, result="exit-code", exec_main_status=1)
    args = {"url": "http://127.0.0.1:9/health", "timeout": 30, "job_file": str(tmp_path / "j.json"), "smoke": {}}
    started = time.monotonic()
    result = ready.wait_ready("sglang-server.service", "inv-1", 0, args, set())
    assert time.monotonic() - started < 5
    assert result["failed"] is True
    assert result["msg"].startswith("sglang-server.service is no longer running during start-up (ActiveState=failed")


READY_LINE = "The server is fired up and ready to roll!"
HEALTH_FAILED = (
    "Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. tic start time: "
    "12:00:01. last_heartbeat time: 12:00:00"
)


def test_an_engine_hung_after_ready_is_named_without_waiting_for_the_timeout(fake_systemd, monkeypatch, tmp_path):
    """SGLang logs "fired up and ready", then its /health generation gets no token: 0.5.9 logs "Health check failed"
    and answers 503. The wait says so within seconds (it waited the whole start-up timeout, 120 s by default, and
    then said "not ready ... last phase: ready")."""
    now = time.time()
    monkeypatch.setattr(ready, "journal_lines", lambda *a, **k: [(now - 30, READY_LINE), (now - 5, HEALTH_FAILED)])
    args = {"url": "http://127.0.0.1:9/health", "timeout": 120, "job_file": str(tmp_path / "j.json"), "smoke": {}}
    started = time.monotonic()
    result = ready.wait_ready("sglang-server.service", "inv-1", 0, args, set())
    assert time.monotonic() - started < 15
    assert result["failed"] is True
    assert result["msg"].startswith(
        "the engine logged that it is fired up and ready, but its log says 'Health check failed. Server couldn't get "
        "a response from detokenizer"
    ), result["msg"]
    assert "(the engine hangs after start-up); not waiting for the timeout; last phase: ready;" in result["msg"]


def test_what_counts_as_hung_after_ready():
    assert ready.hung_after_ready([(1.0, "Load weight begin")], 503, 2.0) == ""  # 503 while starting is normal
    assert ready.hung_after_ready([(1.0, READY_LINE)], 0, 2.0) == ""  # no answer yet: the check may still run
    assert "/health answered 503" in ready.hung_after_ready([(1.0, READY_LINE)], 503, 2.0)
    assert "its log says" in ready.hung_after_ready([(1.0, READY_LINE), (2.0, HEALTH_FAILED)], 0, 3.0)
    assert ready.hung_after_ready([(1.0, HEALTH_FAILED), (2.0, READY_LINE)], 0, 3.0) == ""  # before ready: not this


def test_a_503_to_a_poll_sent_before_the_ready_line_is_not_a_hang():
    """On a busy host the poll sent while the engine was still starting (503) is answered after its ready line: that
    503 says nothing about the engine after ready (a rollout on 8 lab hosts at load 8 rolled a healthy server back
    for it)."""
    assert ready.hung_after_ready([(1.0, "Load weight begin"), (5.0, READY_LINE)], 503, 4.9) == ""
    assert "/health answered 503" in ready.hung_after_ready([(1.0, "Load weight begin"), (5.0, READY_LINE)], 503, 5.1)


def test_a_failed_start_names_the_cause_its_log_gives(fake_systemd, monkeypatch, tmp_path):
    """A start that failed says why in the message itself (it was only in the report's journal excerpt): here
    uvicorn's bind error, followed by the lines of the shutdown it causes."""
    bind = "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use"
    lines = [(1.0, "INFO:     Started server process [42]"), (2.0, bind), (3.0, "INFO:     Waiting for shutdown.")]
    monkeypatch.setattr(ready, "journal_lines", lambda *a, **k: lines)
    fake_systemd.update(active_state="failed", sub_state="failed", main_pid=0, result="exit-code", exec_main_status=1)
    args = {"url": "http://127.0.0.1:9/health", "timeout": 30, "job_file": str(tmp_path / "j.json"), "smoke": {}}
    result = ready.wait_ready("sglang-server.service", "inv-1", 0, args, set())
    assert result["failed"] is True
    assert f"; the log says: {bind};" in result["msg"], result["msg"]
    assert result["msg"].endswith("last log line: INFO:     Waiting for shutdown.")
