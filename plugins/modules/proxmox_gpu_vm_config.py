#!/usr/bin/python
"""Write the VM options community.proxmox.proxmox_kvm has no parameter for (PUT .../config)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_gpu_vm_config
short_description: Set VM options that community.proxmox.proxmox_kvm cannot write (affinity, keephugepages)
description:
  - >-
    One C(PUT /nodes/{node}/qemu/{vmid}/config) with the given options, only those this module knows
    (C(affinity), C(keephugepages)); Proxmox VE takes both only from root@pam (qemu-server
    C($check_vm_modify_config_perm), neither is in an option class). On a running VM they wait for a stop and
    start (pending), as Proxmox VE keeps them.
  - The caller decides what differs (the proxmox_gpu_vm role's diff); every call writes and reports a change. An
    empty O(set) and O(delete) writes nothing.
options:
  vmid:
    description: The VM.
    type: int
    required: true
  node:
    description: The VM's node.
    type: str
    required: true
  set:
    description: Option -> value (C(affinity) a CPU list like C(0-31,64-95); C(keephugepages) 0 or 1).
    type: dict
    default: {}
  delete:
    description: Options to remove.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - community.proxmox.proxmox.actiongroup_proxmox
  - community.proxmox.proxmox.documentation
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Pin the VM to the CPUs of NUMA node 1 and keep its hugepages
  gpufleet.fleet.proxmox_gpu_vm_config:
    api_host: pve1.example.com
    api_user: root@pam
    api_password: "{{ vault_proxmox_root_password }}"
    vmid: 9101
    node: pve1
    set: {affinity: "32-63,96-127", keephugepages: 1}
  delegate_to: localhost
"""

RETURN = r"""
written:
  description: The options written (set) and removed (delete).
  returned: always
  type: dict
"""

from ansible_collections.gpufleet.fleet.plugins.module_utils.proxmox_gpu_vm_api import (
    proxmox_api,
    proxmox_module,
)

KNOWN = ("affinity", "keephugepages")


def main() -> None:
    module = proxmox_module(
        vmid=dict(type="int", required=True),
        node=dict(type="str", required=True),
        set=dict(type="dict", default={}),
        delete=dict(type="list", elements="str", default=[]),
    )
    p = module.params
    unknown = sorted((set(p["set"]) | set(p["delete"])) - set(KNOWN))
    if unknown:
        module.fail_json(msg=f"proxmox_gpu_vm_config writes only {', '.join(KNOWN)}, not {', '.join(unknown)}")
    written = {"set": p["set"], "delete": p["delete"]}
    if not p["set"] and not p["delete"]:
        module.exit_json(changed=False, written=written)
    if module.check_mode:
        module.exit_json(changed=True, written=written)
    params = {k: str(v) for k, v in p["set"].items()}
    if p["delete"]:
        params["delete"] = ",".join(p["delete"])
    api = proxmox_api(module)
    try:
        api.nodes(p["node"]).qemu(p["vmid"]).config.put(**params)
    except Exception as e:  # noqa: BLE001 - the API's message is the useful part
        module.fail_json(msg=f"VM {p['vmid']} on {p['node']}: writing {', '.join(sorted(params))} failed: {e}")
    module.exit_json(changed=True, written=written)


if __name__ == "__main__":
    main()
