"""What Proxmox VE itself would refuse about the GPU VMs, found before the role writes anything.

The rules are Proxmox VE's (qemu-server, pve-common; lab/pvesim/README.md cites each); finding them here turns a
failure in the middle of a run (half the VMs cloned, a start task failed) into one refusal up front that names the
variable and the fix. Pure functions over the specs (tasks/spec.yml) and the cluster read by proxmox_gpu_vm_info;
tested in tests/unit/proxmox (against lab/pvesim).
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.filter.proxmox_gpu_vm import desired_config, numa_config

ROOT_AUTH = "root@pam password"
DNS_NAME_RE = re.compile(r"^(([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$")
TAG_RE = re.compile(r"^[a-z0-9_][a-z0-9_\-\+\.]*$", re.I)
HOSTPCI_RE = re.compile(r"^hostpci\d+$")


def _full_bus(bus: str) -> str:
    bus = str(bus).lower()
    return bus if bus.count(":") == 2 else "0000:" + bus


def _slot(dev_id: str) -> str:
    return dev_id.split(".")[0]


def _root_only(s: dict) -> list[str]:
    """The settings of one spec that Proxmox VE takes only from root@pam (not from a token or another user)."""
    out = []
    for i, gpu in enumerate(s.get("gpus") or []):
        if isinstance(gpu, dict) and gpu.get("bus"):
            out.append(
                f"proxmox_gpu_vm_gpus[{i}].bus {gpu['bus']} (a raw bus id: \"only root can set 'hostpci{i}' config "
                'for non-mapped devices"; use a cluster PCI mapping {mapping: <id>}, which needs Mapping.Use on '
                "/mapping/pci/<id>)"
            )
    if int(s.get("mmio64_mb") or 0) > 0:
        out.append(
            "proxmox_gpu_vm_mmio64_mb (QEMU args, \"only root can set 'args' config\"; 0 writes no args and "
            "leaves the window to OVMF, which sizes it from the guest's address width with proxmox_gpu_vm_cpu: host "
            "on Proxmox VE 7.4 and later, see docs/proxmox.md)"
        )
    if s.get("clique"):
        out.append("proxmox_gpu_vm_gpudirect_clique (QEMU args; set false)")
    if s.get("hugepages"):
        out.append(f"proxmox_gpu_vm_hugepages {s['hugepages']!r} (\"only root can set 'hugepages' config\"; set '')")
        if s.get("keephugepages"):
            out.append(
                "proxmox_gpu_vm_keephugepages (\"only root can set 'keephugepages' config\"; set false, or "
                "proxmox_gpu_vm_hugepages: '')"
            )
    try:
        affinity = numa_config(s).get("affinity")
    except (TypeError, ValueError):
        affinity = None
    if affinity:
        out.append(
            f'proxmox_gpu_vm_cpu_affinity (affinity {affinity} from proxmox_gpu_vm_host_numa_cpus: "only root can '
            "set 'affinity' config\"; set proxmox_gpu_vm_cpu_affinity: false)"
        )
    return out


def pve_static_problems(specs: list[dict]) -> list[str]:
    """Problems Proxmox VE would refuse, found in the inventory alone (no API call)."""
    problems = []
    for s in specs:
        vm = s["name"]
        if not DNS_NAME_RE.match(str(vm)):
            problems.append(
                f"{vm}: proxmox_gpu_vm_name {vm!r} is not a DNS name, which Proxmox VE requires of a VM name "
                "(letters, digits and '-' in dot-separated labels; no '_'); set proxmox_gpu_vm_name"
            )
        for tag in s.get("tags") or []:
            if not TAG_RE.match(str(tag)):
                problems.append(
                    f"{vm}: tag {tag!r} (from proxmox_gpu_vm_gpu_class, proxmox_gpu_vm_model, "
                    "proxmox_gpu_vm_extra_tags or proxmox_gpu_vm_owner_tag) has characters Proxmox VE refuses in "
                    "a tag (allowed: letters, digits, '_', '-', '+', '.'); change that variable"
                )
        # a VM with GPUs: a GPU without a NUMA node is refused by proxmox_gpu_vm_static_problems (numa_problems)
        if s.get("hugepages") and s.get("numa_node") in (None, "") and not s.get("gpus"):
            problems.append(
                f"{vm}: proxmox_gpu_vm_hugepages {s['hugepages']!r} needs NUMA, but proxmox_gpu_vm_numa_node is "
                'not set: Proxmox VE refuses to start the VM ("numa needs to be enabled to use hugepages"); set '
                "proxmox_gpu_vm_numa_node to the GPUs' host NUMA node, or proxmox_gpu_vm_hugepages: ''"
            )
        root_only = _root_only(s)
        if root_only and s.get("auth") != ROOT_AUTH:
            problems.append(
                f"{vm}: Proxmox VE accepts these settings only from root@pam (not from an API token or another "
                f"user; now: {s.get('auth')}): {'; '.join(root_only)}. Change them as said, or authenticate as "
                "root@pam with a password (proxmox_gpu_vm_api_user: root@pam, proxmox_gpu_vm_api_password from a "
                "vault)"
            )
    return problems


def _mapping_alternatives(mappings: dict, name: str, node: str) -> list[list[str]]:
    """The mapping's entries on the node, each a list of device paths (`path=a;b`); several entries: a pool."""
    out = []
    for entry in (mappings.get(name) or {}).get("map", []):
        fields = dict(kv.split("=", 1) for kv in entry.split(",") if "=" in kv)
        if fields.get("node") == node and fields.get("path"):
            out.append([_full_bus(p) for p in fields["path"].split(";")])
    return out


def _devices(path: str | None, pci: list[dict]) -> list[dict]:
    """The node's devices a bus id names (a bus id without function: every function of the slot)."""
    if not path:
        return []
    return [d for d in pci if _full_bus(d["id"]) == path or _full_bus(d["id"]).startswith(path + ".")]


def _hostpci_devices(value: str, node: str, mappings: dict, pci: list[dict]) -> list[dict]:
    opts = {}
    for part in str(value).split(","):
        k, _sep, v = part.partition("=")
        opts.update({k: v} if v else {"host": k})
    if opts.get("mapping"):
        alts = _mapping_alternatives(mappings, opts["mapping"], node)
        return [d for p in alts[0] for d in _devices(p, pci)] if len(alts) == 1 else []  # a pool: counted apart
    return [d for host in opts.get("host", "").split(";") if host for d in _devices(_full_bus(host), pci)]


def _iommu_problems(vm: str, node: str, gpus: list[tuple[int, list[dict]]], pci: list[dict]) -> list[str]:
    problems = []
    mine = {d["id"] for _unused, devs in gpus for d in devs}
    for i, devs in gpus:
        seen = set()
        for d in devs:
            group = d.get("iommugroup")
            if group in seen:
                continue
            seen.add(group)
            where = f"{vm}: proxmox_gpu_vm_gpus[{i}] ({d['id']} on {node})"
            if group in (None, -1, "-1"):
                problems.append(
                    f"{where} has no IOMMU group (iommugroup -1): the IOMMU is off, and Proxmox VE refuses the "
                    'start ("cannot prepare PCI pass-through, IOMMU not present"); enable VT-d/AMD-Vi in the '
                    "firmware and the IOMMU on the kernel command line of that node, or choose a GPU of another node"
                )
                continue
            others = [
                x
                for x in pci
                if x.get("iommugroup") == group and x["id"] not in mine and _slot(x["id"]) != _slot(d["id"])
            ]
            if others:
                names = ", ".join(
                    f"{x['id']} (class {x.get('class')}, {x.get('vendor_name') or x.get('vendor')})" for x in others
                )
                ids = ", ".join(x["id"] for x in others)
                problems.append(
                    f"{where} shares IOMMU group {group} with {names}, which the VM does not get: Proxmox VE binds "
                    "every device of the group to vfio-pci when the VM starts (qemu-server PCI.pm prepare_pci_device, "
                    f"pve-common SysFSTools.pm pci_dev_group_bind_to_vfio), so the node would lose {ids} (its host "
                    "driver is unbound: a NIC takes the node's network on it along) and no other VM could have "
                    "it; the GPU must be alone in its group or only with its own functions: move the card to a slot "
                    "with its own group, or choose another GPU in proxmox_gpu_vm_gpus"
                )
    return problems


def _clone_problems(s: dict, cluster: dict) -> list[str]:
    """clone_vm with a target node: shared target storage and a template on shared storage (qemu-server)."""
    vm, node, tnode = s["name"], s["node"], s.get("template_node") or s["node"]
    if not s.get("template") or tnode == node or any(int(r["vmid"]) == int(s["vmid"]) for r in cluster.get("vms", [])):
        return []
    shared = {st["storage"] for st in (cluster.get("storage") or {}).get(tnode, []) if st.get("shared")}
    tmpl = next((t for t in (cluster.get("templates") or {}).get(s["template"], []) if t["node"] == tnode), None)
    local = [st for st in (tmpl or {}).get("storages", []) if st not in shared]
    why = []
    if s.get("storage") not in shared:
        why.append(f"proxmox_gpu_vm_storage {s.get('storage')!r} is not a shared storage of {tnode}")
    if local:
        why.append(f"the template's disks are on {', '.join(local)}, not shared")
    if not why:
        return []
    choices = ", ".join(sorted(shared)) or "none"
    return [
        f"{vm}: proxmox_gpu_vm_template {s['template']!r} is on {tnode} (proxmox_gpu_vm_template_node) and the VM "
        f"goes to {node}: Proxmox VE clones to another node only on shared storage, and {' and '.join(why)}; "
        f"keep the template on shared storage and set proxmox_gpu_vm_storage to one ({choices}), "
        f"or use a template on {node}"
    ]


def _root_only_changes(s: dict, current: dict) -> list[str]:
    """Root-only keys an existing VM has that the role would change or remove (PVE checks the old value too)."""
    desired = desired_config(s)
    keys = [
        k
        for k in ("affinity", "args", "hugepages", "keephugepages")
        if k in current and str(current[k]) != str(desired.get(k, ""))
    ]
    for k, v in current.items():
        raw = HOSTPCI_RE.match(k) and not str(v).startswith("mapping=") and "mapping=" not in str(v)
        if raw and str(v) != str(desired.get(k, "")):
            keys.append(f"{k} ({v})")
    return keys


def _pool_problems(s: dict, specs: list[dict], cluster: dict, mappings: dict, pci: list[dict]) -> list[str]:
    """A pool mapping (several entries for the node) must have a free entry for each of its hostpciN, picked as
    qemu-server's choose_hostpci_devices picks (QemuServer/PCI.pm, 9.1.19 :547-616, 8.4.10 :573-638): per hostpciN in
    order, the first entry none of whose devices the VM already got nor another VM holds, else the start dies
    "could not find a free device for 'hostpciN'". Held here: the devices of every other VM of the play on the node
    (earlier in the play: their own picks), the single devices other VMs of the node have in their configuration,
    and one entry for each running VM outside the play that has the pool (which one it holds the API does not say)."""
    vm, node = s["name"], s["node"]
    play = [o for o in specs if o.get("node") == node]
    play_vmids = {str(o.get("vmid")) for o in specs}
    status = {str(r["vmid"]): r.get("status") for r in cluster.get("vms", [])}
    held: dict[str, str] = {}
    busy: dict[str, int] = {}  # pool -> running VMs outside the play that have it
    for vmid, entries in sorted((cluster.get("hostpci") or {}).items()):
        if vmid in play_vmids:
            continue
        for value in entries.values():
            for d in _hostpci_devices(value, node, mappings, pci):
                held.setdefault(d["id"], f"VM {vmid}")
            mapping = dict(p.partition("=")[::2] for p in str(value).split(",")).get("mapping")
            if mapping and len(_mapping_alternatives(mappings, mapping, node)) > 1 and status.get(vmid) == "running":
                busy[mapping] = busy.get(mapping, 0) + 1
    for o in play:  # single devices of the play's VMs are theirs whatever the order
        for gpu in o.get("gpus") or []:
            alts = _mapping_alternatives(mappings, gpu["mapping"], node) if gpu.get("mapping") else None
            paths = alts[0] if alts and len(alts) == 1 else [] if alts else [_full_bus(gpu.get("bus"))]
            for p in paths:
                for d in _devices(p, pci):
                    held.setdefault(d["id"], o["name"])
    problems = []
    for o in play:
        for i, gpu in enumerate(o.get("gpus") or []):
            alts = _mapping_alternatives(mappings, gpu["mapping"], node) if gpu.get("mapping") else []
            if len(alts) < 2:
                continue
            free = [a for a in alts if not any(d["id"] in held for p in a for d in _devices(p, pci))]
            skip = busy.get(gpu["mapping"], 0)
            pick = free[skip] if len(free) > skip else None
            if pick is not None:
                for p in pick:
                    for d in _devices(p, pci):
                        held[d["id"]] = o["name"]
            elif o is s:
                owners = [
                    next((held[d["id"]] for p in a for d in _devices(p, pci) if d["id"] in held), "?") for a in alts
                ]
                taken = [f"{';'.join(a)} ({who})" for a, who in zip(alts, owners, strict=True)]
                problems.append(
                    f"{vm}: proxmox_gpu_vm_gpus[{i}].mapping {gpu['mapping']!r} is a pool of {len(alts)} device(s) on "
                    f"{node} and none is left for it (taken: {', '.join(taken)}"
                    + (f"; {skip} held by running VMs outside the play" if skip else "")
                    + f"): Proxmox VE would fail the start (\"could not find a free device for 'hostpci{i}'\"); add "
                    "devices to the mapping (Datacenter > Resource Mappings) or give fewer GPUs of it"
                )
    return problems


def pve_cluster_problems(specs: list[dict], cluster: dict) -> list[str]:
    """Problems Proxmox VE would refuse, found against the cluster's state (read-only API answers)."""
    problems = []
    mappings = {m["id"]: m for m in cluster.get("mappings", [])}
    play_vmids = {str(s.get("vmid")) for s in specs}
    names = {int(r["vmid"]): (r.get("name"), r.get("node"), r.get("status")) for r in cluster.get("vms", [])}
    for s in specs:
        vm, node = s["name"], s["node"]
        problems += _clone_problems(s, cluster)
        current = (cluster.get("configs") or {}).get(str(s.get("vmid")))
        if current and s.get("auth") != ROOT_AUTH:
            changes = _root_only_changes(s, current)
            if changes:
                problems.append(
                    f"{vm}: the VM has {', '.join(changes)}, which only root@pam may change or remove (now: "
                    f"{s.get('auth')}); authenticate as root@pam with a password (proxmox_gpu_vm_api_user, "
                    "proxmox_gpu_vm_api_password) for this change"
                )
        pci = (cluster.get("pci") or {}).get(node)
        if pci is None:
            continue  # an unknown node is proxmox_gpu_vm_cluster_problems' to report
        gpus = []
        for i, gpu in enumerate(s.get("gpus") or []):
            paths = (
                [p for alt in _mapping_alternatives(mappings, gpu["mapping"], node) for p in alt]
                if gpu.get("mapping")
                else [_full_bus(gpu.get("bus"))]
            )
            gpus.append((i, [d for p in paths for d in _devices(p, pci)]))  # a pool: every device it may get
        problems += _iommu_problems(vm, node, gpus, pci)
        problems += _pool_problems(s, specs, cluster, mappings, pci)
        for vmid, entries in sorted((cluster.get("hostpci") or {}).items()):
            name, vnode, status = names.get(int(vmid), (None, None, None))
            if vmid in play_vmids or vnode != node:
                continue
            for key, value in sorted(entries.items()):
                theirs = {d["id"] for d in _hostpci_devices(value, node, mappings, pci)}
                for i, devs in gpus:
                    both = sorted(theirs & {d["id"] for d in devs})
                    if both:
                        problems.append(
                            f"{vm}: proxmox_gpu_vm_gpus[{i}] ({', '.join(both)} on {node}) is also given to VM "
                            f"{vmid} {name!r} ({status}, {key}: {value}), which this play does not manage: Proxmox VE "
                            'starts only one of them ("PCI device ... already in use by VMID ..."); take the GPU '
                            "out of that VM or choose another GPU in proxmox_gpu_vm_gpus"
                        )
    return problems


class FilterModule:
    def filters(self):
        return {
            "proxmox_gpu_vm_pve_static_problems": pve_static_problems,
            "proxmox_gpu_vm_pve_cluster_problems": pve_cluster_problems,
        }
