#!/usr/bin/python
"""Ansible module: stop the SGLang unit and wait for its GPUs, or install its files and start it (one call each)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_swap
short_description: Stop the SGLang unit and wait until its GPUs are free, or install its files and start it
description:
  - The two halves of a restart in one round trip each, so the time the server is down is not stretched
    by task overhead.
  - I(action=stop) runs C(systemctl stop) (SIGTERM to the main process, which drains with KillMode=mixed; bounded
    by TimeoutStopSec, then SIGKILL to the control group) and waits until no process of the unit is left and
    the server's GPUs show at most I(idle_memory_mib) used; otherwise it fails naming the PIDs that hold
    memory (I(fail_unreleased)).
  - The stop is accounted for in C(drain) - the requests in flight right before it (SGLang's C(/v1/loads),
    else C(/metrics), at I(base_url)), the drain's own counts from the journal ("Gracefully exiting...
    Remaining number of requests N"), systemd's Result of the stop, and how many requests were cut.
  - I(action=start) installs the files (atomic rename, root-owned, given mode), reloads systemd when a file
    changed, clears the unit's failure state and start limit, enables and starts it, and returns its
    InvocationID.
  - I(action=restart) does both in one call (the server's downtime is not stretched by a round trip);
    a failure names its phase (stop or start). It never starts into GPU memory that stays held after the
    stop - with I(fail_unreleased=false) it returns C(started=false) and C(held) instead, for the role to
    decide (a remedy the user enabled, or stop there).
  - With I(ready), a start is followed by the wait for readiness and the health check by generation, in a job
    on the host that this module starts and returns at once (C(ready_job)); gpufleet.fleet.job_wait waits for it,
    printing its phase. The job writes ansible-core async_wrapper's record (C(started), then the result) to
    I(ready.job_file); the wait fails fast on a crash or a restart loop of this start, and after I(ready.timeout)
    seconds since the process started; a failed generation fails it too.
  - With I(current_link), a symlink is pointed at a release first (atomic rename), e.g. a rollback's ml-env
    C(current) link back at the release the restored version runs.
  - The outcome of the stop of a running server is written into each manifest of I(record_stop_in) whose
    C(unit_sha256) is the installed unit's (I(unit_path)) - C(stopped_cleanly) true, or false when the
    memory it left stayed held (such a version is never a rollback target), and C(last_stop).
options:
  unit:
    description: "systemd unit (with .service)."
    type: str
    required: true
  action:
    description: "stop, start, or restart (both)."
    type: str
    required: true
    choices: [stop, start, restart]
  gpus:
    description: "GPU indices of the server (stop)."
    type: list
    elements: int
    default: []
  timeout:
    description: "Seconds to wait for the release after the stop."
    type: float
    default: 60
  idle_memory_mib:
    description: "GPU memory (MiB) that still counts as released."
    type: int
    default: 512
  fail_unreleased:
    description: >-
      Fail when the memory is not released in time (stop). False: return C(released=false) and C(held),
      and (restart) do not start.
    type: bool
    default: true
  unit_path:
    description: "The installed unit file (its sha256 says which kept version is stopped)."
    type: path
    default: ""
  record_stop_in:
    description: "Manifests (manifest.json of kept versions) to record the stop's outcome in."
    type: list
    elements: path
    default: []
  files:
    description: "Files to install before the start: list of {src, dest, mode} (remote paths)."
    type: list
    elements: dict
    default: []
  base_url:
    description: "Server URL for the in-flight count before the stop (empty: not asked)."
    type: str
    default: ""
  secrets_file:
    description: "EnvironmentFile of the unit; its SGLANG_SERVER_API_KEY authenticates the in-flight query."
    type: path
    default: ""
  current_link:
    description: "A symlink to point at a target before anything else (not given: none)."
    type: dict
    suboptions:
      path:
        description: "The link, e.g. /opt/ml-env/current."
        type: path
        required: true
      target:
        description: "What it points at, e.g. /opt/ml-env/releases/<id>."
        type: path
        required: true
  ready:
    description: >-
      After a start: wait for C(/health) 200 and prove health by generation in a job on the host (not given: no
      job).
    type: dict
    suboptions:
      url:
        description: "Health URL, e.g. http://127.0.0.1:8000/health."
        type: str
        required: true
      timeout:
        description: "Seconds since the process started after which the start has failed."
        type: float
        required: true
      job_file:
        description: "The job's record (async_wrapper's format), read by gpufleet.fleet.job_wait."
        type: path
        required: true
      progress_every:
        description: "Seconds between progress records (phase from the journal, elapsed time, last /health)."
        type: float
        default: 30
      progress_file:
        description: "JSON progress record, printed by gpufleet.fleet.job_wait."
        type: path
      poll:
        description: "/health poll interval in seconds."
        type: float
        default: 0.25
      tail_lines:
        description: "Journal lines of this start returned with a failure."
        type: int
        default: 40
      smoke:
        description: >-
          The options of gpufleet.fleet.sglang_server_smoke (no secret: the host reads the key from its
          secrets_file); the health check by generation once ready, with this start's unit and InvocationID for
          its journal check. Empty: readiness only (a node of rank >= 1 of a multi-node server).
        type: dict
        default: {}
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Stop and wait for the GPUs
  sglang_server_swap:
    unit: sglang-server.service
    action: stop
    gpus: [0, 1]

- name: Install and start
  sglang_server_swap:
    unit: sglang-server.service
    action: start
    files:
      - src: /etc/sglang-server/candidate/sglang-server.service
        dest: /etc/systemd/system/sglang-server.service
        mode: "0644"
"""

RETURN = r"""
restart_phase:
  description: "stop or start: where a failure happened."
  returned: failure
  type: str
stop_started_at:
  description: "Epoch (host clock) when the stop began."
  returned: stop, restart
  type: float
stop_s:
  description: "Seconds systemctl stop took (stop)."
  returned: stop
  type: float
waited_s:
  description: "Seconds waited for the release after the stop (stop)."
  returned: stop
  type: float
released:
  description: "The unit is empty and its GPUs' memory released (stop)."
  returned: stop
  type: bool
drain:
  description: >-
    The stop's account (stop): in_flight_at_stop (running + waiting requests right before the stop; null when
    the server did not answer), load (the answer and its source), drain_remaining (the counts the engine logged
    while draining), stop_result (systemd's Result: success, timeout, ...), exit (ExecMainCode/Status), cut
    (requests still open when the server went away; goal 0; null when unknown), how.
  returned: stop, restart
  type: dict
unit:
  description: "State of the unit after the action (InvocationID, MainPID, NRestarts, ...)."
  returned: always
  type: dict
installed:
  description: "Files whose content changed (start)."
  returned: start
  type: list
started:
  description: "The unit was started (restart: false when the memory stayed held)."
  returned: restart
  type: bool
held:
  description: >-
    What holds the GPUs after the stop: gpus, live_pids, gone_pids, no_process_gpus, text (PID, user,
    command, or "no process: memory held by the driver"), caused_by_stop.
  returned: stop, restart
  type: dict
stop_recorded:
  description: "Manifests the stop's outcome was written into."
  returned: stop, restart
  type: list
current_link:
  description: "The link pointed (path, target) and whether it changed."
  returned: with I(current_link)
  type: dict
ready_job:
  description: >-
    The readiness job (with I(ready), after a start): ansible_job_id, results_file. Its result (job_wait's): state,
    phase, timeline [{phase, at, after_s}], elapsed_s, started_at, ready_at, ready_logged_at, detection_latency_s,
    health_status, unit_state, smoke (sglang_server_smoke's return values); journal_tail on a failure.
  returned: start, restart with I(ready)
  type: dict
"""


import hashlib
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_drain import drain_account, engine_load
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_files import read_env_file, write_root_file
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_holders import (
    held_memory,
    not_released_message,
    snapshot,
    wait_released,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_journal import journal_lines
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_manifest import record_stop
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_ready import (
    READY_OPTIONS,
    start_job,
    wait_ready,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import unit_state


def install(src, dest, mode):
    with open(src, "rb") as fh:
        data = fh.read()
    try:
        with open(dest, "rb") as fh:
            same = fh.read() == data
    except OSError:
        same = False
    write_root_file(dest, data, int(str(mode), 8))
    return not same


def point_link(path, target):
    """Point the symlink `path` at `target` (a new link renamed over the old one: never missing); True if it changed."""
    if os.path.islink(path) and os.readlink(path) == target:
        return False
    tmp = f"{path}.gpufleet-tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)
    return True


def stop_account(unit, before, was_active, load):
    """drain_account over the stopped invocation's journal (journald may lag the stop by a moment)."""
    deadline = time.monotonic() + 3.0
    while True:
        entries = journal_lines(unit, before["invocation_id"]) if before["invocation_id"] else []
        account = drain_account(load["in_flight"], entries, unit_state(unit), was_active)
        if account["cut"] == 0 or not was_active or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    account["load"] = load
    return account


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "action": {"type": "str", "required": True, "choices": ["stop", "start", "restart"]},
            "gpus": {"type": "list", "elements": "int", "default": []},
            "timeout": {"type": "float", "default": 60.0},
            "idle_memory_mib": {"type": "int", "default": 512},
            "fail_unreleased": {"type": "bool", "default": True},
            "files": {"type": "list", "elements": "dict", "default": []},
            "base_url": {"type": "str", "default": ""},
            "secrets_file": {"type": "path", "default": ""},
            "unit_path": {"type": "path", "default": ""},
            "record_stop_in": {"type": "list", "elements": "path", "default": []},
            "current_link": {
                "type": "dict",
                "options": {"path": {"type": "path", "required": True}, "target": {"type": "path", "required": True}},
            },
            "ready": {"type": "dict", "options": READY_OPTIONS},
        },
        supports_check_mode=False,
    )
    p = module.params
    unit = p["unit"]
    result = {"changed": True}
    if p["current_link"]:
        link, target = p["current_link"]["path"], p["current_link"]["target"]
        try:
            result["current_link"] = {"path": link, "target": target, "changed": point_link(link, target)}
        except OSError as exc:
            module.fail_json(msg=f"cannot point {link} at {target}: {exc}", restart_phase="stop", **result)
    if p["action"] in ("stop", "restart"):
        before = unit_state(unit)
        was_active = before["active_state"] in ("active", "reloading", "activating")
        load = {"in_flight": None, "source": None, "error": "not asked"}
        if was_active and p["base_url"]:
            key = read_env_file(p["secrets_file"]).get("SGLANG_SERVER_API_KEY", "")
            load = engine_load(p["base_url"], {"Authorization": f"Bearer {key}"} if key else {})
        unit_sha256 = ""
        if was_active and p["unit_path"] and os.path.exists(p["unit_path"]):
            with open(p["unit_path"], "rb") as fh:
                unit_sha256 = hashlib.sha256(fh.read()).hexdigest()
        try:
            pre = snapshot(unit, p["gpus"], 0, p["idle_memory_mib"])
        except RuntimeError:
            pre = None
        result["stop_started_at"] = round(time.time(), 3)
        started = time.monotonic()
        rc, out, err = run(["systemctl", "stop", unit], timeout=24 * 3600)
        result["stop_s"] = round(time.monotonic() - started, 3)
        result["drain"] = stop_account(unit, before, was_active, load)
        if rc != 0 and "not loaded" not in err:
            module.fail_json(
                msg=f"systemctl stop {unit} failed (rc {rc}): {(err or out).strip()}", restart_phase="stop", **result
            )
        try:
            snap, waited = wait_released(unit, p["gpus"], p["timeout"], p["idle_memory_mib"])
        except RuntimeError as exc:
            module.fail_json(msg=str(exc), restart_phase="stop", **result)
        snap.update(result, waited_s=waited)
        result = snap
        result["held"] = {} if snap["released"] else held_memory(snap, p["idle_memory_mib"], pre)
        result["stop_recorded"] = (
            record_stop(p["record_stop_in"], unit_sha256, snap["released"], result["held"],
                        result["stop_started_at"], waited)
            if was_active else []
        )  # fmt: skip
        if not snap["released"] and p["fail_unreleased"]:
            module.fail_json(
                msg=not_released_message(snap, unit, waited, p["idle_memory_mib"]), restart_phase="stop", **snap
            )
        if p["action"] == "stop":
            module.exit_json(**result)
        if not snap["released"]:
            module.exit_json(started=False, **result)

    installed = []
    for item in p["files"]:
        if not item.get("src") or not item.get("dest"):
            module.fail_json(msg=f"files entries need src and dest: {item}", restart_phase="start", **result)
        try:
            if install(item["src"], item["dest"], item.get("mode", "0644")):
                installed.append(item["dest"])
        except OSError as exc:
            module.fail_json(
                msg=f"cannot install {item['src']} as {item['dest']}: {exc}", restart_phase="start", **result
            )
    steps = [["systemctl", "daemon-reload"]] if installed else []
    steps.append(["systemctl", "reset-failed", unit])
    rc, out, _err = run(["systemctl", "is-enabled", unit])
    if out.strip() != "enabled":
        steps.append(["systemctl", "enable", unit])
    for argv in steps:
        rc, out, err = run(argv)
        if rc != 0 and argv[1] != "reset-failed":
            module.fail_json(
                msg=f"{' '.join(argv)} failed (rc {rc}): {(err or out).strip()}", restart_phase="start", **result
            )
    rc, out, err = run(["systemctl", "start", unit], timeout=24 * 3600)
    result["unit"] = unit_state(unit)
    result["installed"] = installed
    result["started"] = rc == 0
    if rc != 0:
        module.fail_json(
            msg=f"systemctl start {unit} failed (rc {rc}): {(err or out).strip()}", restart_phase="start", **result
        )
    if p["ready"]:
        started = result["unit"]

        def wait():
            return wait_ready(unit, started["invocation_id"], started["n_restarts"], p["ready"], module.no_log_values)

        result["ready_job"] = start_job(p["ready"]["job_file"], wait, module.no_log_values)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
