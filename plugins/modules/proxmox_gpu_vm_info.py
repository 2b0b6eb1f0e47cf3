#!/usr/bin/python
"""Read-only view of a Proxmox VE cluster for the proxmox_gpu_vm role (no write, check mode safe)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_gpu_vm_info
short_description: Read what the proxmox_gpu_vm role checks and compares (GET requests only)
description:
  - Reads the cluster's VMs (/cluster/resources), each node's PCI devices (/nodes/{node}/hardware/pci, with their
    IOMMU groups) and storages (/nodes/{node}/storage), the cluster's PCI resource mappings (/cluster/mapping/pci),
    the hostpciN entries of every other VM on those nodes (who holds which GPU), the disks of the given templates
    and, for the given vmids, the configuration with pending values applied, the pending changes, the status and,
    when asked, the guest agent's addresses.
  - VMs the API user may not audit (VM.Audit) are not listed by Proxmox VE, so their GPUs are not seen.
  - Uses the community.proxmox connection options (proxmoxer), so token or password auth as in proxmox_kvm.
options:
  nodes:
    description: Nodes whose PCI list, storages and VMs' hostpciN entries are read.
    type: list
    elements: str
    default: []
  vmids:
    description: VMs whose configuration, pending changes and status are read (absent ones are skipped).
    type: list
    elements: int
    default: []
  templates:
    description: Names of templates whose disks' storages are read (a clone to another node needs shared storage).
    type: list
    elements: str
    default: []
  agent:
    description:
      - Also read the guest agent's network interfaces of running VMs with the agent on.
      - A refusal for lack of a privilege (HTTP 403, VM.Monitor on 8.4, VM.GuestAgent.Audit on 9.x) fails the module
        at once; any other error reads as "no address yet".
    type: bool
    default: false
  permissions:
    description:
      - ACL paths (/vms/201, /storage/local-lvm, ...) whose privileges of the API user are read with
        GET /access/permissions?path=<path> (any user may read its own), instead of the cluster.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - community.proxmox.proxmox.actiongroup_proxmox
  - community.proxmox.proxmox.documentation
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the cluster's VMs, the nodes' PCI devices and two VMs' configuration (GET only)
  gpufleet.fleet.proxmox_gpu_vm_info:
    api_host: pve1.example.com
    api_user: gpufleet@pve
    api_token_id: gpufleet
    api_token_secret: "{{ vault_proxmox_token_secret }}"
    nodes: [pve1]
    vmids: [9101, 9102]
  delegate_to: localhost
  register: cluster
"""

RETURN = r"""
cluster:
  description: >-
    vms (cluster resources), nodes (every member -> its status), pci and storage (node -> list) of the online
    nodes, offline (the given nodes that are members but not online -> their status), mappings, hostpci (vmid ->
    {hostpciN: value}) of the nodes' other VMs, templates (name -> [{vmid, node, storages, disks, nets}]),
    configs/pending/status/agent_ip by vmid.
  returned: unless permissions is given
  type: dict
permissions:
  description: path -> the privileges the API user has there (empty list - none), for the given permissions paths.
  returned: when permissions is given
  type: dict
"""

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.proxmox_gpu_vm_api import (
    proxmox_api,
    proxmox_module,
)

HOSTPCI_RE = re.compile(r"^hostpci\d+$")
DRIVE_RE = re.compile(r"^(?:ide|sata|scsi|virtio|efidisk|tpmstate)\d+$")


def volume_storages(conf: dict) -> list[str]:
    """The storages of a VM's drives (every drive with a volume, CD-ROMs and cloud-init included, as clone_vm
    counts them; 'none' and 'cdrom' are no volume)."""
    out = set()
    for k, v in conf.items():
        volid = str(v).split(",", 1)[0]
        if DRIVE_RE.match(k) and ":" in volid and not volid.startswith("/"):
            out.add(volid.split(":", 1)[0])
    return sorted(out)


NET_RE = re.compile(r"^net\d+$")


def volume_disks(conf: dict) -> list[str]:
    """The storages of a VM's disks that are no CD-ROM (clone_vm checks Datastore.AllocateSpace for those)."""
    return sorted({st for k, v in conf.items() for st in volume_storages({k: v}) if "media=cdrom" not in str(v)})


def nets(conf: dict) -> list[dict]:
    """The bridge (and VLAN tag) of each netN (clone_vm's check_bridge_access: SDN.Use on them)."""
    out = []
    for k, v in sorted(conf.items()):
        fields = dict(kv.split("=", 1) for kv in str(v).split(",") if "=" in kv)
        if NET_RE.match(k) and fields.get("bridge"):
            out.append({"key": k, "bridge": fields["bridge"], "tag": fields.get("tag")})
    return out


def read_permissions(api, paths: list[str]) -> dict:
    """path -> sorted privileges of the API user there (GET /access/permissions?path=)."""
    return {path: sorted((api.access.permissions.get(path=path) or {}).get(path, {})) for path in paths}


def agent_ip(ifaces: dict) -> str | None:
    for iface in (ifaces or {}).get("result", []):
        if iface.get("name") == "lo":
            continue
        for ip in iface.get("ip-addresses", []):
            if ip.get("ip-address-type") == "ipv4" and not ip["ip-address"].startswith("127."):
                return ip["ip-address"]
    return None


def read_cluster(api, nodes: list[str], vmids: list[int], templates: list[str], agent: bool) -> dict:
    """Everything the role checks and compares, with GET requests only (api: a proxmoxer ProxmoxAPI)."""
    out = {"vms": [], "pci": {}, "storage": {}, "mappings": [], "hostpci": {}, "templates": {}}
    out.update(configs={}, pending={}, status={}, agent_ip={})
    out["version"] = api.version.get()["version"]
    out["vms"] = [r for r in api.cluster.resources.get(type="vm") if r.get("type") == "qemu"]
    status = {n["node"]: n.get("status") for n in api.nodes.get()}
    online = {n for n, st in status.items() if st == "online"}
    out["nodes"] = status  # every member: online, offline or unknown
    out["offline"] = {n: status[n] for n in nodes if n in status and n not in online}
    for node in nodes:
        if node in online:
            try:
                out["pci"][node] = api.nodes(node).hardware.pci.get()
            except Exception as e:
                if getattr(e, "status_code", None) == 403:
                    raise RuntimeError(
                        f"GET /nodes/{node}/hardware/pci: {e}: the API user needs Sys.Audit (or Sys.Modify) on / "
                        "(docs/proxmox.md, API privileges)"
                    ) from e
                raise
            out["storage"][node] = api.nodes(node).storage.get()
    out["mappings"] = api.cluster.mapping.pci.get()
    by_vmid = {int(r["vmid"]): r for r in out["vms"]}
    wanted = {int(v) for v in vmids}
    for r in out["vms"]:
        if r["node"] in out["pci"] and not r.get("template") and int(r["vmid"]) not in wanted:
            conf = api.nodes(r["node"]).qemu(r["vmid"]).config.get()
            out["hostpci"][str(r["vmid"])] = {k: v for k, v in conf.items() if HOSTPCI_RE.match(k)}
        if r.get("template") and r.get("name") in templates:
            conf = api.nodes(r["node"]).qemu(r["vmid"]).config.get()
            out["templates"].setdefault(r["name"], []).append(
                {
                    "vmid": int(r["vmid"]),
                    "node": r["node"],
                    "storages": volume_storages(conf),
                    "disks": volume_disks(conf),
                    "nets": nets(conf),
                }
            )
    for vmid in vmids:
        vm = by_vmid.get(int(vmid))
        if vm is None or vm.get("template"):
            continue
        q = api.nodes(vm["node"]).qemu(vmid)
        key = str(vmid)
        out["configs"][key] = q.config.get()
        out["pending"][key] = q.pending.get()
        out["status"][key] = q.status.current.get()["status"]
        if agent and out["status"][key] == "running":
            try:
                out["agent_ip"][key] = agent_ip(q.agent("network-get-interfaces").get())
            except Exception as e:  # the agent is not up yet: no address, the caller retries
                if getattr(e, "status_code", None) == 403:  # a missing privilege does not pass with time
                    raise RuntimeError(
                        f"GET /nodes/{vm['node']}/qemu/{vmid}/agent/network-get-interfaces: {e}: the API user needs "
                        "VM.Monitor (Proxmox VE 8) or VM.GuestAgent.Audit (9) on /vms/" + key
                    ) from e
                out["agent_ip"][key] = None
    return out


def main() -> None:
    module = proxmox_module(
        nodes=dict(type="list", elements="str", default=[]),
        vmids=dict(type="list", elements="int", default=[]),
        templates=dict(type="list", elements="str", default=[]),
        agent=dict(type="bool", default=False),
        permissions=dict(type="list", elements="str", default=[]),
    )
    api = proxmox_api(module)
    p = module.params
    if p["permissions"]:
        try:
            module.exit_json(changed=False, permissions=read_permissions(api, p["permissions"]))
        except Exception as e:  # noqa: BLE001
            module.fail_json(msg=f"reading the API user's privileges (GET /access/permissions) failed: {e}")
    try:
        out = read_cluster(api, p["nodes"], p["vmids"], p["templates"], p["agent"])
    except Exception as e:  # noqa: BLE001 - the API's message is the useful part
        module.fail_json(msg=f"reading the Proxmox VE cluster failed: {e}")
    module.exit_json(changed=False, cluster=out)


if __name__ == "__main__":
    main()
