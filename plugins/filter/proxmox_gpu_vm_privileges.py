"""The Proxmox VE privileges the proxmox_gpu_vm role's API calls need, checked before any write for an API token or
a user other than root@pam (root@pam has every privilege).

Sources (docs/proxmox.md "API privileges" has the table): the methods' `permissions` in pve-docs' apidata.js
(lab/pvesim/schema/pve-8.4.json, pve-9.1.json); qemu-server src/PVE/API2/Qemu.pm, lines 9.1.19 41ffc59e / 8.4.10
5ccd363e: $check_vm_modify_config_perm (:967-1014 / :949-996) per option class; check_hostpci_perm (:894-910 /
:872-892: Mapping.Use on /mapping/pci/<id> and VM.Config.HWType); $check_storage_access, a new disk needs
Datastore.AllocateSpace on /storage/<id> (:189 / :180), and the update's check_drive_perms VM.Config.Disk (:2255 /
:2187); assert_tag_permissions (pve-guest-common src/PVE/GuestHelpers.pm 6.0.2 7353101 :314-347, VM.Config.Options);
clone_vm: VM.Clone on the template and VM.Allocate on the new vmid (its schema), $check_storage_access_clone
Datastore.AllocateSpace on the target storage for each disk (:293 / :305, called :4469 / :4371) and
check_bridge_access (:4472 / :4374; QemuServer.pm :6399 / :7000) -> GuestHelpers.pm check_vnet_access (7353101
:397-421 / 5.2.2 58ad183 :393-417): SDN.Use on /sdn/zones/<zone>/<bridge>[/<tag>], zone `localnetwork` for a
plain bridge. The guest agent's interfaces need VM.Monitor on 8.4 and VM.GuestAgent.Audit (or
VM.GuestAgent.Unrestricted) on 9.1: pve-access-control 9 split VM.Monitor (AccessControl.pm $privgroups, 5ccd07d
:1057-1164).

What the API user has is read with GET /access/permissions?path=<path> (pve-access-control
src/PVE/API2/AccessControl.pm:509-574, any user for itself), by proxmox_gpu_vm_info's `permissions` option.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.filter.proxmox_gpu_vm import config_diff, desired_config

ROOT_AUTH = "root@pam password"
ROOT_ONLY = {"args", "hugepages", "keephugepages", "affinity"}  # proxmox_gpu_vm_pve_static_problems' to refuse
OPTION_PRIVS = (  # qemu-server $check_vm_modify_config_perm's classes, for the keys the role writes
    (re.compile(r"^(?:cores|sockets|cpu|numa\d*)$"), ["VM.Config.CPU"]),
    (re.compile(r"^(?:memory|balloon)$"), ["VM.Config.Memory"]),
    (re.compile(r"^machine$"), ["VM.Config.HWType"]),
    (re.compile(r"^(?:name|bios|agent|tags)$"), ["VM.Config.Options"]),
    (re.compile(r"^(?:ciuser|sshkeys|ipconfig\d+)$"), ["VM.Config.Cloudinit", "VM.Config.Network"]),
)


def _major(cluster: dict) -> int:
    try:
        return int(str(cluster.get("version") or "8").split(".", maxsplit=1)[0])
    except ValueError:
        return 8


def _mapping(value) -> str | None:
    m = re.search(r"(?:^|,)mapping=([^,]+)", str(value or ""))
    return m[1] if m else None


def needed(s: dict, cluster: dict) -> list[tuple[str, list[str], str]]:
    """(path, privileges of which one is needed, what for) for the role's calls about the VM of spec `s`."""
    vmid, vmp = s["vmid"], f"/vms/{s['vmid']}"
    out = [(vmp, ["VM.Audit"], "reading the VM: GET .../config, .../pending, .../status/current")]
    exists = any(int(r["vmid"]) == int(vmid) for r in cluster.get("vms", []))
    current = (cluster.get("configs") or {}).get(str(vmid))
    if not exists and s.get("template"):
        tnode = s.get("template_node") or s["node"]
        tmpl = next((t for t in (cluster.get("templates") or {}).get(s["template"], []) if t["node"] == tnode), None)
        if tmpl is not None:
            out.append((f"/vms/{tmpl['vmid']}", ["VM.Clone"], f"the clone of template {s['template']!r}"))
            if tmpl.get("disks", tmpl.get("storages")):
                out.append(
                    (f"/storage/{s.get('storage')}", ["Datastore.AllocateSpace"], "the clone's disks on that storage")
                )
            for net in tmpl.get("nets", []):
                path = f"/sdn/zones/localnetwork/{net['bridge']}" + (f"/{net['tag']}" if net.get("tag") else "")
                out.append((path, ["SDN.Use"], f"the clone of the template's {net['key']} on bridge {net['bridge']}"))
        out.append((vmp, ["VM.Allocate"], "creating the VM (the clone's new vmid)"))
    try:
        desired = desired_config(s)
    except (KeyError, TypeError, ValueError):
        return out
    diff = config_diff(desired, current or {}, s.get("efidisk_storage") or s.get("storage") or "")
    keys = sorted(set(diff["set"]) | set(diff["delete"]))
    for key in keys:
        if key in ROOT_ONLY:
            continue
        if key.startswith("hostpci"):
            for value in (diff["set"].get(key), (current or {}).get(key)):
                if _mapping(value):
                    out.append((f"/mapping/pci/{_mapping(value)}", ["Mapping.Use"], f"{key} (mapping)"))
            out.append((vmp, ["VM.Config.HWType"], f"{key} (check_hostpci_perm)"))
        elif key == "efidisk0":
            store = str(diff["set"][key]).split(":", 1)[0]
            out.append((vmp, ["VM.Config.Disk"], "the EFI disk efidisk0"))
            out.append((f"/storage/{store}", ["Datastore.AllocateSpace"], "allocating the EFI disk on that storage"))
        else:
            for pattern, privs in OPTION_PRIVS:
                if pattern.match(key):
                    out.append((vmp, privs, f"setting {key}"))
    status = {str(r["vmid"]): r.get("status") for r in cluster.get("vms", [])}.get(str(vmid))
    running = status == "running"
    if (s.get("state", "started") == "started" and not running) or (
        running and (s.get("state") == "stopped" or (s.get("apply_pending") and keys))
    ):
        out.append((vmp, ["VM.PowerMgmt"], "starting or stopping the VM"))
    if s.get("agent_address") and s.get("state", "started") == "started":
        privs = ["VM.Monitor"] if _major(cluster) < 9 else ["VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"]
        out.append((vmp, privs, "the guest agent's address: GET .../agent/network-get-interfaces"))
    if s.get("snapshot_before_change") and exists and keys:
        out.append((vmp, ["VM.Snapshot"], "the snapshot before the change"))
    return out


def privilege_paths(specs: list[dict], cluster: dict) -> list[str]:
    """The paths whose privileges the check reads; none for root@pam."""
    if not specs or specs[0].get("auth") == ROOT_AUTH:
        return []
    return sorted({path for s in specs for path, _privilege, _use in needed(s, cluster)})


def _grant(auth: str) -> str:
    """pveum's option for the API user of `auth` (tasks/spec.yml: 'API token u@r!n' or 'password of u@r')."""
    if auth.startswith("API token "):
        return f"--tokens '{auth[len('API token ') :]}'"
    return f"--users '{auth.removeprefix('password of ')}'"


def privilege_problems(specs: list[dict], cluster: dict, permissions: dict) -> list[str]:
    """One problem per VM naming each privilege the API user lacks, on which path, for what, and how to grant it.
    permissions: path -> the privileges the user has there (proxmox_gpu_vm_info `permissions`)."""
    if not specs or specs[0].get("auth") == ROOT_AUTH:
        return []
    problems = []
    version = cluster.get("version") or "?"
    for s in specs:
        missing: dict[tuple[str, str], list[str]] = {}
        for path, privs, why in needed(s, cluster):
            if not set(privs) & set((permissions or {}).get(path, [])):
                missing.setdefault((path, " or ".join(privs)), []).append(why)
        if not missing:
            continue
        lacks = "; ".join(f"{privs} on {path} ({', '.join(dict.fromkeys(w))})" for (path, privs), w in missing.items())
        agent = any("guest agent" in w for whys in missing.values() for w in whys)
        problems.append(
            f"{s['name']}: the {s.get('auth')} lacks {lacks} (Proxmox VE {version}; docs/proxmox.md, API privileges): "
            f"grant them before the run, e.g. pveum acl modify <path> {_grant(str(s.get('auth')))} --roles <a role "
            "with them> (a privilege-separated token needs them on its user too)"
            + (", or set proxmox_gpu_vm_address_from_agent: false and give ansible_host" if agent else "")
        )
    return problems


class FilterModule:
    def filters(self):
        return {
            "proxmox_gpu_vm_privilege_paths": privilege_paths,
            "proxmox_gpu_vm_privilege_problems": privilege_problems,
        }
