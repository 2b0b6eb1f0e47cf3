"""Filters of the proxmox_gpu_vm role: checks before any API call, the desired VM configuration as Proxmox VE
stores it, the difference to the current one, the proxmox_kvm parameters, and the GPUDirect clique verdict.

Pure functions over plain data (specs built in tasks/spec.yml; cluster facts read by proxmox_gpu_vm_info),
unit-tested in tests/unit/proxmox/test_filters.py.
"""

from __future__ import annotations

import math
import re
from urllib.parse import quote

BUS_RE = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?$")
HOSTPCI_RE = re.compile(r"^hostpci\d+$")
NUMA_RE = re.compile(r"^numa\d+$")
HUGEPAGE_MIB = {"2": 2, "1024": 1024}
OWNED_KEYS = (
    "name",
    "cores",
    "sockets",
    "memory",
    "cpu",
    "machine",
    "bios",
    "balloon",
    "hugepages",
    "numa",
    "numa0",
    "affinity",
    "keephugepages",
    "args",
    "agent",
    "ciuser",
    "sshkeys",
    "ipconfig0",
    "tags",
)


def _full_bus(bus: str) -> str:
    bus = bus.lower()
    return bus if bus.count(":") == 2 else "0000:" + bus


def _gpu_key(gpu: dict, node: str) -> str:
    if gpu.get("mapping"):
        return f"mapping {gpu['mapping']}"
    return f"{node} {_full_bus(str(gpu.get('bus', '')))}"


# GPU memory per card in GB (10^9 bytes) by the class names of proxmox_gpu_vm_gpu_class, from NVIDIA's datasheets:
# A100 40/80 GB, H100 SXM 80 GB, H100 NVL 94 GB, H200 141 GB, B200 192 GB HBM3e (180 GB usable in DGX B200),
# B300 288 GB, L40S/L40 48 GB, L4 24 GB, RTX PRO 6000 Blackwell 96 GB, RTX 6000 Ada 48 GB. The 64-bit BAR that maps
# the memory (BAR1 on NVIDIA data-center cards, which expose all of it) has a power-of-two size (PCI Express Base
# Specification, 7.5.1.2.1: a BAR's size is 2^n), so a card needs its memory in GiB rounded up to a power of two:
# 80 GB -> 128 GiB, 96 GB -> 128 GiB, 141 GB -> 256 GiB, 192 GB -> 256 GiB, 288 GB -> 512 GiB.
GPU_MEMORY_GB = {
    "a100-40gb": 40,
    "a100": 80,
    "a100-80gb": 80,
    "h100": 80,
    "h100-nvl": 94,
    "h200": 141,
    "h200-nvl": 141,
    "b200": 192,
    "b300": 288,
    "l40s": 48,
    "l40": 48,
    "l4": 24,
    "rtx-pro-6000": 96,
    "rtx-6000-ada": 48,
}
# OVMF reads opt/ovmf/X-PciMmio64Mb up to 16 TiB (edk2 OvmfPkg/Library/PlatformInitLib/MemDetect.c, "Accept an
# aperture size up to 16TB": FwCfgPciMmio64Mb <= 0x1000000).
MMIO64_MAX_MB = 0x1000000
MAX_NUMA = 8  # qemu-server QemuServer/Memory.pm $MAX_NUMA (numa0-7)
GPU_KEYS = {"bus", "mapping", "pcie", "numa_node", "rombar", "x_vga", "romfile"}
ROMFILE_RE = re.compile(r"^[^,;/]+$")  # PCI.pm $hostpci_fmt romfile pattern [^,;]+, a file in /usr/share/kvm/


def bar_gib(gpu_class) -> int | None:
    """The 64-bit BAR (GiB) of one GPU of the class: its memory rounded up to a power of two; None if unknown."""
    gb = GPU_MEMORY_GB.get(str(gpu_class or "").lower())
    return None if gb is None else 2 ** math.ceil(math.log2(gb * 10**9 / 2**30))


def mmio64_mb(gpu_count, bar_size_gib) -> int | None:
    """OVMF's 64-bit MMIO window (MiB) for `gpu_count` GPUs of `bar_size_gib` GiB: twice their sum (room for the
    other devices and the alignment of each BAR to its size), rounded up to a power of two; 0 without GPUs; None when
    the BAR size is unknown."""
    n = int(gpu_count or 0)
    if n == 0:
        return 0
    if bar_size_gib in (None, ""):
        return None
    need = n * int(bar_size_gib) * 1024 * 2
    return 2 ** math.ceil(math.log2(need)) if need > 0 else 0


def parse_cpuset(text) -> list[int] | None:
    """pve-common src/PVE/CpuSet.pm parse_cpuset: comma-separated numbers and ranges a-b; None if invalid."""
    out: set[int] = set()
    for part in str(text if text is not None else "").split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not m or int(m[2] or m[1]) < int(m[1]):
            return None
        out.update(range(int(m[1]), int(m[2] or m[1]) + 1))
    return sorted(out)


def cpuset_string(cpus) -> str:
    """pve-common CpuSet.pm short_string: 0-3,8,10-11."""
    parts, cpus = [], sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def gpu_host_nodes(s: dict) -> list[int]:
    """The host NUMA nodes of the VM's GPUs (a GPU's numa_node, else proxmox_gpu_vm_numa_node), sorted; the VM's
    node alone without GPUs; [] without any NUMA binding."""
    default = s.get("numa_node")
    nodes = set()
    for gpu in s.get("gpus") or []:
        n = gpu.get("numa_node", default) if isinstance(gpu, dict) else default
        if n not in (None, ""):
            nodes.add(int(n))
    if not nodes and default not in (None, ""):
        nodes.add(int(default))
    return sorted(nodes)


def _host_numa_cpus(s: dict) -> dict[int, str]:
    return {int(k): str(v) for k, v in (s.get("host_numa_cpus") or {}).items()}


def numa_problems(s: dict) -> list[str]:
    """The guest NUMA layout and the CPU affinity of one spec, checked (see desired_config)."""
    vm, problems = s["name"], []
    for i, gpu in enumerate(s.get("gpus") or []):
        bad = isinstance(gpu, dict) and gpu.get("numa_node") not in (None, "")
        if bad and not re.fullmatch(r"\d+", str(gpu["numa_node"])):
            problems.append(
                f"{vm}: proxmox_gpu_vm_gpus[{i}].numa_node {gpu['numa_node']!r} is not a host NUMA node number "
                "(0, 1, ...: cat /sys/bus/pci/devices/<bus id>/numa_node on the Proxmox node)"
            )
    if problems:
        return problems
    unknown = [i for i, gpu in enumerate(s.get("gpus") or []) if gpu.get("numa_node", s.get("numa_node")) in (None, "")]
    if unknown:
        which = ", ".join(
            f"proxmox_gpu_vm_gpus[{i}] ({s['gpus'][i].get('bus') or 'mapping ' + str(s['gpus'][i].get('mapping'))})"
            for i in unknown
        )
        return [
            f"{vm}: no host NUMA node is known for {which} on {s.get('node')}: proxmox_gpu_vm_numa_node is not set "
            "and the GPU has no numa_node. Proxmox VE's API does not say which NUMA node a PCI device is on (GET "
            "/nodes/{node}/hardware/pci has no numa_node), and a wrong guess binds the VM's memory and vCPUs to the "
            "other socket: set proxmox_gpu_vm_numa_node (all GPUs of the VM) or proxmox_gpu_vm_gpus[i].numa_node to "
            f"the output of cat /sys/bus/pci/devices/<bus id>/numa_node on {s.get('node')} "
            "(playbooks/proxmox_node_check.yml reads and prints it)"
        ]
    nodes = gpu_host_nodes(s)
    k, vcpus, memory = len(nodes), int(s["cores"]) * int(s["sockets"]), int(s["memory"])
    if k > MAX_NUMA:
        problems.append(f"{vm}: the GPUs sit on {k} host NUMA nodes; Proxmox VE has numa0-{MAX_NUMA - 1}")
    elif k > 1:
        where = f"{vm}: proxmox_gpu_vm_gpus sit on host NUMA nodes {', '.join(map(str, nodes))}"
        if int(s["sockets"]) % k:
            problems.append(
                f"{where}: the VM gets one guest NUMA node per host node, each with whole sockets, but "
                f"proxmox_gpu_vm_sockets is {s['sockets']}; set proxmox_gpu_vm_sockets to {k} (or a multiple) "
                f"and proxmox_gpu_vm_cores to the cores per socket"
            )
        page = HUGEPAGE_MIB.get(str(s.get("hugepages") or ""), 1)
        if memory % (k * page):
            problems.append(
                f"{where}: proxmox_gpu_vm_memory_mib {memory} must split into {k} equal guest NUMA nodes of whole "
                f"{page} MiB pages (a multiple of {k * page}); change proxmox_gpu_vm_memory_mib"
            )
    cpus_by_node = s.get("host_numa_cpus") or {}
    if not s.get("cpu_affinity") or not nodes or not cpus_by_node:
        return problems
    try:
        cpus_by_node = _host_numa_cpus(s)
    except (TypeError, ValueError):
        return problems + [
            f"{vm}: proxmox_gpu_vm_host_numa_cpus must map host NUMA node numbers to CPU lists, e.g. "
            "{0: '0-31,64-95', 1: '32-63,96-127'}"
        ]
    host_cpus: set[int] = set()
    for n in nodes:
        if n not in cpus_by_node:
            problems.append(
                f"{vm}: proxmox_gpu_vm_host_numa_cpus has no CPU list for host NUMA node {n} (the GPUs' node), "
                f"so the VM's CPU affinity cannot be set; add {n}: <cat /sys/devices/system/node/node{n}/cpulist "
                "on the Proxmox node>, or set proxmox_gpu_vm_cpu_affinity: false"
            )
            continue
        cpus = parse_cpuset(cpus_by_node[n])
        if cpus is None:
            problems.append(
                f"{vm}: proxmox_gpu_vm_host_numa_cpus[{n}] {cpus_by_node[n]!r} is not a CPU list like 0-31,64-95 "
                f"(cat /sys/devices/system/node/node{n}/cpulist on the Proxmox node)"
            )
            continue
        host_cpus.update(cpus)
    if host_cpus and vcpus > len(host_cpus):
        problems.append(
            f"{vm}: {vcpus} vCPUs (proxmox_gpu_vm_cores x proxmox_gpu_vm_sockets) would share the {len(host_cpus)} "
            f"host CPUs of NUMA node(s) {', '.join(map(str, nodes))} they are pinned to; lower proxmox_gpu_vm_cores "
            "or set proxmox_gpu_vm_cpu_affinity: false"
        )
    return problems


def numa_config(s: dict) -> dict:
    """numa, numaN (one guest NUMA node per host node of the GPUs, whole sockets each, memory split evenly, bound
    with policy=bind) and affinity (the host CPUs of those nodes) as Proxmox VE stores them."""
    nodes = gpu_host_nodes(s)
    if not nodes:
        return {}
    k, vcpus, memory = len(nodes), int(s["cores"]) * int(s["sockets"]), int(s["memory"])
    conf: dict = {"numa": 1}
    for i, n in enumerate(nodes):
        first, count = i * (vcpus // k), vcpus // k
        cpus = str(first) if count == 1 else f"{first}-{first + count - 1}"
        conf[f"numa{i}"] = f"cpus={cpus},hostnodes={n},memory={memory // k},policy=bind"
    affinity = _affinity(s, nodes)
    if affinity:
        conf["affinity"] = affinity
    return conf


def _affinity(s: dict, nodes: list[int]) -> str | None:
    """The host CPUs of the GPUs' NUMA nodes as one CPU set, or None: without CPU lists or cpu_affinity, and when
    the set is every CPU the lists name (a VM on all the host's nodes: a set that pins nothing)."""
    if not (s.get("cpu_affinity") and s.get("host_numa_cpus") and nodes):
        return None
    by_node = _host_numa_cpus(s)
    cpus = {c for n in nodes for c in parse_cpuset(by_node.get(n, "")) or []}
    every = {c for text in by_node.values() for c in parse_cpuset(text) or []}
    return cpuset_string(cpus) if cpus and cpus != every else None


def affinity_note(s: dict) -> str:
    """Why a VM on several host NUMA nodes gets no per-node CPU pinning (empty for a VM on one node): Proxmox VE's
    `affinity` is one CPU set for every thread of QEMU (qemu-server QemuServer.pm 9.1.19 :3188-3189, 8.4.10 :3697:
    `taskset --cpu-list --all-tasks <affinity>`), so it cannot keep each guest NUMA node's vCPUs on its own host
    node; only the memory is bound per node (numaN hostnodes=, policy=bind)."""
    try:
        nodes = gpu_host_nodes(s)
    except (TypeError, ValueError):
        return ""
    if len(nodes) < 2 or not (s.get("cpu_affinity") and s.get("host_numa_cpus")):
        return ""
    on = ", ".join(map(str, nodes))
    why = (
        f"{s['name']}: the GPUs sit on host NUMA nodes {on}. Proxmox VE's affinity is one CPU set for all of QEMU's "
        "threads (taskset --all-tasks), it cannot pin each guest NUMA node's vCPUs to its own host node: the memory "
        "of each guest node is bound to its host node (numaN hostnodes, policy=bind), but a guest node's vCPUs may "
        "run on another node's CPUs. "
    )
    affinity = _affinity(s, nodes)
    if affinity:
        return why + f"affinity is {affinity}, the CPUs of nodes {on} together (the VM stays off the other nodes)."
    return why + (
        f"No affinity is set: the CPUs of nodes {on} are every CPU of proxmox_gpu_vm_host_numa_cpus, which pins "
        "nothing. To pin vCPUs to a GPU's socket, give each socket's GPUs a VM of their own."
    )


def _bus_gpus(s: dict) -> list[tuple[int, dict]]:
    return [
        (i, g)
        for i, g in enumerate(s.get("gpus") or [])
        if isinstance(g, dict) and g.get("bus") and BUS_RE.match(str(g["bus"]))
    ]


def _overlap(a: str, b: str) -> bool:
    """Two bus ids name a common device (a bus id without function names every function of the slot)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _twice_in_vm(vm: str, gpus: list[tuple[int, list[str]]], on: str) -> list[str]:
    """GPU entries of one VM that name a common device: qemu-server fails the start, "device '<id>' assigned more than
    once" (QemuServer/PCI.pm parse_hostpci_devices, 9.1.19 :556 / 8.4.10 :585)."""
    problems = []
    for a, (i, paths_i) in enumerate(gpus):
        for j, paths_j in gpus[a + 1 :]:
            both = sorted({p for p in paths_i for q in paths_j if _overlap(p, q)})
            if both:
                problems.append(
                    f"{vm}: proxmox_gpu_vm_gpus[{i}] and proxmox_gpu_vm_gpus[{j}] name the same device "
                    f"{', '.join(both)}{on}: Proxmox VE refuses the start (\"device '{both[0]}' assigned more than "
                    'once"); list each GPU once in proxmox_gpu_vm_gpus'
                )
    return problems


def static_problems(specs: list[dict]) -> list[str]:
    """Problems found in the inventory alone (no API call)."""
    problems = []
    owners: dict[str, str] = {}
    vmids: dict[int, str] = {}
    for s in specs:
        vm = s["name"]
        for var in ("node", "vmid"):
            if s.get(var) in (None, ""):
                problems.append(f"{vm}: proxmox_gpu_vm_{var} is not set; give the VM's Proxmox {var}")
        vmid = s.get("vmid")
        if vmid not in (None, ""):
            if vmid in vmids:
                problems.append(f"{vm}: proxmox_gpu_vm_vmid {vmid} is also given to {vmids[vmid]}; one vmid per VM")
            vmids[vmid] = vm
        q35 = "q35" in str(s.get("machine", ""))
        for i, gpu in enumerate(s.get("gpus", [])):
            where = f"{vm}: proxmox_gpu_vm_gpus[{i}]"
            if not isinstance(gpu, dict) or bool(gpu.get("bus")) == bool(gpu.get("mapping")):
                problems.append(
                    f"{where} must have exactly one of bus (e.g. 0000:81:00.0) or mapping (a cluster "
                    f"PCI resource mapping name), got {gpu!r}"
                )
                continue
            if gpu.get("bus") and not BUS_RE.match(str(gpu["bus"])):
                problems.append(f"{where}.bus {gpu['bus']!r} is not a PCI bus id like 0000:81:00.0")
                continue
            unknown = sorted(set(gpu) - GPU_KEYS)
            if unknown:
                problems.append(
                    f"{where} has unknown key(s) {', '.join(unknown)}; a GPU takes {', '.join(sorted(GPU_KEYS))}"
                )
            for key in ("pcie", "rombar", "x_vga"):
                if key in gpu and not isinstance(gpu[key], bool):
                    problems.append(f"{where}.{key} must be true or false, got {gpu[key]!r}")
            if "romfile" in gpu and not ROMFILE_RE.match(str(gpu["romfile"] or "")):
                problems.append(
                    f"{where}.romfile {gpu['romfile']!r} must be a file name in /usr/share/kvm/ of the Proxmox "
                    "node (no path, no ',' or ';'), e.g. gpu-vbios.rom"
                )
            if gpu.get("pcie", True) and not q35:
                problems.append(
                    f"{where}: pcie=1 needs machine q35 but proxmox_gpu_vm_machine is "
                    f"{s.get('machine')!r}; set proxmox_gpu_vm_machine: q35 or pcie: false"
                )
            if s.get("clique") and gpu.get("bus") and not str(gpu["bus"]).endswith(".0"):
                problems.append(
                    f"{where}.bus {gpu['bus']!r}: the GPUDirect clique needs an explicit function "
                    "(.0) on each hostpci; write the full bus id, e.g. 0000:81:00.0"
                )
            key = _gpu_key(gpu, s.get("node", ""))
            if key in owners and owners[key] != vm:
                problems.append(
                    f"{where}: GPU {key} is also given to {owners[key]}; a GPU can be passed through to one VM only"
                )
            owners.setdefault(key, vm)
        problems += _twice_in_vm(vm, [(i, [_full_bus(str(g["bus"]))]) for i, g in _bus_gpus(s)], "")
        if len(s.get("gpus", [])) > 16:
            problems.append(f"{vm}: proxmox_gpu_vm_gpus has {len(s['gpus'])} entries; Proxmox VE has hostpci0-15")
        hp = str(s.get("hugepages") or "")
        memory = int(s.get("memory") or 0)
        if hp and hp not in ("2", "1024", "any"):
            problems.append(f"{vm}: proxmox_gpu_vm_hugepages {hp!r} must be 2, 1024, any or empty")
        elif hp in HUGEPAGE_MIB:
            page = HUGEPAGE_MIB[hp]
            if page > memory or memory % page:
                problems.append(
                    f"{vm}: proxmox_gpu_vm_hugepages {hp} (MiB pages) does not fit "
                    f"proxmox_gpu_vm_memory_mib {memory}: memory must be a multiple of the page size "
                    "and at least one page"
                )
        if s.get("apply_pending") and not s.get("drain_tasks"):
            problems.append(
                f"{vm}: proxmox_gpu_vm_apply_pending is true but proxmox_gpu_vm_drain_tasks is empty; a VM is "
                "stopped only after the drain hook took it out of service"
            )
        if s.get("clique") and not s.get("gpus"):
            problems.append(f"{vm}: proxmox_gpu_vm_gpudirect_clique is on but proxmox_gpu_vm_gpus is empty")
        if s.get("gpus") and s.get("mmio64_mb") in (None, ""):
            problems.append(
                f"{vm}: the GPUs' BAR size is unknown: proxmox_gpu_vm_gpu_class {s.get('gpu_class')!r} is not in the "
                f"role's table ({', '.join(sorted(GPU_MEMORY_GB))}); set proxmox_gpu_vm_gpu_bar_gib (the GPU memory "
                "in GiB rounded up to a power of two, e.g. 256 for 141 GB) or proxmox_gpu_vm_mmio64_mb"
            )
        elif int(s.get("mmio64_mb") or 0) > MMIO64_MAX_MB:
            problems.append(
                f"{vm}: proxmox_gpu_vm_mmio64_mb {s['mmio64_mb']} is above the {MMIO64_MAX_MB} MiB (16 TiB) OVMF "
                "accepts; lower proxmox_gpu_vm_mmio64_mb or proxmox_gpu_vm_gpu_bar_gib"
            )
        if all(isinstance(g, dict) for g in s.get("gpus") or []):
            problems += numa_problems(s)
    return problems


def _mapping_paths(mapping: dict) -> dict[str, list[list[str]]]:
    """node -> the mapping's alternatives there, each the devices of one map entry (`path=a;b`: passed together).
    Several entries for one node make a pool: Proxmox VE takes the first free one at the start (qemu-server
    QemuServer/PCI.pm parse_hostpci, choose_hostpci_devices)."""
    out: dict[str, list[list[str]]] = {}
    for entry in mapping.get("map", []):
        fields = dict(kv.split("=", 1) for kv in entry.split(",") if "=" in kv)
        if "node" in fields and fields.get("path"):
            out.setdefault(fields["node"], []).append([_full_bus(p) for p in fields["path"].split(";")])
    return out


def cluster_problems(specs: list[dict], cluster: dict, owner_tag: str) -> list[str]:
    """Problems against the cluster's state (read-only API answers): nodes, PCI devices, mappings, vmids."""
    problems = []
    mappings = {m["id"]: m for m in cluster.get("mappings", [])}
    for s in specs:
        vm, node = s["name"], s["node"]
        offline = cluster.get("offline") or {}
        tnode = s.get("template_node") or node
        vmid = s.get("vmid")
        new = vmid in (None, "") or not any(int(r["vmid"]) == int(vmid) for r in cluster.get("vms", []))
        if s.get("template") and new and tnode != node and tnode in offline:
            problems.append(
                f"{vm}: proxmox_gpu_vm_template_node {tnode!r} is {offline[tnode]} (GET /nodes), so the template "
                f"cannot be cloned from it: bring {tnode} back online, or set proxmox_gpu_vm_template_node to an "
                "online node with the template"
            )
        if node in offline:
            problems.append(
                f"{vm}: proxmox_gpu_vm_node {node!r} is a node of the cluster but {offline[node]} (GET /nodes), so "
                f"its PCI devices and VMs cannot be read nor the VM created or started there: bring {node} back "
                "online (its pve-cluster and pveproxy), or choose another node in proxmox_gpu_vm_node"
            )
            continue
        if node not in cluster.get("pci", {}):
            problems.append(
                f"{vm}: proxmox_gpu_vm_node {node!r} is not a node of the cluster (GET /nodes: "
                f"{', '.join(f'{n} {st}' for n, st in sorted((cluster.get('nodes') or {}).items())) or 'none'})"
            )
            continue
        devices = {_full_bus(d["id"]) for d in cluster["pci"][node]}
        for i, gpu in enumerate(s.get("gpus", [])):
            where = f"{vm}: proxmox_gpu_vm_gpus[{i}]"
            if gpu.get("mapping"):
                mp = mappings.get(gpu["mapping"])
                if mp is None:
                    problems.append(
                        f"{where}.mapping {gpu['mapping']!r} is not a PCI resource mapping of the "
                        f"cluster (Datacenter > Resource Mappings: {', '.join(sorted(mappings)) or 'none'})"
                    )
                elif node not in _mapping_paths(mp):
                    problems.append(f"{where}.mapping {gpu['mapping']!r} has no device on node {node}")
                else:
                    for path in (p for alt in _mapping_paths(mp)[node] for p in alt):
                        if path not in devices:
                            problems.append(
                                f"{where}.mapping {gpu['mapping']!r} points to {path}, "
                                f"which is not in the PCI list of node {node}"
                            )
            else:
                bus = _full_bus(str(gpu["bus"]))
                if bus not in devices and not any(d.startswith(bus + ".") for d in devices):
                    problems.append(f"{where}.bus {gpu['bus']} is not in the PCI list of node {node}")
        # one device twice in this VM through a mapping (bus ids alone: static_problems)
        mine = []
        for i, gpu in enumerate(s.get("gpus", [])):
            alts = _mapping_paths(mappings.get(gpu.get("mapping"), {})).get(node) if gpu.get("mapping") else None
            if alts is not None and len(alts) == 1:
                mine.append((i, alts[0], True))
            elif gpu.get("bus"):
                mine.append((i, [_full_bus(str(gpu["bus"]))], False))
        if any(mapped for _i, _paths, mapped in mine):
            problems += [
                p
                for p in _twice_in_vm(vm, [(i, paths) for i, paths, _mapped in mine], f" on {node}")
                if any(m and f"[{i}]" in p for i, _paths, m in mine)
            ]
        # a mapped GPU and a bus id can name the same device
        taken = {}
        for other in specs:
            if other.get("node") != node:
                continue
            for gpu in other.get("gpus", []):
                alts = _mapping_paths(mappings.get(gpu.get("mapping"), {})).get(node) if gpu.get("mapping") else None
                if alts is not None and len(alts) != 1:
                    continue  # a pool: Proxmox VE picks a free device (proxmox_gpu_vm_pve_cluster_problems)
                for path in alts[0] if alts else [_full_bus(str(gpu.get("bus", "")))] if gpu.get("bus") else []:
                    if path in taken and taken[path] != other["name"] and other["name"] == vm:
                        problems.append(
                            f"{vm}: proxmox_gpu_vm_gpus names device {path} on {node}, which "
                            f"{taken[path]} also gets (bus id or mapping); a GPU goes to one VM only"
                        )
                    taken.setdefault(path, other["name"])
        existing = next((r for r in cluster.get("vms", []) if int(r["vmid"]) == int(s["vmid"])), None)
        if existing is not None:
            tags = [t for t in re.split(r"[;, ]+", existing.get("tags", "")) if t]
            if existing.get("template"):
                problems.append(
                    f"{vm}: proxmox_gpu_vm_vmid {s['vmid']} is a template on {existing['node']}; choose another vmid"
                )
            elif existing.get("name") != vm or owner_tag not in tags:
                problems.append(
                    f"{vm}: proxmox_gpu_vm_vmid {s['vmid']} is taken by VM {existing.get('name')!r} on "
                    f"{existing['node']}, which this inventory does not own (owned VMs carry the tag "
                    f"{owner_tag!r} and the inventory name); choose another vmid"
                )
            elif existing["node"] != node:
                problems.append(
                    f"{vm}: VM {s['vmid']} is on node {existing['node']}, proxmox_gpu_vm_node says "
                    f"{node}; migrating GPU VMs is not done by this role"
                )
        if (
            not existing
            and s.get("template")
            and not any(r.get("name") == s["template"] and r.get("template") for r in cluster.get("vms", []))
        ):
            problems.append(f"{vm}: proxmox_gpu_vm_template {s['template']!r} is not a template in the cluster")
    return problems


def _hostpci(gpu: dict) -> str:
    value = f"mapping={gpu['mapping']}" if gpu.get("mapping") else _full_bus(str(gpu["bus"]))
    value += ",pcie=1" if gpu.get("pcie", True) else ""
    if "rombar" in gpu:
        value += f",rombar={int(bool(gpu['rombar']))}"
    if gpu.get("romfile"):
        value += f",romfile={gpu['romfile']}"
    if gpu.get("x_vga"):
        value += ",x-vga=1"
    return value


def desired_config(s: dict) -> dict:
    """The VM configuration keys this role owns, as Proxmox VE stores and returns them."""
    conf = {
        "name": s["name"],
        "cores": int(s["cores"]),
        "sockets": int(s["sockets"]),
        "memory": str(int(s["memory"])),
        "cpu": s["cpu"],
        "machine": s["machine"],
        "bios": s["bios"],
        "balloon": 0,
        "agent": "1",
        "ciuser": s["ciuser"],
        "ipconfig0": s["ipconfig0"],
        "tags": ";".join(sorted(set(s["tags"]))),
    }
    if s.get("sshkeys"):
        conf["sshkeys"] = quote(s["sshkeys"], safe="")
    if s.get("hugepages"):
        conf["hugepages"] = str(s["hugepages"])
        if s.get("keephugepages"):
            conf["keephugepages"] = 1
    conf.update(numa_config(s))
    for i, gpu in enumerate(s.get("gpus", [])):
        conf[f"hostpci{i}"] = _hostpci(gpu)
    args = []
    if int(s.get("mmio64_mb") or 0) > 0:
        args.append(f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={int(s['mmio64_mb'])}")
    if s.get("clique"):
        args += [f"-set device.hostpci{i}.x-nv-gpudirect-clique={int(s['clique_id'])}" for i in range(len(s["gpus"]))]
    if args:
        conf["args"] = " ".join(args)
    return conf


def config_diff(desired: dict, current: dict, efidisk_storage: str) -> dict:
    """What to set and delete so that `current` (pending values applied) matches `desired`."""
    current = current or {}
    changes = {k: v for k, v in desired.items() if str(current.get(k, "")) != str(v)}
    delete = sorted(k for k in current if HOSTPCI_RE.match(k) and k not in desired)
    delete += [k for k in current if NUMA_RE.match(k) and k not in desired]
    delete += [
        k for k in ("affinity", "args", "hugepages", "keephugepages", "sshkeys") if k in current and k not in desired
    ]
    if "numa" not in desired and str(current.get("numa", "0")) == "1":
        changes["numa"] = 0
    if "efidisk0" not in current:
        changes["efidisk0"] = f"{efidisk_storage}:1,efitype=4m,pre-enrolled-keys=0"
    return {"set": changes, "delete": delete, "any": bool(changes or delete)}


def kvm_params(desired: dict, diff: dict, efidisk_storage: str) -> dict:
    """Parameters of community.proxmox.proxmox_kvm (update: true) that write `desired`."""
    p = {
        "name": desired["name"],
        "cores": desired["cores"],
        "sockets": desired["sockets"],
        "memory": int(desired["memory"]),
        "cpu": desired["cpu"],
        "machine": desired["machine"],
        "bios": desired["bios"],
        "balloon": desired["balloon"],
        "agent": desired["agent"],
        "ciuser": desired["ciuser"],
        "ipconfig": {"ipconfig0": desired["ipconfig0"]},
        "tags": desired["tags"].split(";"),
        "hostpci": {k: v for k, v in desired.items() if HOSTPCI_RE.match(k)} or None,
        "hugepages": desired.get("hugepages"),
        "numa_enabled": bool(desired.get("numa")) if "numa" in desired or "numa" in diff["set"] else None,
        "numa": {k: v for k, v in desired.items() if NUMA_RE.match(k)} or None,
        "args": desired.get("args"),
        "sshkeys": None,
        "efidisk0": None,
        "update_unsafe": False,
        # options proxmox_kvm has no parameter for, written by proxmox_gpu_vm_config
        "extra": {k: desired[k] for k in ("affinity", "keephugepages") if k in desired and k in diff["set"]},
    }
    if "sshkeys" in desired:
        from urllib.parse import unquote

        p["sshkeys"] = unquote(desired["sshkeys"])
    if "efidisk0" in diff["set"]:
        p["efidisk0"] = {"storage": efidisk_storage, "format": "raw", "efitype": "4m", "pre_enrolled_keys": False}
        p["update_unsafe"] = True
    return p


def start_timeout(desired: dict, margin: int = 60) -> int:
    """Seconds a start of this configuration may take: qemu-server's config_aware_timeout (QemuServer/Helpers.pm,
    9.1.19 41ffc59e :264-300, 8.4.10 5ccd363e :201-237) plus `margin`: 30 s, or the memory in GiB above 30 GiB,
    times 4 with any hostpciN, at least 150 s with hugepages, plus 5 s per NIC (netN of the template)."""
    memory = int(str(desired.get("memory", 0)).split(",", maxsplit=1)[0].replace("current=", "") or 0)
    timeout = int(memory / 1024) if memory > 30720 else 30
    if any(HOSTPCI_RE.match(k) for k in desired):
        timeout *= 4
    if desired.get("hugepages") and timeout < 150:
        timeout = 150
    timeout += 5 * sum(1 for k in desired if re.match(r"^net\d+", k))
    return timeout + int(margin)


def pending_keys(pending: list[dict]) -> list[str]:
    """Keys of GET .../pending that wait for a full stop and start."""
    return sorted(p["key"] for p in pending or [] if "pending" in p or p.get("delete"))


def clique_verdict(nccl: dict | None, baseline_gbps: float | None, min_gain: float) -> dict:
    """Keep the experimental GPUDirect clique only if the NCCL measurement proves it.

    `nccl` is gpu_facts' measurement (fact gpu_facts_nccl / reports/gpu_facts/<host>/nccl-allreduce.json):
    the all-reduce of the derived environment must have completed at every size and its bus bandwidth at the
    largest size must beat the measured baseline (without the clique) by `min_gain` (0.2 = 20 %).
    """
    if not nccl:
        return {
            "keep": False,
            "reason": "no NCCL all-reduce measurement on this VM (preflight measure_nccl did not run)",
        }
    summary = nccl.get("summary") or {}
    derived = (summary.get("busbw_gbps") or {}).get("derived") or {}
    variant = next((v for v in nccl.get("variants", []) if v.get("name") == "derived"), {})
    wrong = [r.get("size_mib") for r in variant.get("results", []) if not r.get("correct")]
    if not variant.get("ok") or wrong or not derived:
        why = (
            (variant.get("error") or "failed")
            if not variant.get("ok")
            else (f"wrong sums at {wrong} MiB" if wrong else "no bandwidth for the derived environment")
        )
        return {"keep": False, "reason": f"the all-reduce did not complete with the clique: {why}"}
    largest = max(derived, key=float)
    busbw = float(derived[largest] or 0)
    if baseline_gbps in (None, "") or float(baseline_gbps) <= 0:
        return {
            "keep": False,
            "reason": f"all-reduce completed at {busbw} GB/s but there is no baseline without the "
            "clique (proxmox_gpu_vm_clique_baseline_busbw_gbps) to prove a gain",
        }
    need = float(baseline_gbps) * (1 + float(min_gain))
    if busbw < need:
        return {
            "keep": False,
            "reason": f"all-reduce bus bandwidth {busbw} GB/s at {largest} MiB is below "
            f"{need:.1f} GB/s (baseline {baseline_gbps} GB/s + {int(float(min_gain) * 100)} %)",
        }
    return {
        "keep": True,
        "reason": f"all-reduce completed; bus bandwidth {busbw} GB/s at {largest} MiB vs baseline {baseline_gbps} GB/s",
    }


class FilterModule:
    def filters(self):
        return {
            "proxmox_gpu_vm_static_problems": static_problems,
            "proxmox_gpu_vm_cluster_problems": cluster_problems,
            "proxmox_gpu_vm_desired": desired_config,
            "proxmox_gpu_vm_diff": config_diff,
            "proxmox_gpu_vm_kvm_params": kvm_params,
            "proxmox_gpu_vm_pending_keys": pending_keys,
            "proxmox_gpu_vm_clique_verdict": clique_verdict,
            "proxmox_gpu_vm_bar_gib": bar_gib,
            "proxmox_gpu_vm_mmio64_mb": mmio64_mb,
            "proxmox_gpu_vm_start_timeout": start_timeout,
            "proxmox_gpu_vm_affinity_note": affinity_note,
        }
