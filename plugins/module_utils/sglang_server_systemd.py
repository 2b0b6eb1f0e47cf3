"""systemd side of the sglang_server modules: the unit's state (``systemctl show`` of UNIT_PROPS), the parser of
``systemctl show`` output, and the monotonic clock that the unit's ExecMainStartTimestampMonotonic is read against.
Starting and stopping the unit is the modules' own (``systemctl start|stop`` through sglang_server_command.run).
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import time

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run

UNIT_PROPS = (
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "ExecMainPID",
    "NRestarts",
    "InvocationID",
    "ExecMainStartTimestamp",
    "ExecMainStartTimestampMonotonic",
    "ExecMainStatus",
    "ExecMainCode",
    "LoadState",
    "FragmentPath",
)


def unit_state(unit, runner=run):
    rc, out, err = runner(["systemctl", "show", unit, "--property=" + ",".join(UNIT_PROPS)])
    props = show_properties(out)
    state = {
        "unit": unit,
        "load_state": props.get("LoadState", ""),
        "active_state": props.get("ActiveState", "unknown"),
        "sub_state": props.get("SubState", ""),
        "result": props.get("Result", ""),
        "main_pid": int(props.get("MainPID") or 0),
        # the start's main process, kept after it exited (MainPID is 0 then): its stdout lines carry it as _PID
        "exec_main_pid": int(props.get("ExecMainPID") or 0),
        "n_restarts": int(props.get("NRestarts") or 0),
        "invocation_id": props.get("InvocationID", ""),
        "exec_main_start": props.get("ExecMainStartTimestamp", ""),
        "exec_main_start_monotonic_us": int(props.get("ExecMainStartTimestampMonotonic") or 0),
        "exec_main_status": props.get("ExecMainStatus", ""),
        "exec_main_code": props.get("ExecMainCode", ""),
        "fragment_path": props.get("FragmentPath", ""),
    }
    if rc != 0:
        state["error"] = err.strip()
    return state


def show_properties(out):
    """``{key: value}`` of ``systemctl show`` output; a key shown on several lines (EnvironmentFiles, ExecStart with
    more than one command) keeps every line, joined by newlines."""
    props = {}
    for line in str(out or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key] = f"{props[key]}\n{value}" if key in props else value
    return props


def monotonic_us():
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
