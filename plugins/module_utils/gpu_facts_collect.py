"""Assemble the ``gpu_facts`` fact tree from nvidia-smi outputs (and optional NVML).

Pure standard-library Python, importable by the ``gpu_facts`` module (as
``ansible_collections.gpufleet.fleet.plugins.module_utils.gpu_facts_collect``) and by the unit tests.
Parsing of nvidia-smi text is delegated to
``nvidia_smi_parse``; this file only decides *which* commands to run and turns their parsed
output into one documented structure (see docs/gpu-facts.md, "Facts schema").

Running commands is left to the caller: :func:`collect` takes a ``run(argv) -> (rc, stdout,
stderr)`` callable, so the Ansible module passes ``module.run_command`` and tests pass
recorded outputs.
"""

from __future__ import annotations

import contextlib
import os
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_smi_parse import (
    NvidiaSmiParseError,
    compute_cap_to_arch,
    parse_csv_query,
    parse_driver_failure,
    parse_p2p_matrix,
    parse_smi_header,
    parse_topo_matrix,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.procfs import (
    pid_alive,
    pid_cmdline,
    pid_unit,
    pid_user,
    user_name,
)

SCHEMA_VERSION = 1

GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "driver_version",
    "compute_cap",
    "mig.mode.current",
    "persistence_mode",
)
APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")

# Link types of `nvidia-smi topo -m`, nearest first (NV# is any bonded NVLink set).
LINK_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
# NVML P2P status codes (nvmlGpuP2PStatus_t) in nvidia-smi's letters.
NVML_P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}


class GpuFactsError(RuntimeError):
    """A command failed; carries the command, its rc and output for the failure message."""

    def __init__(self, message, cmd=None, rc=None, stdout="", stderr=""):
        super().__init__(message)
        self.cmd = cmd
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr


def commands(nvidia_smi="nvidia-smi"):
    """The nvidia-smi command lines the facts are built from, by key."""
    return {
        "query_gpu": [nvidia_smi, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"],
        "query_apps": [
            nvidia_smi,
            "--query-compute-apps=" + ",".join(APP_FIELDS),
            "--format=csv,noheader,nounits",
        ],
        "topo_m": [nvidia_smi, "topo", "-m"],
        "topo_p2p_r": [nvidia_smi, "topo", "-p2p", "r"],
        "summary": [nvidia_smi],
    }


def link_rank(link):
    """Distance rank of a ``topo -m`` link (0 = NVLink ... 5 = SYS, 6 = unknown)."""
    if link is None:
        return len(LINK_ORDER)
    text = str(link).strip().upper()
    if re.fullmatch(r"NV\d+", text):
        return 0
    if text == "SOC":  # older drivers' name for SYS
        text = "SYS"
    return LINK_ORDER.index(text) if text in LINK_ORDER else len(LINK_ORDER)


def _version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", str(text or "")))


def _gpu_name(index):
    return f"GPU{index}"


def _run_checked(run, key, argv):
    rc, out, err = run(argv)
    failure = parse_driver_failure(rc, out, err)
    if failure:
        raise GpuFactsError(
            f"{failure}. Command `{' '.join(argv)}` exited {rc}; it printed: "
            f"{(out or '').strip()[:400]!r} {(err or '').strip()[:400]!r}",
            cmd=argv,
            rc=rc,
            stdout=out,
            stderr=err,
        )
    return out


def _parse_or_fail(parser, key, argv, text, *args, **kwargs):
    try:
        return parser(text, *args, **kwargs)
    except NvidiaSmiParseError as exc:
        raise GpuFactsError(
            f"could not read the output of `{' '.join(argv)}`: {exc}", cmd=argv, rc=0, stdout=text
        ) from exc


def build_topology(topo, gpu_count):
    """Summarise ``parse_topo_matrix`` output over every GPU pair."""
    names = [_gpu_name(i) for i in range(gpu_count)]
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            link = topo["links"].get(a, {}).get(b) or topo["links"].get(b, {}).get(a)
            pairs.append({"a": a, "b": b, "link": link})
    links = [p["link"] for p in pairs]
    known = [lnk for lnk in links if link_rank(lnk) < len(LINK_ORDER)]
    pcie = [lnk for lnk in known if link_rank(lnk) > 0]
    return {
        "matrix": topo["links"],
        "pairs": pairs,
        "link_types": sorted({lnk for lnk in links if lnk}, key=lambda lnk: (link_rank(lnk), lnk)),
        "nvlink_all": bool(pairs) and all(link_rank(lnk) == 0 for lnk in links),
        "nvlink_any": any(link_rank(lnk) == 0 for lnk in links),
        "worst_link": max(known, key=link_rank) if known else None,
        "worst_pcie_link": max(pcie, key=link_rank) if pcie else None,
        "unknown_links": sorted({str(lnk) for lnk in links if link_rank(lnk) >= len(LINK_ORDER)}),
        "cpu_affinity": topo.get("cpu_affinity", {}),
        "numa_affinity": topo.get("numa_affinity", {}),
        "numa_nodes": sorted({v for v in topo.get("numa_affinity", {}).values() if v is not None}),
        "nics": topo.get("nics", []),
        "nic_names": topo.get("nic_names", {}),
    }


def build_p2p(p2p, gpu_count, nvml_status=None):
    """Summarise ``parse_p2p_matrix`` (read mode) over every ordered GPU pair."""
    names = [_gpu_name(i) for i in range(gpu_count)]
    pairs = []
    for a in names:
        for b in names:
            if a != b:
                pairs.append({"a": a, "b": b, "status": p2p["status"].get(a, {}).get(b, "missing")})
    statuses = [p["status"] for p in pairs]
    missing = sorted(set(p2p.get("missing_rows", [])) | {g for g in names if g not in p2p["status"]})
    result = {
        "mode": "read",
        "matrix": p2p["status"],
        "statuses": sorted(set(statuses)),
        "all_ok": bool(pairs) and all(s == "OK" for s in statuses),
        "any_ok": any(s == "OK" for s in statuses),
        "missing_gpus": [g for g in missing if g in names],
        "not_ok_pairs": [f"{p['a']}-{p['b']}:{p['status']}" for p in pairs if p["status"] != "OK"],
        "nvml": None,
        "nvml_agrees": None,
    }
    if nvml_status is not None:
        result["nvml"] = nvml_status
        disagree = [
            f"{a}-{b}: nvidia-smi {p2p['status'].get(a, {}).get(b, 'missing')}, nvml {s}"
            for a, row in nvml_status.items()
            for b, s in row.items()
            if p2p["status"].get(a, {}).get(b) != s
        ]
        result["nvml_agrees"] = not disagree
        result["nvml_disagreements"] = disagree
    return result


def _unit_of(pid, proc_root="/proc"):
    """The systemd unit of a process for the facts: None when it is gone or its cgroup names no unit."""
    return pid_unit(pid, proc_root) or None


def _proc_info(pid, proc_root="/proc", user_name=user_name):
    """``{alive, uid, user, cmdline}`` of a process from ``/proc/<pid>`` (``alive`` False when gone or a zombie).

    The user is the real UID of ``/proc/<pid>/status`` (line ``Uid:``) by name; the command line is
    ``/proc/<pid>/cmdline`` with secrets masked (:func:`procfs.redact_cmdline`).
    """
    if not os.path.exists(os.path.join(proc_root, str(pid), "status")):
        return {"alive": False, "uid": None, "user": None, "cmdline": ""}
    uid, user = pid_user(pid, proc_root, name_of=user_name)
    return {
        "alive": pid_alive(pid, proc_root),
        "uid": uid,
        "user": user,
        "cmdline": pid_cmdline(pid, proc_root),
    }


def build_processes(rows, gpus, unit_of=_unit_of, proc_info=_proc_info):
    """One entry per (process, GPU) row of ``--query-compute-apps``, with the process's unit, user and command.

    ``alive`` is False for a PID that no longer exists (memory not yet released by a dying process, or
    leaked); its user and command are then unknown (None, "").
    """
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    processes = []
    for row in rows:
        pid = row.get("pid")
        info = proc_info(pid) if pid is not None else {"alive": False, "uid": None, "user": None, "cmdline": ""}
        processes.append(
            {
                "pid": pid,
                "name": row.get("process_name"),
                "used_memory_mib": row.get("used_memory"),
                "gpu_uuid": row.get("gpu_uuid"),
                "gpu_index": by_uuid.get(row.get("gpu_uuid")),
                "unit": unit_of(pid) if pid is not None else None,
                "alive": info["alive"],
                "uid": info["uid"],
                "user": info["user"],
                "cmdline": info["cmdline"],
            }
        )
    return processes


def detect_virtualization(run, read_text=None):
    """VM and container type: ``systemd-detect-virt``, else DMI, else the cpuinfo hypervisor flag."""
    read_text = read_text or _read_text
    result = {"vm": None, "container": None, "is_vm": None, "method": None, "dmi_vendor": None}
    for flag, key in (("--vm", "vm"), ("--container", "container")):
        try:
            rc, out, _err = run(["systemd-detect-virt", flag])
        except OSError:
            rc, out = 127, ""
        value = (out or "").strip().splitlines()[0] if (out or "").strip() else ""
        if rc in (0, 1) and value:
            result[key] = value
            result["method"] = "systemd-detect-virt"
    vendor = (read_text("/sys/class/dmi/id/sys_vendor") or "").strip() or None
    product = (read_text("/sys/class/dmi/id/product_name") or "").strip() or None
    result["dmi_vendor"] = vendor
    result["dmi_product"] = product
    if result["vm"] is None:
        dmi = f"{vendor or ''} {product or ''}".lower()
        if "qemu" in dmi or "kvm" in dmi or "q35" in dmi:
            result["vm"], result["method"] = "kvm", "dmi"
        elif "vmware" in dmi:
            result["vm"], result["method"] = "vmware", "dmi"
        elif "firecracker" in dmi:
            result["vm"], result["method"] = "firecracker", "dmi"
        elif re.search(r"^flags\s*:.*\bhypervisor\b", read_text("/proc/cpuinfo") or "", re.M):
            result["vm"], result["method"] = "unknown-hypervisor", "cpuinfo"
        elif read_text("/proc/cpuinfo"):
            result["vm"], result["method"] = "none", "cpuinfo"
    result["is_vm"] = None if result["vm"] is None else result["vm"] != "none"
    return result


def _read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def disk_space(paths):
    """Free and total MiB for each path (or its nearest existing parent)."""
    result = []
    for path in paths or []:
        checked = path
        while checked and not os.path.exists(checked):
            parent = os.path.dirname(checked.rstrip("/")) or "/"
            if parent == checked:
                break
            checked = parent
        try:
            st = os.statvfs(checked)
        except OSError:
            result.append({"path": path, "checked_path": checked, "free_mib": None, "total_mib": None})
            continue
        result.append(
            {
                "path": path,
                "checked_path": checked,
                "free_mib": st.f_bavail * st.f_frsize // (1024 * 1024),
                "total_mib": st.f_blocks * st.f_frsize // (1024 * 1024),
            }
        )
    return result


# NVML_P2P_CAPS_INDEX_READ is 0 in nvml.h; nvidia-ml-py 13.x defines it as ``0,`` (a tuple), which
# ctypes refuses, so the value is given here rather than taken from the package.
NVML_P2P_CAPS_INDEX_READ = 0


def nvml_p2p_status(gpu_count, errors=None):
    """P2P read status per ordered pair from NVML (``pynvml``), or ``None`` when unavailable.

    Why NVML could not be read is appended to ``errors`` (a list) when given.
    """
    errors = errors if errors is not None else []
    try:
        import pynvml  # noqa: PLC0415  (optional second source)
    except ImportError:
        errors.append("pynvml not importable by the module's Python")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001  (NVML missing or failing: nvidia-smi stays the source)
        errors.append(f"nvmlInit failed: {exc!r}")
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpu_count)]
        status = {}
        for i, hi in enumerate(handles):
            row = {}
            for j, hj in enumerate(handles):
                if i != j:
                    code = pynvml.nvmlDeviceGetP2PStatus(hi, hj, NVML_P2P_CAPS_INDEX_READ)
                    row[_gpu_name(j)] = NVML_P2P_CODES.get(int(code), "U")
            status[_gpu_name(i)] = row
        return status
    except Exception as exc:  # noqa: BLE001
        errors.append(f"NVML P2P query failed: {exc!r}")
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def collect(
    run,
    nvidia_smi="nvidia-smi",
    use_nvml=True,
    disk_paths=None,
    unit_of=_unit_of,
    nvml=None,
    read_text=None,
    proc_info=_proc_info,
):
    """Run the nvidia-smi commands through ``run`` and return ``(facts, raw_outputs)``.

    :param run: ``run(argv) -> (rc, stdout, stderr)``.
    :param nvml: a precomputed NVML P2P matrix (tests); by default read through pynvml when
        ``use_nvml`` and the package is importable.
    :param read_text: ``read_text(path) -> str | None`` for DMI and cpuinfo (tests).
    :param proc_info: ``proc_info(pid) -> {alive, uid, user, cmdline}`` of a GPU process (tests).
    :raises GpuFactsError: when the driver is missing or a command's output is unreadable.
    """
    cmds = commands(nvidia_smi)
    raw = {}
    out = _run_checked(run, "query_gpu", cmds["query_gpu"])
    raw["query_gpu"] = out
    rows = _parse_or_fail(parse_csv_query, "query_gpu", cmds["query_gpu"], out, header=False, fields=GPU_FIELDS)
    if not rows:
        raise GpuFactsError(f"`{' '.join(cmds['query_gpu'])}` listed no GPU", cmd=cmds["query_gpu"], rc=0, stdout=out)
    gpus = []
    for row in sorted(rows, key=lambda r: r["index"]):
        cap = row.get("compute_cap")
        gpus.append(
            {
                "index": row["index"],
                "name": row.get("name"),
                "uuid": row.get("uuid"),
                "pci_bus_id": row.get("pci.bus_id"),
                "memory_total_mib": row.get("memory.total"),
                "memory_used_mib": row.get("memory.used"),
                "memory_free_mib": row.get("memory.free"),
                "compute_cap": cap,
                "arch": compute_cap_to_arch(cap) if cap else None,
                "mig_mode": row.get("mig.mode.current"),
                "persistence_mode": row.get("persistence_mode"),
                "driver_version": row.get("driver_version"),
            }
        )
    gpu_count = len(gpus)

    out = _run_checked(run, "topo_m", cmds["topo_m"])
    raw["topo_m"] = out
    topo = _parse_or_fail(parse_topo_matrix, "topo_m", cmds["topo_m"], out)
    out = _run_checked(run, "topo_p2p_r", cmds["topo_p2p_r"])
    raw["topo_p2p_r"] = out
    p2p = _parse_or_fail(parse_p2p_matrix, "topo_p2p_r", cmds["topo_p2p_r"], out)
    out = _run_checked(run, "query_apps", cmds["query_apps"])
    raw["query_apps"] = out
    apps = _parse_or_fail(parse_csv_query, "query_apps", cmds["query_apps"], out, header=False, fields=APP_FIELDS)
    rc, out, err = run(cmds["summary"])
    raw["summary"] = out
    header = parse_smi_header(out) if rc == 0 else None

    for gpu in gpus:
        name = _gpu_name(gpu["index"])
        gpu["numa_affinity"] = topo["numa_affinity"].get(name)
        gpu["cpu_affinity"] = topo["cpu_affinity"].get(name)

    nvml_errors = []
    if nvml is None and use_nvml:
        nvml = nvml_p2p_status(gpu_count, nvml_errors)
    processes = build_processes(apps, gpus, unit_of=unit_of, proc_info=proc_info)
    drivers = sorted({g["driver_version"] for g in gpus if g["driver_version"]})
    facts = {
        "schema_version": SCHEMA_VERSION,
        "sources": ["nvidia-smi"] + (["nvml"] if nvml is not None else []),
        "nvml_error": "; ".join(nvml_errors) or None,
        "driver_loaded": True,
        "driver_version": drivers[0] if drivers else None,
        "cuda_driver_version": header["cuda_version"] if header else None,
        "gpu_count": gpu_count,
        "gpus": gpus,
        "models": sorted({g["name"] for g in gpus if g["name"]}),
        "archs": sorted({g["arch"] for g in gpus if g["arch"]}, key=_version_tuple),
        "compute_caps": sorted({g["compute_cap"] for g in gpus if g["compute_cap"]}, key=_version_tuple),
        "mixed_models": len({g["name"] for g in gpus}) > 1,
        "mig_enabled": any(str(g["mig_mode"] or "").lower() == "enabled" for g in gpus),
        "memory_total_mib_min": min((g["memory_total_mib"] or 0) for g in gpus),
        "topology": build_topology(topo, gpu_count),
        "p2p": build_p2p(p2p, gpu_count, nvml),
        "processes": processes,
        "busy_gpus": sorted({p["gpu_index"] for p in processes if p["gpu_index"] is not None}),
        "virtualization": detect_virtualization(run, read_text=read_text),
        "disk": disk_space(disk_paths),
    }
    return facts, raw
