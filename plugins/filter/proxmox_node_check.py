"""Judge a Proxmox VE node's GPU passthrough prerequisites (playbooks/proxmox_node_check.yml): IOMMU, vfio modules,
drivers of the GPUs' IOMMU groups, hugepages reserved per NUMA node for the VMs bound to it. Read-only inputs: the
API's PCI list (iommugroup, GET /nodes/{node}/hardware/pci) and, when the node was reached over SSH, the facts of
the proxmox_node_facts module (procfs/sysfs)."""

from __future__ import annotations

VFIO_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
VFIO_DRIVERS = ("vfio-pci", "pci-stub", "")
IOMMU_FIX = (
    "Intel: add intel_iommu=on iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub "
    "then update-grub, or /etc/kernel/cmdline then proxmox-boot-tool refresh) and reboot; AMD: enable the IOMMU "
    "(AMD-Vi/SVM) in the firmware (amd_iommu is on by default)"
)


def _bus(gpu) -> str | None:
    bus = str((gpu or {}).get("bus") or "") if isinstance(gpu, dict) else ""
    if not bus:
        return None
    bus = bus if bus.count(":") == 2 else "0000:" + bus
    return bus if "." in bus else bus + ".0"


def _page_kb(hugepages: str) -> int | None:
    return {"1024": 1048576, "2": 2048}.get(str(hugepages or ""))


def proxmox_node_problems(node: str, vms: list, api_pci: list | None, facts: dict | None) -> list[str]:
    """Problems of ``node`` for the VMs (role specs: name, node, gpus, memory, hugepages, numa_node) planned on it."""
    vms = [v for v in vms or [] if v.get("node") == node]
    problems: list[str] = []
    api_pci = api_pci or []
    buses = {b: v["name"] for v in vms for b in (_bus(g) for g in v.get("gpus") or []) if b}
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
            problems.append(f"{node}: {bus} ({vm}, proxmox_gpu_vm_gpus) is not a display device of this node")
            continue
        group = [(b, d) for b, d in sorted(pci.items()) if d["iommu_group"] == dev["iommu_group"] and b != bus]
        for other, d in group:
            if d["driver"] not in VFIO_DRIVERS and other not in buses:
                problems.append(
                    f"{node}: {other} shares IOMMU group {dev['iommu_group']} with {bus} ({vm}) and is bound to "
                    f"{d['driver']}: QEMU refuses the start ('group {dev['iommu_group']} is not viable'); bind it to "
                    f"vfio-pci (options vfio-pci ids={d['vendor'][2:]}:<device> in /etc/modprobe.d/vfio.conf, "
                    "update-initramfs -u -k all, reboot)"
                )
        if dev["driver"] in ("nvidia", "nouveau", "amdgpu", "radeon"):
            problems.append(
                f"{node}: {bus} ({vm}) is held by the host driver {dev['driver']}: blacklist it (/etc/modprobe.d/"
                f"blacklist-gpu.conf: blacklist {dev['driver']}) and bind the GPU to vfio-pci, then reboot"
            )
    # hugepages reserved per NUMA node for the VMs bound to it
    need: dict[tuple[str, int], list] = {}
    for v in vms:
        kb = _page_kb(v.get("hugepages"))
        if kb and v.get("numa_node") not in (None, ""):
            need.setdefault((str(v["numa_node"]), kb), []).append(v)
    numa = facts.get("numa", {})
    for (n, kb), members in sorted(need.items()):
        pages = sum(int(v["memory"]) * 1024 // kb for v in members)
        names = ", ".join(v["name"] for v in members)
        if n not in numa:
            problems.append(
                f"{node}: NUMA node {n} (proxmox_gpu_vm_numa_node of {names}) does not exist; the node has "
                f"{', '.join(sorted(numa)) or 'none'}"
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
            drivers={b: d["driver"] for b, d in facts.get("pci", {}).items()},
        )
    return out


class FilterModule:
    def filters(self):
        return {"proxmox_node_problems": proxmox_node_problems, "proxmox_node_summary": proxmox_node_summary}
