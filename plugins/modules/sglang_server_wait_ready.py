#!/usr/bin/python
"""Ansible module: wait for the SGLang server to become ready, writing its start-up phase as progress."""

from __future__ import annotations

import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import write_json
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_host import (
    current_phase,
    http,
    journal_lines,
    monotonic_us,
    phase_timeline,
    unit_state,
)

DOCUMENTATION = r"""
module: sglang_server_wait_ready
short_description: Wait for SGLang's /health to answer 200, reporting the start-up phase from the journal
description:
  - Polls C(/health) (503 while loading, 200 when ready) and reads the journal of this start of the unit
    (its InvocationID) to name the phase (loading weights, KV cache, capturing CUDA graphs, ready).
  - Returns when the server is ready. Fails fast when the unit is no longer running (crash), when systemd
    restarted it (another InvocationID or more NRestarts, a restart loop), or when I(timeout) seconds have
    passed since the process started.
  - Runs as an async job; every I(progress_every) seconds it writes a progress record (phase, elapsed time,
    last /health status) to I(progress_file), which the gpufleet.fleet.job_wait action prints.
options:
  unit:
    description: "systemd unit name (with .service)."
    type: str
    required: true
  url:
    description: "Health URL, e.g. http://127.0.0.1:8000/health."
    type: str
    required: true
  invocation_id:
    description: "InvocationID of the start being waited for (from right after the start)."
    type: str
    required: true
  n_restarts:
    description: "NRestarts of the unit right after the start."
    type: int
    default: 0
  timeout:
    description: "Seconds since the process started after which the start has failed."
    type: float
    required: true
  progress_every:
    description: "Seconds between progress records."
    type: float
    default: 30
  progress_file:
    description: "JSON progress record written every I(progress_every) seconds (phase, message)."
    type: str
  poll:
    description: "/health poll interval in seconds."
    type: float
    default: 0.25
  tail_lines:
    description: "Journal lines returned with a failure."
    type: int
    default: 40
author: gpufleet
"""

EXAMPLES = r"""
- name: Wait for readiness (async job)
  gpufleet.fleet.sglang_server_wait_ready:
    unit: sglang-server.service
    url: http://127.0.0.1:8000/health
    invocation_id: "{{ started.unit.invocation_id }}"
    timeout: 1800
    progress_every: 30
    progress_file: /run/gpufleet/sglang-server-ready.json
  async: 1860
  poll: 0
  register: ready_job

- name: Wait, printing the phase every 30 s
  gpufleet.fleet.job_wait:
    jid: "{{ ready_job.ansible_job_id }}"
    what: sglang_server
    progress_file: /run/gpufleet/sglang-server-ready.json
    interval: 30
  register: ready
"""

RETURN = r"""
state:
  description: "ready (failures fail the task)."
  returned: always
  type: str
phase:
  description: "Current start-up phase from the journal."
  returned: always
  type: str
timeline:
  description: "[{phase, at (epoch), after_s (since the process started)}]."
  returned: always
  type: list
elapsed_s:
  description: "Seconds since the process started."
  returned: always
  type: float
health_status:
  description: "Last /health HTTP status (0 = no answer)."
  returned: always
  type: int
ready_at:
  description: "Epoch when /health first answered 200."
  returned: when ready
  type: float
ready_logged_at:
  description: "Epoch of SGLang's 'fired up and ready' log line."
  returned: when logged
  type: float
detection_latency_s:
  description: "ready_at - ready_logged_at."
  returned: when both known
  type: float
started_at:
  description: "Epoch when the process started."
  returned: always
  type: float
journal_tail:
  description: "Last journal lines of this start."
  returned: on failure
  type: list
"""


def write_progress(path: str, unit: str, invocation_id: str, started_at: float, status: int) -> None:
    """The progress record job_wait prints: the phase from this start's journal, elapsed time, /health."""
    timeline = phase_timeline(journal_lines(unit, invocation_id))
    record = {
        "phase": current_phase(timeline),
        "message": f"after {time.time() - started_at:.1f} s (/health {status or 'no answer'})",
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(path), record)


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "invocation_id": {"type": "str", "required": True},
            "n_restarts": {"type": "int", "default": 0},
            "timeout": {"type": "float", "required": True},
            "progress_every": {"type": "float", "default": 30.0},
            "progress_file": {"type": "str"},
            "poll": {"type": "float", "default": 0.25},
            "tail_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=False,
    )
    p = module.params
    unit = p["unit"]
    next_progress = time.monotonic()  # a first record at once: job_wait's first line has the phase
    state = unit_state(unit)
    started_mono_us = state["exec_main_start_monotonic_us"]
    started_at = time.time() - (monotonic_us() - started_mono_us) / 1e6 if started_mono_us else time.time()
    status = 0
    ready_at = None
    failure = None
    while True:
        status, _body, _secs = http("GET", p["url"], timeout=max(p["poll"], 5))
        if status == 200:
            ready_at = time.time()
            break
        state = unit_state(unit)
        if state["invocation_id"] != p["invocation_id"] or state["n_restarts"] > p["n_restarts"]:
            failure = (
                f"systemd restarted {unit} (NRestarts {p['n_restarts']} -> {state['n_restarts']}): the server "
                "crashed during start-up and is in a restart loop"
            )
            break
        if state["active_state"] != "active" or state["main_pid"] == 0:
            failure = (
                f"{unit} is no longer running during start-up (ActiveState={state['active_state']}, "
                f"SubState={state['sub_state']}, Result={state['result']}, ExecMainStatus={state['exec_main_status']})"
            )
            break
        elapsed = time.time() - started_at
        if elapsed > p["timeout"]:
            failure = f"not ready {elapsed:.0f} s after the start (timeout {p['timeout']:.0f} s)"
            break
        if p["progress_file"] and time.monotonic() >= next_progress:
            write_progress(p["progress_file"], unit, p["invocation_id"], started_at, status)
            next_progress = time.monotonic() + p["progress_every"]
        time.sleep(p["poll"])

    # the start's main process too: a crash at once leaves lines journald could not tie to the unit
    same_start = state["invocation_id"] == p["invocation_id"]
    entries = journal_lines(
        unit, p["invocation_id"], main_pid=state.get("exec_main_pid", 0) if same_start else 0, since=started_at - 1
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
    if p["progress_file"]:
        write_progress(p["progress_file"], unit, p["invocation_id"], started_at, status)
    if ready_at:
        result["ready_at"] = round(ready_at, 3)
        logged = [t["at"] for t in timeline if t["phase"] == "ready"]
        if logged:
            result["ready_logged_at"] = round(logged[0], 3)
            result["detection_latency_s"] = round(ready_at - logged[0], 3)
    if failure:
        tail = [msg for _ts, msg in entries[-p["tail_lines"] :]]
        result["state"] = "failed"
        result["journal_tail"] = tail
        last = next((m for m in reversed(tail) if m.strip()), "")
        module.fail_json(
            msg=f"{failure}; last phase: {result['phase']}; last log line: {last.strip()[:300]}",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
