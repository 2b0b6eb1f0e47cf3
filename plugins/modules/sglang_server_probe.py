#!/usr/bin/python
"""Ansible module: state of the SGLang unit, its port and the GPUs it uses; optionally wait for release."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_probe
short_description: Unit state, port listeners and GPU holders of the SGLang server (optionally wait until released)
description:
  - Reads the unit's state (systemctl show), the processes in its cgroup, the listeners of its port (ss) and
    the compute processes on its GPUs (nvidia-smi), and classifies each as ours (in the unit's cgroup) or
    foreign. A GPU allocation whose process is gone (leaked) is foreign. Each live foreign holder is named with
    its user (real UID of /proc/PID/status) and command line (/proc/PID/cmdline, secret values masked).
  - With I(wait_released=true) it polls until the unit has no process left and every GPU of the server
    shows at most I(idle_memory_mib) used, or fails after I(timeout) seconds naming the PIDs that hold memory.
  - Never changes anything.
options:
  unit:
    description: "systemd unit name (with .service)."
    type: str
    required: true
  port:
    description: "TCP port of the server (0 skips the listener check)."
    type: int
    default: 0
  gpus:
    description: "GPU indices the server uses (empty list = all GPUs)."
    type: list
    elements: int
    default: []
  nvidia_smi:
    description: "nvidia-smi executable."
    type: str
    default: nvidia-smi
  wait_released:
    description: "Wait until the unit's processes are gone and its GPUs' memory is released."
    type: bool
    default: false
  timeout:
    description: "Seconds to wait with I(wait_released)."
    type: float
    default: 60
  poll:
    description: "Poll interval in seconds."
    type: float
    default: 0.2
  idle_memory_mib:
    description: "GPU memory (MiB) that still counts as released."
    type: int
    default: 512
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Who holds the server's GPUs and port
  sglang_server_probe:
    unit: sglang-server.service
    port: 8000
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
  register: probe

- name: Wait until the stopped server released its GPUs
  sglang_server_probe:
    unit: sglang-server.service
    gpus: [0, 1]
    wait_released: true
    timeout: 60
"""

RETURN = r"""
unit:
  description: "ActiveState, SubState, MainPID, NRestarts, InvocationID, ExecMainStartTimestamp, ..."
  returned: always
  type: dict
unit_pids:
  description: "PIDs in the unit's cgroup."
  returned: always
  type: list
listeners:
  description: "Listeners of the port: local address, pids, ours (all pids in our unit)."
  returned: always
  type: list
port_foreign:
  description: "Listeners of the port that are not ours."
  returned: always
  type: list
gpu_memory_used_mib:
  description: "GPU index -> MiB used (the server's GPUs)."
  returned: always
  type: dict
gpu_ours:
  description: "Compute processes of our unit on the server's GPUs."
  returned: always
  type: list
gpu_foreign:
  description: "Other compute processes (alive or leaked) on the server's GPUs."
  returned: always
  type: list
gpu_foreign_text:
  description: >-
    The foreign holders in words (PID, process name, user, command line with secrets masked, GPUs, MiB,
    unit or leaked).
  returned: always
  type: str
gpu_foreign_remedy:
  description: "What to do about each foreign holder (who to ask, what to stop; a leak needs a GPU reset or reboot)."
  returned: always
  type: str
released:
  description: "Unit empty and GPU memory at most idle_memory_mib on every server GPU."
  returned: always
  type: bool
waited_s:
  description: "Seconds waited for the release."
  returned: always
  type: float
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_holders import (
    not_released_message,
    snapshot,
    wait_released,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "port": {"type": "int", "default": 0},
            "gpus": {"type": "list", "elements": "int", "default": []},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "wait_released": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 60.0},
            "poll": {"type": "float", "default": 0.2},
            "idle_memory_mib": {"type": "int", "default": 512},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["wait_released"]:
            result, waited = wait_released(
                p["unit"], p["gpus"], p["timeout"], p["idle_memory_mib"], p["poll"], p["nvidia_smi"]
            )
        else:
            result, waited = snapshot(p["unit"], p["gpus"], p["port"], p["idle_memory_mib"], p["nvidia_smi"]), 0.0
    except RuntimeError as exc:
        module.fail_json(msg=str(exc))
    result["waited_s"] = waited
    if p["wait_released"] and not result["released"]:
        module.fail_json(msg=not_released_message(result, p["unit"], waited, p["idle_memory_mib"]), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
