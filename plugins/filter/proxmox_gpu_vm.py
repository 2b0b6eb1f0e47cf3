"""Filters of the proxmox_gpu_vm role: checks before any API call, the desired VM configuration as Proxmox VE
stores it, the difference to the current one, the proxmox_kvm parameters, and the GPUDirect clique verdict.

Pure functions over plain data (specs built in tasks/spec.yml; cluster facts read by proxmox_gpu_vm_info),
unit-tested in tests/unit/proxmox/test_filters.py.
"""

from __future__ import annotations

import re
from urllib.parse import quote

BUS_RE = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?$")
HOSTPCI_RE = re.compile(r"^hostpci\d+$")
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
    return problems


def _mapping_paths(mapping: dict) -> dict[str, str]:
    out = {}
    for entry in mapping.get("map", []):
        fields = dict(kv.split("=", 1) for kv in entry.split(",") if "=" in kv)
        if "node" in fields and "path" in fields:
            out[fields["node"]] = _full_bus(fields["path"])
    return out


def cluster_problems(specs: list[dict], cluster: dict, owner_tag: str) -> list[str]:
    """Problems against the cluster's state (read-only API answers): nodes, PCI devices, mappings, vmids."""
    problems = []
    mappings = {m["id"]: m for m in cluster.get("mappings", [])}
    for s in specs:
        vm, node = s["name"], s["node"]
        if node not in cluster.get("pci", {}):
            problems.append(
                f"{vm}: proxmox_gpu_vm_node {node!r} is not a node of the cluster "
                f"({', '.join(sorted(cluster.get('pci', {}))) or 'none'})"
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
                elif _mapping_paths(mp)[node] not in devices:
                    problems.append(
                        f"{where}.mapping {gpu['mapping']!r} points to {_mapping_paths(mp)[node]}, "
                        f"which is not in the PCI list of node {node}"
                    )
            else:
                bus = _full_bus(str(gpu["bus"]))
                if bus not in devices and not any(d.startswith(bus + ".") for d in devices):
                    problems.append(f"{where}.bus {gpu['bus']} is not in the PCI list of node {node}")
        # a mapped GPU and a bus id can name the same device
        taken = {}
        for other in specs:
            if other.get("node") != node:
                continue
            for gpu in other.get("gpus", []):
                path = (
                    _mapping_paths(mappings.get(gpu.get("mapping"), {})).get(node)
                    if gpu.get("mapping")
                    else _full_bus(str(gpu.get("bus", "")))
                )
                if path and path in taken and taken[path] != other["name"] and other["name"] == vm:
                    problems.append(
                        f"{vm}: proxmox_gpu_vm_gpus names device {path} on {node}, which "
                        f"{taken[path]} also gets (bus id or mapping); a GPU goes to one VM only"
                    )
                if path:
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
    return value + (",pcie=1" if gpu.get("pcie", True) else "")


def _cpus(n: int) -> str:
    return "0" if n == 1 else f"0-{n - 1}"


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
    if s.get("numa_node") not in (None, ""):
        conf["numa"] = 1
        conf["numa0"] = (
            f"cpus={_cpus(int(s['cores']) * int(s['sockets']))},hostnodes={int(s['numa_node'])},"
            f"memory={int(s['memory'])},policy=bind"
        )
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
    delete += [k for k in ("args", "hugepages", "numa0", "sshkeys") if k in current and k not in desired]
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
        "numa": {"numa0": desired["numa0"]} if "numa0" in desired else None,
        "args": desired.get("args"),
        "sshkeys": None,
        "efidisk0": None,
        "update_unsafe": False,
    }
    if "sshkeys" in desired:
        from urllib.parse import unquote

        p["sshkeys"] = unquote(desired["sshkeys"])
    if "efidisk0" in diff["set"]:
        p["efidisk0"] = {"storage": efidisk_storage, "format": "raw", "efitype": "4m", "pre_enrolled_keys": False}
        p["update_unsafe"] = True
    return p


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
    largest = max(derived, key=lambda k: float(k))
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
        }
