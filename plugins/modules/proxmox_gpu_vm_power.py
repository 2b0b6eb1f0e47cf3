#!/usr/bin/python
"""Start or stop one Proxmox VE VM and wait for its task, failing with Proxmox VE's own message."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_gpu_vm_power
short_description: Start or stop a Proxmox VE VM and report the task's own result
description:
  - Reads the VM's status (GET .../status/current); when it differs from O(state), starts it (POST .../status/start)
    or shuts it down (POST .../status/shutdown with forceStop=1, so it is stopped at the latest after O(timeout)),
    then polls the task (GET /nodes/{node}/tasks/{upid}/status) until it has ended or O(timeout) has passed.
  - A task that ends with an exit status other than OK (or WARNINGS) fails at once with that exit status and the last
    lines of the task log (e.g. C(PCI device '0000:81:00.0' already in use by VMID '160') or QEMU's C(group 42 is not
    viable)), where community.proxmox.proxmox_kvm waits out its whole timeout and reports only the task's first log
    line.
  - Uses the community.proxmox connection options (proxmoxer), so token or password auth as in proxmox_kvm.
options:
  node:
    description: Node of the VM.
    type: str
    required: true
  vmid:
    description: The VM.
    type: int
    required: true
  state:
    description: Wanted power state.
    type: str
    choices: [started, stopped]
    required: true
  timeout:
    description: Seconds to wait for the task (and, for a stop, the guest's shutdown before the forced stop).
    type: int
    default: 300
extends_documentation_fragment:
  - community.proxmox.proxmox.actiongroup_proxmox
  - community.proxmox.proxmox.documentation
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start the VM (fails with Proxmox VE's message when the start task fails)
  gpufleet.fleet.proxmox_gpu_vm_power:
    api_host: pve1.example.com
    api_user: root@pam
    api_password: "{{ vault_proxmox_password }}"
    node: pve1
    vmid: 9101
    state: started
    timeout: 600
  delegate_to: localhost
"""

RETURN = r"""
status_before:
  description: The VM's status before (running, stopped, ...).
  returned: always
  type: str
upid:
  description: The task that started or stopped the VM (absent when nothing was done).
  returned: changed or failed task
  type: str
exitstatus:
  description: The task's exit status (OK, WARNINGS, or Proxmox VE's error message).
  returned: changed or failed task
  type: str
log_tail:
  description: The last lines of the task log.
  returned: failed task
  type: list
  elements: str
"""

import time

from ansible_collections.gpufleet.fleet.plugins.module_utils.proxmox_gpu_vm_api import (
    proxmox_api,
    proxmox_module,
)


def task_ok(exitstatus: str) -> bool:
    """Proxmox VE's notion of a task that went well (proxmox_kvm's api_task_ok: OK or a warning)."""
    return exitstatus == "OK" or exitstatus.startswith("WARN")


def wait_task(api, node: str, upid: str, timeout: int, sleep=time.sleep, clock=time.monotonic) -> dict | None:
    """The task's final status, or None when it is still running after ``timeout`` seconds."""
    deadline = clock() + timeout
    while True:
        status = api.nodes(node).tasks(upid).status.get()
        if status.get("status") == "stopped":
            return status
        if clock() >= deadline:
            return None
        sleep(1)


def main() -> None:
    module = proxmox_module(
        node=dict(type="str", required=True),
        vmid=dict(type="int", required=True),
        state=dict(type="str", choices=["started", "stopped"], required=True),
        timeout=dict(type="int", default=300),
    )
    p = module.params
    api = proxmox_api(module)
    q = api.nodes(p["node"]).qemu(p["vmid"])
    try:
        before = q.status.current.get()["status"]
    except Exception as e:  # noqa: BLE001 - the API's message is the useful part
        module.fail_json(msg=f"VM {p['vmid']} on {p['node']}: reading its status failed: {e}")
    wanted = "running" if p["state"] == "started" else "stopped"
    if before == wanted:
        module.exit_json(changed=False, status_before=before)
    if module.check_mode:
        module.exit_json(changed=True, status_before=before)
    action = "start" if p["state"] == "started" else "stop"
    try:
        if p["state"] == "started":
            upid = q.status.start.post()
        else:
            upid = q.status.shutdown.post(forceStop=1, timeout=p["timeout"])
        status = wait_task(api, p["node"], upid, p["timeout"] + (10 if action == "stop" else 0))
    except Exception as e:  # noqa: BLE001
        module.fail_json(msg=f"VM {p['vmid']} on {p['node']}: the {action} request failed: {e}", status_before=before)
    if status is None:
        module.fail_json(
            msg=f"VM {p['vmid']} on {p['node']}: the {action} task {upid} has not ended after {p['timeout']} s; "
            "it may still end, look at the node's task log",
            status_before=before,
            upid=upid,
        )
    exitstatus = str(status.get("exitstatus") or "")
    if not task_ok(exitstatus):
        try:
            log = [str(line.get("t", "")) for line in api.nodes(p["node"]).tasks(upid).log.get(limit=500)]
        except Exception:  # noqa: BLE001 - the exit status alone still says what failed
            log = []
        module.fail_json(
            msg=f"VM {p['vmid']} on {p['node']}: the {action} failed: {exitstatus}",
            status_before=before,
            upid=upid,
            exitstatus=exitstatus,
            log_tail=log[-10:],
        )
    module.exit_json(changed=True, status_before=before, upid=upid, exitstatus=exitstatus)


if __name__ == "__main__":
    main()
