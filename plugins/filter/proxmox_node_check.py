"""Judge a Proxmox VE node's GPU passthrough prerequisites (playbooks/proxmox_node_check.yml): IOMMU, vfio modules,
the devices of the GPUs' IOMMU groups (Proxmox VE takes each from the host at the start), the GPUs' NUMA nodes,
hugepages reserved per NUMA node for the VMs bound to it. Read-only inputs: the API's PCI list (iommugroup, GET
/nodes/{node}/hardware/pci) and, when the node was reached over SSH, the facts of the proxmox_node_facts module
(procfs/sysfs)."""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.filter.proxmox_gpu_vm import gpu_host_nodes

VFIO_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
VFIO_DRIVERS = ("vfio-pci", "pci-stub", "")
IOMMU_FIX = (
    "Intel: add intel_iommu=on iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub "
    "then update-grub, or /etc/kernel/cmdline then proxmox-boot-tool refresh) and reboot; AMD: enable the IOMMU "
    "(AMD-Vi/SVM) in the firmware (amd_iommu is on by default)"
)


GROUP_BIND = (
    "Proxmox VE binds every device of a passed device's IOMMU group to vfio-pci when the VM starts (qemu-server "
    "PCI.pm prepare_pci_device, pve-common SysFSTools.pm pci_dev_group_bind_to_vfio; bridges are left)"
)
GROUP_FIX = (
    "put the GPU or the device in a slot with an IOMMU group of its own, or give the device to the same VM "
    "(proxmox_gpu_vm_gpus)"
)


def _full(bus: str) -> str:
    return bus if bus.count(":") == 2 else "0000:" + bus


def _taken_along(other: str, cls: str, bus: str, buses: dict) -> bool:
    """Whether `other`, in the IOMMU group of the planned `bus`, is a device Proxmox VE would take from the host at
    the start: not planned itself, no bridge (class 0x0604), not a function of the same card (the GPU's audio:
    rebound with it, nothing the host needs)."""
    return other not in buses and not cls.startswith("0x0604") and other.split(".")[0] != bus.split(".")[0]


def _bus(gpu) -> str | None:
    bus = str((gpu or {}).get("bus") or "") if isinstance(gpu, dict) else ""
    if not bus:
        return None
    bus = bus if bus.count(":") == 2 else "0000:" + bus
    return bus if "." in bus else bus + ".0"


def _gpu_buses(gpu, node: str, mappings: list | None) -> list[str]:
    """The bus ids (with function) a GPU entry names on the node: its bus, or each device of its PCI resource
    mapping there (every entry of a pool)."""
    if not isinstance(gpu, dict):
        return []
    if not gpu.get("mapping"):
        return [b] if (b := _bus(gpu)) else []
    out = []
    for m in mappings or []:
        if m.get("id") != gpu["mapping"]:
            continue
        for entry in m.get("map", []):
            fields = dict(kv.split("=", 1) for kv in entry.split(",") if "=" in kv)
            if fields.get("node") == node and fields.get("path"):
                out += [_bus({"bus": path}) for path in fields["path"].split(";")]
    return out


def _numa_problems(node: str, vms: list, pci: dict, numa: dict, mappings: list | None) -> list[str]:
    """Each GPU's NUMA node as sysfs says (/sys/bus/pci/devices/<id>/numa_node, which the API does not expose)
    against the node the VM binds it to (the GPU's numa_node, else proxmox_gpu_vm_numa_node)."""
    problems = []
    for v in vms:
        for i, gpu in enumerate(v.get("gpus") or []):
            if not isinstance(gpu, dict):
                continue
            own = gpu.get("numa_node") not in (None, "")
            given = gpu["numa_node"] if own else v.get("numa_node")
            var = f"proxmox_gpu_vm_gpus[{i}].numa_node" if own else "proxmox_gpu_vm_numa_node"
            for bus in _gpu_buses(gpu, node, mappings):
                actual = (pci.get(bus) or {}).get("numa_node")
                if actual is None:
                    continue
                where = f"{node}: {bus} ({v['name']}, proxmox_gpu_vm_gpus[{i}])"
                if actual < 0 and len(numa) > 1:
                    problems.append(
                        f"{where}: sysfs numa_node is -1 (the firmware does not say) on a node with NUMA nodes "
                        f"{', '.join(sorted(numa))}: find the slot's socket in the board's manual and set "
                        f"proxmox_gpu_vm_gpus[{i}].numa_node"
                    )
                    continue
                actual = max(actual, 0)
                if given in (None, ""):
                    problems.append(
                        f"{where} is on NUMA node {actual} (sysfs numa_node) and the VM names no NUMA node for it: "
                        f"set proxmox_gpu_vm_gpus[{i}].numa_node: {actual} (or proxmox_gpu_vm_numa_node: {actual} "
                        "when all the VM's GPUs are there)"
                    )
                elif int(given) != actual:
                    problems.append(
                        f"{where} is on NUMA node {actual} (sysfs numa_node), but the VM binds it to node {given} "
                        f"({var}): its memory and vCPUs would sit on another node than the GPU; set {var}: {actual}"
                    )
    return problems


def _page_kb(hugepages: str) -> int | None:
    return {"1024": 1048576, "2": 2048}.get(str(hugepages or ""))


def proxmox_node_problems(
    node: str, vms: list, api_pci: list | None, facts: dict | None, mappings: list | None = None
) -> list[str]:
    """Problems of ``node`` for the VMs (role specs: name, node, gpus, memory, hugepages, numa_node) planned on it;
    mappings: the cluster's PCI resource mappings (GET /cluster/mapping/pci), for GPUs given by mapping."""
    vms = [v for v in vms or [] if v.get("node") == node]
    problems: list[str] = []
    api_pci = api_pci or []
    buses = {b: v["name"] for v in vms for g in v.get("gpus") or [] for b in _gpu_buses(g, node, mappings)}
    # IOMMU: the API says it (iommugroup -1 without one); the node's command line says why
    # (-1: the node has no IOMMU at all; GPUs by mapping count too, so every display device is looked at)
    no_group = sorted(
        d["id"] for d in api_pci if d.get("iommugroup") == -1 and str(d.get("class", "")).startswith("0x03")
    )
    cmdline = (facts or {}).get("cmdline", "")
    if no_group or (facts is not None and facts.get("iommu_groups", 0) == 0):
        seen = f"; /proc/cmdline: '{cmdline}'" if facts is not None else ""
        which = f" ({', '.join(no_group)} without an IOMMU group)" if no_group else ""
        problems.append(f"{node}: the IOMMU is off{which}{seen}: {IOMMU_FIX}")
    if facts is None:
        # no drivers without SSH, but the API lists the IOMMU groups (bridges, class 06, are left out of its list)
        for bus, vm in sorted(buses.items()):
            group = next((d.get("iommugroup") for d in api_pci if _full(d["id"]) == bus), None)
            for d in api_pci:
                if group in (None, -1) or d.get("iommugroup") != group:
                    continue
                if _taken_along(_full(d["id"]), str(d.get("class", "")), bus, buses):
                    problems.append(
                        f"{node}: {_full(d['id'])} (class {d.get('class')}, {d.get('vendor_name') or d.get('vendor')})"
                        f" shares IOMMU group {group} with {bus} ({vm}) in the API's PCI list: {GROUP_BIND}, so the "
                        f"node loses {_full(d['id'])} unless nothing on it uses the device (add the node to group "
                        f"proxmox_nodes to read its driver); {GROUP_FIX}"
                    )
        return problems
    missing = [m for m in VFIO_MODULES if m not in facts.get("modules", [])]
    if missing:
        problems.append(
            f"{node}: vfio modules not loaded: {', '.join(missing)}: add vfio, vfio_iommu_type1 and vfio_pci to "
            "/etc/modules, run update-initramfs -u -k all and reboot"
        )
    pci = facts.get("pci", {})
    for bus, vm in sorted(buses.items()):
        dev = pci.get(bus)
        if dev is None:
            problems.append(f"{node}: {bus} ({vm}, proxmox_gpu_vm_gpus) is not a PCI device of this node")
            continue
        group = dev["iommu_group"]
        for other, d in sorted(pci.items()):
            if group < 0 or d["iommu_group"] != group or not _taken_along(other, d["class"], bus, buses):
                continue
            if d["driver"] not in VFIO_DRIVERS:
                problems.append(
                    f"{node}: {other} (class {d['class']}, driven by {d['driver']}) shares IOMMU group {group} with "
                    f"{bus} ({vm}): {GROUP_BIND}, so the node loses {other} ({d['driver']} is unbound: a NIC takes "
                    f"the node's network on it along); {GROUP_FIX} (ls /sys/kernel/iommu_groups/{group}/devices)"
                )
        if dev["driver"] in ("nvidia", "nouveau", "amdgpu", "radeon"):
            problems.append(
                f"{node}: {bus} ({vm}) is held by the host driver {dev['driver']}: blacklist it (/etc/modprobe.d/"
                f"blacklist-gpu.conf: blacklist {dev['driver']}) and bind the GPU to vfio-pci, then reboot"
            )
    problems += _numa_problems(node, vms, pci, facts.get("numa", {}), mappings)
    # hugepages reserved per NUMA node for the VMs bound to it
    # (a VM on k host nodes has memory / k on each: one guest NUMA node per host node of its GPUs, numa_config)
    need: dict[tuple[str, int], list] = {}
    for v in vms:
        kb = _page_kb(v.get("hugepages"))
        try:
            nodes = gpu_host_nodes(v) if all(isinstance(g, dict) for g in v.get("gpus") or []) else []
        except (TypeError, ValueError):
            nodes = []
        for n in nodes if kb else []:
            need.setdefault((str(n), kb), []).append((v, int(v["memory"]) // len(nodes)))
    numa = facts.get("numa", {})
    for (n, kb), members in sorted(need.items()):
        pages = sum(mib * 1024 // kb for _vm, mib in members)
        names = ", ".join(f"{v['name']}" + (f" {mib} MiB" if mib != int(v["memory"]) else "") for v, mib in members)
        if n not in numa:
            problems.append(
                f"{node}: NUMA node {n} (the GPUs' node of {names}: proxmox_gpu_vm_numa_node or a GPU's numa_node) "
                f"does not exist; the node has {', '.join(sorted(numa)) or 'none'}"
            )
            continue
        have = numa[n]["hugepages"].get(str(kb), {"total": 0, "free": 0})
        size = "1 GiB" if kb == 1048576 else "2 MiB"
        if have["total"] < pages:
            problems.append(
                f"{node}: NUMA node {n} reserves {have['total']} {size} hugepages, the VMs bound to it ({names}) need "
                f"{pages}: reserve them at boot (kernel command line default_hugepagesz=1G hugepagesz=1G "
                f"hugepages=<total of all nodes>, split evenly over the nodes, or per node "
                f"/sys/devices/system/node/node{n}/hugepages/hugepages-{kb}kB/nr_hugepages from a boot-time unit)"
            )
    return problems


def _display_groups(facts: dict) -> set[int]:
    return {d["iommu_group"] for d in facts.get("pci", {}).values() if d["class"].startswith("0x03")} - {-1}


def proxmox_node_summary(node: str, api_pci: list | None, facts: dict | None) -> dict:
    """What the check read, for the report (no secret in it)."""
    gpus = sorted(d["id"] for d in api_pci or [] if str(d.get("class", "")).startswith("0x03"))
    groups = {d["id"]: d.get("iommugroup") for d in api_pci or [] if d["id"] in gpus}
    out = {"node": node, "gpus": gpus, "iommu_groups_by_api": groups}
    if facts is not None:
        out.update(
            cmdline=facts.get("cmdline", ""),
            vfio_modules=[m for m in VFIO_MODULES if m in facts.get("modules", [])],
            hugepages={n: v["hugepages"] for n, v in facts.get("numa", {}).items()},
            # the drivers of the display devices and of everything in their IOMMU groups
            drivers={
                b: d["driver"]
                for b, d in facts.get("pci", {}).items()
                if d["class"].startswith("0x03") or d["iommu_group"] in _display_groups(facts)
            },
            numa_nodes={b: d.get("numa_node") for b, d in facts.get("pci", {}).items() if b in gpus},
        )
    return out


class FilterModule:
    def filters(self):
        return {"proxmox_node_problems": proxmox_node_problems, "proxmox_node_summary": proxmox_node_summary}
