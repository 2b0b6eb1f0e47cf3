"""The SGLang server's readiness wait and its health check by generation, run as a job on the host that
sglang_server_swap starts right after it started the unit.

A start's wait was a module of its own run with Ansible's ``async``: for a module that is not pipelined, ansible-core
2.19 makes a remote temp dir, uploads the module and async_wrapper, fixes their modes and runs async_wrapper, which
starts the module's Python again (plugins/action/__init__.py ``_execute_module``): five ssh operations and three
Python starts on the host for every start, and then the generation was one more module run. The swap has just
started the unit in its own Python, so it forks the wait from there (``start_job``): the job writes the record that
async_wrapper writes (``{"started": 1, "finished": 0, ...}`` first, then the result), which
gpufleet.fleet.job_wait reads with ``cat`` and prints the progress of, as it does for an ``async`` task's.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path

from ansible.module_utils.common.parameters import remove_values
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import write_json
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_http import http
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_journal import (
    current_phase,
    journal_lines,
    phase_timeline,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_smoke import prove
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import monotonic_us, unit_state

# sglang_server_swap's `ready` option (argument spec of its sub-options).
READY_OPTIONS = {
    "url": {"type": "str", "required": True},
    "timeout": {"type": "float", "required": True},
    "job_file": {"type": "path", "required": True},
    "progress_every": {"type": "float", "default": 30.0},
    "progress_file": {"type": "path"},
    "poll": {"type": "float", "default": 0.25},
    "tail_lines": {"type": "int", "default": 40},
    "smoke": {"type": "dict", "default": {}},
}


def write_progress(path: str | None, record: dict) -> None:
    """The job's progress record for job_wait (no file given: none)."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(path), record)


def journal_progress(unit: str, invocation_id: str, started_at: float, status: int) -> dict:
    """The progress record job_wait prints: the phase from this start's journal, elapsed time, /health."""
    timeline = phase_timeline(journal_lines(unit, invocation_id))
    return {
        "phase": current_phase(timeline),
        "message": f"after {time.time() - started_at:.1f} s (/health {status or 'no answer'})",
    }


# SGLang 0.5.9 http_server.health_generate logs this when /health's one-token generation got no answer within
# SGLANG_HEALTH_CHECK_TIMEOUT (20 s) and then answers 503; the simulated engine logs the same (lab/sglang-sim app.py).
HEALTH_FAILED = re.compile(r"Health check failed\. Server couldn't get a response")
# The line of a failed start's log that says why, when it says it (uvicorn's bind error, a Python or CUDA error), shown
# in the failure message itself and not only in the report's journal excerpt.
CAUSE = re.compile(
    r"\[Errno \d+\]|address already in use|\b\w*(Error|Exception)\b:|CUDA error|out of memory|Initialization failed"
)
# How often, while /health is not 200, the journal is read for an engine that said it is ready but does not generate.
HUNG_LOOK_S = 5.0


def hung_after_ready(entries: list, status: int, asked_at: float) -> str:
    """Why an engine that logged "fired up and ready" does not become healthy ('' while nothing says so): after its
    ready line, a failed health check in its log, or /health answering 503 to a request sent after that line
    (``asked_at``, epoch; 0.5.9 answers 503 after start-up only when its health generation failed or it is shutting
    down, but also to a request sent while it was still starting: on a busy host the answer of a poll sent just
    before the ready line comes after it)."""
    ready_at = next((t["at"] for t in phase_timeline(entries) if t["phase"] == "ready"), None)
    if ready_at is None:
        return ""
    failed = [msg for ts, msg in entries if ts >= ready_at and HEALTH_FAILED.search(msg)]
    if not failed and not (status == 503 and asked_at > ready_at):
        return ""
    seen = f"its log says '{failed[-1].strip()[:160]}'" if failed else "/health answered 503"
    return (
        f"the engine logged that it is fired up and ready, but {seen}: its health check by generation gets no token "
        "(the engine hangs after start-up); not waiting for the timeout"
    )


def wait_ready(unit: str, invocation_id: str, n_restarts: int, p: dict, no_log_values: set) -> dict:
    """Wait until ``p['url']`` (/health) answers 200, failing fast on a crash or a restart loop of this start
    (its InvocationID, NRestarts) and after ``p['timeout']`` s since the process started; then, with ``p['smoke']``
    (sglang_server_smoke's options), prove health by generation. The job's result: ``failed`` and ``msg`` on a
    failure (the smoke's in ``smoke``)."""
    p = {**{k: v.get("default") for k, v in READY_OPTIONS.items()}, **p}
    next_progress = time.monotonic()  # a first record at once: job_wait's first line has the phase
    state = unit_state(unit)
    started_mono_us = state["exec_main_start_monotonic_us"]
    started_at = time.time() - (monotonic_us() - started_mono_us) / 1e6 if started_mono_us else time.time()
    status = 0
    ready_at = None
    failure = None
    next_hung_look = time.monotonic() + HUNG_LOOK_S
    while True:
        asked_at = time.time()
        status, _body, _secs = http("GET", p["url"], timeout=max(p["poll"], 5))
        if status == 200:
            ready_at = time.time()
            break
        state = unit_state(unit)
        if state["invocation_id"] != invocation_id or state["n_restarts"] > n_restarts:
            failure = (
                f"systemd restarted {unit} (NRestarts {n_restarts} -> {state['n_restarts']}): the server "
                "crashed during start-up and is in a restart loop"
            )
            break
        if state["active_state"] != "active" or state["main_pid"] == 0:
            failure = (
                f"{unit} is no longer running during start-up (ActiveState={state['active_state']}, "
                f"SubState={state['sub_state']}, Result={state['result']}, ExecMainStatus={state['exec_main_status']})"
            )
            break
        if time.monotonic() >= next_hung_look:
            next_hung_look = time.monotonic() + HUNG_LOOK_S
            failure = hung_after_ready(journal_lines(unit, invocation_id), status, asked_at) or None
            if failure:
                break
        elapsed = time.time() - started_at
        if elapsed > p["timeout"]:
            failure = f"not ready {elapsed:.0f} s after the start (timeout {p['timeout']:.0f} s)"
            break
        if time.monotonic() >= next_progress:
            write_progress(p["progress_file"], journal_progress(unit, invocation_id, started_at, status))
            next_progress = time.monotonic() + p["progress_every"]
        time.sleep(p["poll"])

    # the start's main process too: a crash at once leaves lines journald could not tie to the unit
    same_start = state["invocation_id"] == invocation_id
    entries = journal_lines(
        unit, invocation_id, main_pid=state.get("exec_main_pid", 0) if same_start else 0, since=started_at - 1
    )
    timeline = phase_timeline(entries)
    for item in timeline:
        item["after_s"] = round(item["at"] - started_at, 3)
    result = {
        "changed": False,
        "state": "ready" if ready_at else "waiting",
        "phase": "ready" if ready_at else current_phase(timeline),
        "timeline": timeline,
        "elapsed_s": round((ready_at or time.time()) - started_at, 3),
        "health_status": status,
        "started_at": round(started_at, 3),
        "unit_state": state,
    }
    if ready_at:
        result["ready_at"] = round(ready_at, 3)
        logged = [t["at"] for t in timeline if t["phase"] == "ready"]
        if logged:
            result["ready_logged_at"] = round(logged[0], 3)
            result["detection_latency_s"] = round(ready_at - logged[0], 3)
    if failure or not p["smoke"]:
        write_progress(p["progress_file"], journal_progress(unit, invocation_id, started_at, status))
    if failure:
        tail = [msg for _ts, msg in entries[-p["tail_lines"] :]]
        last = next((m for m in reversed(tail) if m.strip()), "")
        cause = next((msg.strip() for _ts, msg in entries if CAUSE.search(msg)), "")
        if cause and cause != last.strip():
            failure = f"{failure}; the log says: {cause[:300]}"
        return {
            **result,
            "state": "failed",
            "journal_tail": tail,
            "failed": True,
            "msg": (
                f"{failure}; last phase: {result['phase']}; /health answered {status or 'nothing'}; "
                f"last log line: {last.strip()[:300]}"
            ),
        }
    if not p["smoke"]:
        return result
    write_progress(
        p["progress_file"], {"phase": "health by generation", "message": f"ready after {result['elapsed_s']:.1f} s"}
    )
    health = prove(dict(p["smoke"], unit=unit, invocation_id=invocation_id), no_log_values)
    result["smoke"] = health
    if health["remarks"]:
        result["warnings"] = list(health["remarks"])
    if health["failures"]:
        return {**result, "failed": True, "msg": "health by generation failed: " + " | ".join(health["failures"])}
    return result


def start_job(job_file: str, work, no_log_values: set) -> dict:
    """Run ``work()`` (a result dict) in a process detached from this module run (two forks, a new session, stdin
    and stdout on /dev/null, as ansible-core's async_wrapper detaches a job), so the module can return at once.
    ``job_file`` holds async_wrapper's record: ``{"started": 1, "finished": 0, ...}`` now, the result (its values in
    ``no_log_values`` censored as AnsibleModule censors a result) when the work ends. Returns the started record."""
    path = Path(job_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    jid = f"j{secrets.randbelow(10**12)}.{os.getpid()}"
    record = {"started": 1, "finished": 0, "ansible_job_id": jid, "results_file": str(path)}
    write_json(path, record)
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the first child leaves at once; its child is the job
        return record
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001  (the job's record must say why it ended)
            result = {"failed": True, "msg": f"the job failed: {type(exc).__name__}: {exc}"}
        write_json(path, remove_values(result, no_log_values))
    finally:
        os._exit(0)
