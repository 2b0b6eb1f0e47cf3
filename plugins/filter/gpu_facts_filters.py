"""Filters of the gpu_facts role: the one derivation of communication settings, and the preflight checks.

``gpu_comm_settings(facts, overrides, nnodes)``
    The NCCL environment and communication profile of one host, derived from its
    ``ansible_facts.gpu_facts`` (see docs/gpu-facts.md), with inventory overrides and the
    provenance of every value.

``gpu_preflight_problems(facts, settings)``
    Semantic checks before anything changes on a host: driver floor for the CUDA version,
    compute capability, busy GPUs, disk space, the derived settings' own errors. (The server's launch spec
    against these facts, tp x pp and backends, is the sglang_server role's: filter sglang_launch_problems.)

Both are pure functions of plain data (no Ansible import needed), so the unit tests call them
directly on real captures.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

# holders_remedy: what to do about each GPU holder, in words (one implementation; the server role's stop uses it)
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_holders import holders_remedy
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.filter_errors import as_filter_error

# The seed machine's proven NCCL set (8x RTX PRO 6000 in a KVM guest, P2P "NS"): see docs/gpu-facts.md.
SEED_NO_P2P_ENV = {
    "NCCL_P2P_LEVEL": "PHB",
    "NCCL_IB_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "8",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1",
}
# Links through which setting NCCL_P2P_LEVEL to the worst link is the right call when P2P is OK.
P2P_LEVEL_LINKS = ("PIX", "PXB", "PHB", "NODE")
_LINK_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
_FALSY = ("", "0", "false", "no", "off")


class GpuFactsFilterError(ValueError):
    """Input the filters cannot work with (not gpu_facts, wrong types)."""


def _link_rank(link):
    text = str(link or "").strip().upper()
    if re.fullmatch(r"NV\d+", text):
        return 0
    text = "SYS" if text == "SOC" else text
    return _LINK_ORDER.index(text) if text in _LINK_ORDER else len(_LINK_ORDER)


def _env_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _truthy_env(value):
    return value is not None and str(value).strip().lower() not in _FALSY


def _require_facts(facts):
    if not isinstance(facts, dict) or "gpu_count" not in facts:
        raise GpuFactsFilterError(
            "expected ansible_facts.gpu_facts (a dict with gpu_count); run the gpu_facts module first"
        )


def _no_driver(c):
    c.errors.append("no working NVIDIA driver (gpu_facts.driver_loaded=false): nothing to derive")


def _single_gpu(c):
    c.reasons.append(f"{c.gpu_count} GPU: no intra-node collective traffic, NCCL left at its defaults")


def _nvlink_p2p(c):
    c.reasons.append(
        f"every GPU pair is joined by NVLink ({', '.join(c.link_types)}) and P2P is OK: NCCL's own choice "
        "(P2P over NVLink) is the fast path, so no NCCL variable is set; turning P2P off measured 10x "
        "slower on a 2x H200 VM"
    )


def _pcie_p2p(c):
    worst = c.topo.get("worst_link")
    c.env["NCCL_P2P_LEVEL"] = worst
    c.reasons.append(
        f"NCCL_P2P_LEVEL={worst}: P2P is OK between every pair and the farthest pair is {worst}; NCCL's "
        f"default level can stop short of {worst} (e.g. PXB on Intel hosts), so P2P is allowed up to it"
    )


def _pcie_p2p_sys(c):
    worst = c.topo.get("worst_link")
    c.reasons.append(
        f"P2P is OK but the farthest pair crosses {worst} (between NUMA nodes): NCCL's default is kept; "
        "cross-socket P2P is often slower than SHM, measure with measure_nccl=true before overriding"
    )
    c.warnings.append(
        f"GPU pairs connected through {worst}: run the NCCL measurement (-e measure_nccl=true) and set "
        "gpu_facts_nccl_env_overrides if P2P off or a lower NCCL_P2P_LEVEL is faster"
    )


def _no_p2p(c):
    not_ok = c.p2p.get("not_ok_pairs", [])
    bad = ", ".join(not_ok[:4]) + (" ..." if len(not_ok) > 4 else "")
    c.env.update(SEED_NO_P2P_ENV)
    c.reasons.append(
        f"P2P is not available ({'/'.join(c.statuses) or 'no P2P table'}; {bad}) on {c.where}: every GPU-to-GPU "
        "transfer goes through host memory (NCCL's SHM transport), so the seed's proven set is used"
    )
    c.reasons.append(
        "NCCL_P2P_LEVEL=PHB: from the seed's working launch; with P2P reported unsupported NCCL keeps P2P off "
        "anyway, and if a driver later grants P2P it is used only up to PHB (the host bridge)"
    )
    if c.nnodes == 1:
        c.reasons.append(
            "NCCL_IB_DISABLE=1: one node, so no InfiniBand/RoCE is needed; keeps NCCL from routing "
            "intra-node traffic through a passed-through NIC when P2P is off"
        )
    else:
        del c.env["NCCL_IB_DISABLE"]
        c.reasons.append(f"NCCL_IB_DISABLE not set: {c.nnodes} nodes need the network between them")
    c.reasons.append(
        "NCCL_MIN_NCHANNELS=8: with SHM over PCIe more channels give more bus bandwidth (about 70% more "
        "with 8 than with 2 in community measurements); from the seed's working launch"
    )
    c.reasons.append(
        "NCCL_ALLOC_P2P_NET_LL_BUFFERS=1: kept from the seed's proven launch so the derived set equals it; "
        "it only affects P2P network connections (multi-node), so on one node it is expected to be a no-op. "
        "Remove it with gpu_facts_nccl_env_overrides: {NCCL_ALLOC_P2P_NET_LL_BUFFERS: null}"
    )
    c.reasons.append("NCCL_SHM_DISABLE is never set here: SHM is the only intra-node path when P2P is off")
    if c.p2p.get("any_ok"):
        c.warnings.append(
            "P2P is OK for some GPU pairs but not all: the whole host is treated as no-P2P; check the "
            "PCIe/IOMMU (ACS) setup of the VM"
        )
    if c.p2p.get("missing_gpus"):
        c.warnings.append(f"GPUs missing from `nvidia-smi topo -p2p r`: {', '.join(c.p2p['missing_gpus'])}")


# The topology profiles, first match wins: (profile, when it applies, what it derives). docs/gpu-facts.md has the table.
PROFILES = (
    ("no-driver", lambda c: not c.facts.get("driver_loaded", True), _no_driver),
    ("single-gpu", lambda c: c.gpu_count <= 1, _single_gpu),
    ("nvlink-p2p", lambda c: c.p2p.get("all_ok") and c.topo.get("nvlink_all"), _nvlink_p2p),
    ("pcie-p2p", lambda c: c.p2p.get("all_ok") and c.topo.get("worst_link") in P2P_LEVEL_LINKS, _pcie_p2p),
    ("pcie-p2p-sys", lambda c: c.p2p.get("all_ok"), _pcie_p2p_sys),
    ("no-p2p", lambda c: True, _no_p2p),
)


def _host_warnings(c):
    """What the profile does not cover: MIG, mixed GPU models, NVML disagreeing with nvidia-smi."""
    if c.facts.get("mig_enabled"):
        c.warnings.append(
            "MIG is enabled on some GPU: NCCL and tensor parallelism over MIG instances are not supported"
        )
    if c.facts.get("mixed_models"):
        c.warnings.append(
            f"mixed GPU models on one host ({', '.join(c.facts.get('models', []))}): TP runs at the slowest"
        )
    if c.p2p.get("nvml_agrees") is False:
        c.warnings.append("NVML and nvidia-smi disagree on P2P: " + "; ".join(c.p2p.get("nvml_disagreements", [])[:4]))


def _apply_overrides(c, values):
    """The inventory's NCCL variables on top (null removes one), each with its source."""
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise GpuFactsFilterError(f"overrides.nccl_env must be a dict, got {type(values).__name__}")
    for key, value in values.items():
        key = str(key)
        c.sources[key] = "inventory"
        if value is None:
            c.env.pop(key, None)
            c.removed.append(key)
            c.reasons.append(f"{key}: removed by inventory (null)")
        else:
            c.env[key] = _env_value(value)
            c.reasons.append(f"{key}={c.env[key]}: set by inventory")


def _check_overrides(c):
    """The one NCCL guard: SHM off without P2P is refused, P2P off where P2P works warns."""
    var = "gpu_facts_nccl_env_overrides"
    if _truthy_env(c.env.get("NCCL_SHM_DISABLE")):
        if c.profile == "no-p2p":
            c.errors.append(
                f"{var}.NCCL_SHM_DISABLE={c.env['NCCL_SHM_DISABLE']} on a host without P2P "
                f"(gpu_facts.p2p.statuses={c.statuses}): SHM is then the only intra-node path and NCCL falls "
                "back to sockets (about 100x slower on a 2x H200 VM). Fix: remove NCCL_SHM_DISABLE from "
                f"{var}"
            )
        else:
            c.warnings.append(
                f"{var}.NCCL_SHM_DISABLE={c.env['NCCL_SHM_DISABLE']}: disables NCCL's host shared-memory "
                "transport; only safe while P2P works for every pair"
            )
    if _truthy_env(c.env.get("NCCL_P2P_DISABLE")) and c.profile in ("nvlink-p2p", "pcie-p2p"):
        c.warnings.append(
            f"{var}.NCCL_P2P_DISABLE={c.env['NCCL_P2P_DISABLE']} on a host where P2P works "
            f"({', '.join(c.link_types)}): all-reduce measured 10x slower this way on a 2x H200 VM"
        )


def _nnodes(nnodes):
    try:
        nnodes = int(nnodes)
    except (TypeError, ValueError) as exc:
        raise GpuFactsFilterError(f"nnodes must be an integer, got {nnodes!r}") from exc
    if nnodes < 1:
        raise GpuFactsFilterError(f"nnodes must be >= 1, got {nnodes}")
    return nnodes


def _overrides(overrides):
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, dict):
        raise GpuFactsFilterError(f"overrides must be a dict with nccl_env, got {type(overrides).__name__}")
    if "sglang_flags" in overrides:
        raise GpuFactsFilterError(
            "SGLang flags are the sglang_server role's (its filter sglang_comm_flags reads this profile): set them in "
            "sglang_server_comm_flags_overrides, not in gpu_facts' overrides"
        )
    unknown = set(overrides) - {"nccl_env"}
    if unknown:
        raise GpuFactsFilterError(f"unknown override sections {sorted(unknown)}: use nccl_env")
    return overrides


def gpu_comm_settings(facts, overrides=None, nnodes=1):
    """Derive the communication settings of one host from its gpu_facts: the first matching topology profile of
    PROFILES, the host's other warnings, the inventory's overrides, the NCCL guard.

    Returns ``{"nccl_env", "sources", "removed", "profile", "reasons", "warnings",
    "errors", "inputs"}`` (docs/gpu-facts.md).
    """
    _require_facts(facts)
    overrides = _overrides(overrides)
    nnodes = _nnodes(nnodes)
    virt = facts.get("virtualization") or {}
    c = SimpleNamespace(
        facts=facts, nnodes=nnodes, gpu_count=int(facts.get("gpu_count") or 0), topo=facts.get("topology") or {},
        p2p=facts.get("p2p") or {}, env={}, reasons=[], warnings=[], errors=[], removed=[],
        where="a KVM/QEMU guest" if virt.get("vm") in ("kvm", "qemu")
        else (f"a {virt.get('vm')} guest" if virt.get("is_vm") else "bare metal or an undetected hypervisor"),
    )  # fmt: skip
    c.statuses = c.p2p.get("statuses") or []
    c.link_types = c.topo.get("link_types") or []
    c.profile, derive = next((name, derive) for name, when, derive in PROFILES if when(c))
    derive(c)
    _host_warnings(c)
    c.sources = dict.fromkeys(c.env, "facts")
    _apply_overrides(c, overrides.get("nccl_env"))
    _check_overrides(c)
    return {
        "nccl_env": c.env,
        "sources": c.sources,
        "removed": c.removed,
        "profile": c.profile,
        "reasons": c.reasons,
        "warnings": c.warnings,
        "errors": c.errors,
        "inputs": {
            "gpu_count": c.gpu_count,
            "nnodes": nnodes,
            "link_types": c.link_types,
            "worst_link": c.topo.get("worst_link"),
            "nvlink_all": c.topo.get("nvlink_all"),
            "p2p_statuses": c.statuses,
            "p2p_all_ok": c.p2p.get("all_ok"),
            "virtualization": virt.get("vm"),
        },
    }


# --------------------------------------------------------------------------------------------
# Preflight

# The tables (driver floor per CUDA version, first/last CUDA version per architecture) are data, not
# code: roles/cuda_toolkit/vars/driver_floors.yml (cuda_toolkit_driver_floors, shared with the role that
# installs the toolkit) and this role's defaults (gpu_facts_arch_min_cuda, gpu_facts_arch_max_cuda).


def _vt(text):
    return tuple(int(p) for p in re.findall(r"\d+", str(text or "")))


def gpu_holders(processes):
    """Merge ``gpu_facts.processes`` rows (one per process and GPU) into one entry per PID, GPUs sorted."""
    by_pid = {}
    for p in processes:
        entry = by_pid.setdefault(
            p.get("pid"),
            {
                "pid": p.get("pid"),
                "name": p.get("name"),
                "user": p.get("user"),
                "uid": p.get("uid"),
                "cmdline": p.get("cmdline") or "",
                "unit": p.get("unit"),
                # rows gathered before this field existed (fact cache) count as alive
                "alive": p.get("alive", True),
                "gpus": [],
                "mib": 0,
            },
        )
        if p.get("gpu_index") is not None and p.get("gpu_index") not in entry["gpus"]:
            entry["gpus"].append(p.get("gpu_index"))
        entry["mib"] += int(p.get("used_memory_mib") or 0)
    holders = list(by_pid.values())
    for h in holders:
        h["gpus"].sort()
    return sorted(holders, key=lambda h: (h["pid"] is None, h["pid"] or 0))


def describe_holder(h):
    """``pid 4242 python3, user intruder, command '...', on GPU0,GPU1 using 40000 MiB (unit x.service)``."""
    gpus = ",".join(f"GPU{g}" for g in h["gpus"]) or "an unknown GPU"
    if not h["alive"]:
        return (
            f"pid {h['pid']} {h['name'] or '?'} on {gpus} using {h['mib']} MiB (process gone: memory not "
            "released yet, or leaked)"
        )
    user = h["user"] if h["user"] is not None else "unknown"
    command = f", command `{h['cmdline']}`" if h["cmdline"] else ""
    where = f"on {gpus} using {h['mib']} MiB (unit {h['unit'] or 'none'})"
    return f"pid {h['pid']} {h['name'] or '?'}, user {user}{command}, {where}"


def _problem(host, check, message, fact, variable, fix):
    return {
        "host": host,
        "check": check,
        "message": message,
        "fact": fact,
        "variable": variable,
        "fix": fix,
        "text": f"{host}: {message} [fact: {fact}; variable: {variable}; fix: {fix}]",
    }


def _check_driver(c):
    """The driver loads and is new enough for the CUDA to be installed (False: stop, nothing else can be read)."""
    host, facts, errors, summary, cuda, floors, driver = (
        c.host,
        c.facts,
        c.errors,
        c.summary,
        c.cuda,
        c.floors,
        c.driver,
    )
    if not facts.get("driver_loaded", True):
        errors.append(
            _problem(
                host,
                "driver",
                f"no working NVIDIA driver: {facts.get('error', 'nvidia-smi failed')}",
                "gpu_facts.driver_loaded=false",
                "(none: the host needs a driver)",
                "install and load the NVIDIA driver (a reboot after installing), then rerun the preflight",
            )
        )
        return False
    floor = floors.get(cuda)
    if floor is None:
        errors.append(
            _problem(
                host,
                "driver",
                f"no known driver floor for CUDA {cuda}",
                f"gpu_facts.driver_version={driver}",
                "cuda_toolkit_version",
                f"use one of {', '.join(sorted(floors, key=_vt))} or add it to cuda_toolkit_driver_floors "
                "(roles/cuda_toolkit/vars/driver_floors.yml)",
            )
        )
    elif _vt(driver) < _vt(floor):
        errors.append(
            _problem(
                host,
                "driver",
                f"driver {driver} is too old for CUDA {cuda} (needs >= {floor})",
                f"gpu_facts.driver_version={driver}",
                f"cuda_toolkit_version={cuda}",
                f"upgrade the NVIDIA driver on {host} to >= {floor}, or pin an older CUDA in cuda_toolkit_version",
            )
        )
    summary["driver_floor"] = floor
    return True


def _check_arch(c):
    """Every GPU architecture is supported by the CUDA to be installed."""
    host, errors, warnings, archs, cuda, arch_min, arch_max = (
        c.host,
        c.errors,
        c.warnings,
        c.archs,
        c.cuda,
        c.arch_min,
        c.arch_max,
    )
    for arch in archs:
        lo, hi = arch_min.get(arch), arch_max.get(arch)
        if lo is None:
            warnings.append(
                _problem(
                    host,
                    "arch",
                    f"architecture {arch} is not in the support table",
                    f"gpu_facts.archs={archs}",
                    "gpu_facts_arch_min_cuda",
                    f"add {arch} with its first CUDA version to gpu_facts_arch_min_cuda",
                )
            )
        elif _vt(cuda) < _vt(lo):
            errors.append(
                _problem(
                    host,
                    "arch",
                    f"{arch} needs CUDA >= {lo}, but CUDA {cuda} is to be installed",
                    f"gpu_facts.archs={archs}",
                    f"cuda_toolkit_version={cuda}",
                    f"set cuda_toolkit_version to {lo} or newer (and a driver that supports it)",
                )
            )
        if hi is not None and _vt(cuda) > _vt(hi):
            errors.append(
                _problem(
                    host,
                    "arch",
                    f"CUDA {cuda} no longer supports {arch} (last: {hi})",
                    f"gpu_facts.archs={archs}",
                    f"cuda_toolkit_version={cuda}",
                    f"set cuda_toolkit_version to {hi} or older",
                )
            )


def _check_gpus_idle(c):
    """The GPUs are idle or held only by our own service units."""
    host, facts, s, errors, warnings, summary = (c.host, c.facts, c.s, c.errors, c.warnings, c.summary)
    own = set(s.get("own_units") or [])
    idle_mib = int(s.get("idle_memory_mib", 512))
    # The server stage frees leaked memory itself when the user enabled a remedy (sglang_server_held_memory_*):
    # memory of gone processes or of no process is then left to it (a warning), a live foreign process is not.
    remedy = s.get("leaked_memory_remedy") or ""
    leaks = warnings if remedy else errors
    left_to_remedy = f". Left to the server stage's remedy ({remedy}), which frees it after the stop" if remedy else ""
    processes = facts.get("processes") or []
    foreign = [p for p in processes if p.get("unit") not in own or not own]
    ours = [p for p in processes if own and p.get("unit") in own]
    summary["own_processes"] = [f"{p.get('pid')} {p.get('name')} ({p.get('unit')})" for p in ours]
    if remedy:
        gone = gpu_holders([p for p in foreign if not p.get("alive", True)])
        foreign = [p for p in foreign if p.get("alive", True)]
        if gone:
            leaks.append(
                _problem(
                    host,
                    "gpus_leaked",
                    "GPU memory of processes that are gone: "
                    + "; ".join(describe_holder(h) for h in gone[:8])
                    + left_to_remedy,
                    f"gpu_facts.processes ({len(gone)} gone process(es))",
                    f"gpu_facts_leaked_memory_remedy={remedy}",
                    "nothing: the remedy runs when the server stops; disable it to be refused here instead",
                )
            )
    if foreign:
        holders = gpu_holders(foreign)
        listed = "; ".join(describe_holder(h) for h in holders[:8])
        if len(holders) > 8:
            listed += f"; and {len(holders) - 8} more"
        errors.append(
            _problem(
                host,
                "gpus_busy",
                f"GPUs are held by processes that are not the SGLang service: {listed}. Nothing was changed or "
                "stopped on this host",
                f"gpu_facts.processes ({len(holders)} foreign process(es))",
                f"gpu_facts_own_service_units={sorted(own)}",
                holders_remedy(holders) + "; a holder in another gpufleet server's unit (one deployed under an earlier "
                "sglang_server_service_name) is stopped with systemctl disable --now <that unit>",
            )
        )
    with_process = {p.get("gpu_index") for p in processes}
    for gpu in facts.get("gpus") or []:
        used = gpu.get("memory_used_mib") or 0
        if used > idle_mib and gpu.get("index") not in with_process:
            leaks.append(
                _problem(
                    host,
                    "gpus_busy",
                    f"GPU{gpu.get('index')} has {used} MiB in use but no compute process is listed "
                    "(leaked memory, or a process outside this VM's view)" + left_to_remedy,
                    f"gpu_facts.gpus[{gpu.get('index')}].memory_used_mib={used}",
                    f"gpu_facts_leaked_memory_remedy={remedy}" if remedy else f"gpu_facts_idle_memory_mib={idle_mib}",
                    "find and stop the holder; if none exists, reset the GPU or reboot the VM "
                    "(sglang_server_held_memory_gpu_reset=true or sglang_server_held_memory_reboot=true does it)",
                )
            )


def _check_disk(c):
    """Every path of disk_requirements has the free space it needs."""
    host, facts, s, errors, warnings = (c.host, c.facts, c.s, c.errors, c.warnings)
    disk = {d.get("path"): d for d in facts.get("disk") or []}
    for req in s.get("disk_requirements") or []:
        path, need = req.get("path"), float(req.get("min_free_gib", 0))
        entry = disk.get(path)
        if entry is None or entry.get("free_mib") is None:
            warnings.append(
                _problem(
                    host,
                    "disk",
                    f"free space of {path} was not measured",
                    "gpu_facts.disk",
                    "gpu_facts_disk_requirements",
                    "rerun the gpu_facts role (it measures every path in gpu_facts_disk_requirements)",
                )
            )
            continue
        free_gib = entry["free_mib"] / 1024
        if free_gib < need:
            errors.append(
                _problem(
                    host,
                    "disk",
                    f"{path} ({req.get('purpose', 'data')}) needs {need:g} GiB free, "
                    f"{entry.get('checked_path')} has {free_gib:.1f} GiB",
                    f"gpu_facts.disk[{path}].free_mib={entry['free_mib']}",
                    "gpu_facts_disk_requirements",
                    f"free or add {need - free_gib:.1f} GiB on {entry.get('checked_path')}, or point it elsewhere",
                )
            )


def _check_comm(c):
    """The derived communication settings' errors and warnings, as problems."""
    host, facts, s, errors, warnings = (c.host, c.facts, c.s, c.errors, c.warnings)
    comm = s.get("comm") or {}
    for text in comm.get("errors") or []:
        errors.append(
            _problem(
                host,
                "nccl_env",
                text,
                f"gpu_facts.p2p.statuses={(facts.get('p2p') or {}).get('statuses')}",
                "gpu_facts_nccl_env_overrides",
                "remove the override",
            )
        )
    for text in comm.get("warnings") or []:
        warnings.append(
            _problem(
                host,
                "nccl_env",
                text,
                f"gpu_facts_comm.profile={comm.get('profile')}",
                "gpu_facts_nccl_env_overrides",
                "review; see docs/gpu-facts.md",
            )
        )


# The checks after the driver's, in the order their problems are listed.
PREFLIGHT_CHECKS = (_check_arch, _check_gpus_idle, _check_disk, _check_comm)


def gpu_preflight_problems(facts, settings):
    """Return ``{"errors": [problem], "warnings": [problem], "summary": {...}}`` for one host.

    ``settings`` keys: host, cuda_version, cuda_driver_floors, arch_min_cuda, arch_max_cuda,
    own_units, idle_memory_mib,
    disk_requirements ([{path, min_free_gib, purpose}]), comm (gpu_comm_settings output).
    Every problem names the host, the fact, the variable and the fix (``text`` joins them).
    """
    _require_facts(facts)
    s = settings or {}
    host = s.get("host", "this host")
    errors, warnings = [], []
    gpu_count = int(facts.get("gpu_count") or 0)
    archs = facts.get("archs") or []
    cuda = str(s.get("cuda_version", "12.8"))
    missing = [k for k in ("cuda_driver_floors", "arch_min_cuda", "arch_max_cuda") if k not in s]
    if missing:
        raise ValueError(f"gpu_preflight_problems needs the settings {', '.join(missing)}")
    floors = s["cuda_driver_floors"]
    arch_min = s["arch_min_cuda"]
    arch_max = s["arch_max_cuda"]
    driver = facts.get("driver_version")
    summary = {"host": host, "cuda_version": cuda, "driver_version": driver, "gpu_count": gpu_count}
    c = SimpleNamespace(
        host=host, facts=facts, s=s, errors=errors, warnings=warnings, summary=summary, gpu_count=gpu_count,
        archs=archs, cuda=cuda, floors=floors, arch_min=arch_min, arch_max=arch_max, driver=driver,
    )  # fmt: skip
    if _check_driver(c):
        for check in PREFLIGHT_CHECKS:
            check(c)
    return {"errors": errors, "warnings": warnings, "summary": summary}


class FilterModule:
    """gpu_facts filters."""

    def filters(self):
        return {"gpu_comm_settings": _wrap(gpu_comm_settings), "gpu_preflight_problems": _wrap(gpu_preflight_problems)}


def _wrap(func):
    return as_filter_error(func, GpuFactsFilterError)
