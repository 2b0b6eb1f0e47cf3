"""What holds the SGLang server's GPUs and port: GPU compute processes and memory (nvidia-smi), ours (in the
unit's cgroup) or foreign, TCP listeners (ss), the snapshot of all of it and the wait for a stop to release the
GPUs, and the words for holders (who they are, what to do, what a stop left behind).
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import re
import time

from ansible_collections.gpufleet.fleet.plugins.module_utils.procfs import (
    pid_alive,
    pid_cmdline,
    pid_unit,
    pid_user,
    unit_pids,
    user_name,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import unit_state


def _csv(out):
    rows = []
    for line in out.splitlines():
        if line.strip():
            rows.append([c.strip() for c in line.split(",")])
    return rows


def gpu_state(nvidia_smi="nvidia-smi", runner=run):
    """``{"gpus": {index: {"uuid", "memory_used_mib"}}, "processes": [{pid, gpu_index, used_memory_mib, name}]}``."""
    rc, out, err = runner(
        [nvidia_smi, "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"], timeout=30
    )
    if rc != 0:
        raise RuntimeError(f"nvidia-smi --query-gpu failed (rc {rc}): {(err or out).strip()}")
    gpus, by_uuid = {}, {}
    for row in _csv(out):
        if len(row) < 3:
            continue
        idx = int(row[0])
        used = int(float(row[2])) if re.match(r"^[0-9.]+$", row[2]) else 0
        gpus[idx] = {"uuid": row[1], "memory_used_mib": used}
        by_uuid[row[1]] = idx
    rc, out, err = runner(
        [nvidia_smi, "--query-compute-apps=pid,gpu_uuid,used_memory,process_name", "--format=csv,noheader,nounits"],
        timeout=30,
    )
    if rc != 0:
        raise RuntimeError(f"nvidia-smi --query-compute-apps failed (rc {rc}): {(err or out).strip()}")
    processes = []
    for row in _csv(out):
        if len(row) < 3 or not row[0].isdigit():
            continue
        used = int(float(row[2])) if re.match(r"^[0-9.]+$", row[2]) else 0
        processes.append(
            {
                "pid": int(row[0]),
                "gpu_index": by_uuid.get(row[1]),
                "used_memory_mib": used,
                "name": row[3] if len(row) > 3 else "",
            }
        )
    return {"gpus": gpus, "processes": processes}


def classify_gpu_processes(processes, unit, gpus=None, proc_root="/proc", name_of=user_name):
    """Split GPU compute processes on the given GPUs into ours (in the unit's cgroup) and foreign.

    A process that no longer exists but still holds memory (a leaked allocation) is foreign: it is
    not ours to stop, and only a GPU reset or the end of that process frees it.
    """
    ours, foreign = [], []
    wanted = None if gpus is None else {int(g) for g in gpus}
    for proc in processes:
        if wanted is not None and proc.get("gpu_index") not in wanted:
            continue
        pid = proc["pid"]
        alive = pid_alive(pid, proc_root)
        owner = pid_unit(pid, proc_root) if alive else None
        uid, user = pid_user(pid, proc_root, name_of) if alive else (None, None)
        item = dict(
            proc, alive=alive, unit=owner, uid=uid, user=user, cmdline=pid_cmdline(pid, proc_root) if alive else ""
        )
        if alive and owner == unit:
            ours.append(item)
        else:
            foreign.append(item)
    return ours, foreign


def describe_processes(items):
    """One clause per PID, merged over its GPUs.

    Alive: ``pid 4242 (/usr/bin/python3, user intruder, command '/usr/bin/python3 x.py', GPUs 0,1, 40000 MiB,
    unit none)``; gone: ``pid 123 (sglang::scheduler_TP0, GPUs 0, 88000 MiB, process gone: leaked allocation)``.
    """
    by_pid = {}
    for it in items:
        entry = by_pid.setdefault(
            it["pid"],
            {
                "name": it.get("name"),
                "gpus": [],
                "mib": 0,
                "alive": it.get("alive"),
                "unit": it.get("unit"),
                "user": it.get("user"),
                "cmdline": it.get("cmdline") or "",
            },
        )
        entry["gpus"].append(it.get("gpu_index"))
        entry["mib"] += int(it.get("used_memory_mib") or 0)
    parts = []
    for pid, e in sorted(by_pid.items()):
        gpus = ",".join(str(g) for g in sorted(g for g in e["gpus"] if g is not None))
        if not e["alive"]:
            parts.append(
                f"pid {pid} ({e['name'] or '?'}, GPUs {gpus}, {e['mib']} MiB, process gone: leaked allocation)"
            )
            continue
        who = f", user {e['user'] if e['user'] is not None else 'unknown'}"
        command = f", command `{e['cmdline']}`" if e["cmdline"] else ""
        parts.append(
            f"pid {pid} ({e['name'] or '?'}{who}{command}, GPUs {gpus}, {e['mib']} MiB, unit {e['unit'] or 'none'})"
        )
    return "; ".join(parts)


# Said when a holder runs inside a systemd service: it may be that service's own process (stopping the
# service is then the fix) or a stray child of an unrelated one (an ssh login on a host without logind
# sessions), so no service is named for stopping.
RESTARTED_BY_UNIT = (
    "; a holder that comes back after the kill is restarted by its service (unit above): stop that service "
    "if it is the holder's own"
)


def holders_remedy(items):
    """What to do about each foreign holder, in words (who to ask, what to stop, what a leak needs)."""
    seen, steps, in_service = set(), [], False
    for it in sorted(items, key=lambda x: x["pid"]):
        if it["pid"] in seen:
            continue
        seen.add(it["pid"])
        if not it.get("alive"):
            steps.append(
                f"pid {it['pid']} is gone but its memory is still in use: a dying process frees it within about "
                "0.3 s, so wait and deploy again; if it stays, it is a leaked allocation that only a GPU reset "
                "(nvidia-smi --gpu-reset) or a reboot frees"
            )
            continue
        unit = it.get("unit") or ""
        how = f"kill {it['pid']}"
        in_service = in_service or unit.endswith(".service")
        user = it.get("user")
        who = f"ask user {user} to end it or, as root, " if user not in (None, "root") else "as root, "
        steps.append(f"pid {it['pid']}: {who}{how}")
    if not steps:
        return ""
    return (
        "; ".join(steps)
        + "; then check that `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` no longer lists it"
        " and deploy again" + (RESTARTED_BY_UNIT if in_service else "")
    )


def listeners(port, runner=run):
    """PIDs listening on a TCP port (``ss -ltnpH``); an entry without a PID is a listener we cannot name."""
    rc, out, _err = runner(["ss", "-ltnpH", f"sport = :{int(port)}"])
    result = []
    if rc != 0:
        return result
    for line in out.splitlines():
        if not line.strip():
            continue
        cols = line.split()
        local = cols[3] if len(cols) > 3 else ""
        pids = [int(p) for p in re.findall(r"pid=(\d+)", line)]
        result.append({"local": local, "pids": sorted(set(pids))})
    return result


def snapshot(unit, gpus=None, port=0, idle_memory_mib=512, nvidia_smi="nvidia-smi"):
    """Unit state, its processes, the holders of its GPUs (ours/foreign) and of its port; ``released``."""
    gs = gpu_state(nvidia_smi)
    gpus = list(gpus or []) or sorted(gs["gpus"])
    ours, foreign = classify_gpu_processes(gs["processes"], unit, gpus)
    used = {str(i): gs["gpus"].get(i, {}).get("memory_used_mib", 0) for i in gpus}
    pids = unit_pids(unit)
    result = {
        "unit": unit_state(unit),
        "unit_pids": pids,
        "gpus": gpus,
        "gpu_memory_used_mib": used,
        "gpu_ours": ours,
        "gpu_foreign": foreign,
        "gpu_foreign_text": describe_processes(foreign),
        "gpu_foreign_remedy": holders_remedy(foreign),
        "released": not pids and not ours and all(v <= idle_memory_mib for v in used.values()),
    }
    lst, port_foreign = [], []
    if port:
        for entry in listeners(port):
            owners = [pid_unit(pid) for pid in entry["pids"]]
            entry["ours"] = bool(entry["pids"]) and all(o == unit for o in owners)
            entry["units"] = owners
            lst.append(entry)
            if not entry["ours"]:
                port_foreign.append(entry)
    result["listeners"] = lst
    result["port_foreign"] = port_foreign
    return result


def wait_released(unit, gpus, timeout, idle_memory_mib=512, poll=0.2, nvidia_smi="nvidia-smi"):
    """Poll until the unit has no process and its GPUs' memory is released; (snapshot, seconds waited)."""
    started = time.monotonic()
    snap = snapshot(unit, gpus, 0, idle_memory_mib, nvidia_smi)
    while not snap["released"] and time.monotonic() - started < timeout:
        time.sleep(poll)
        snap = snapshot(unit, gpus, 0, idle_memory_mib, nvidia_smi)
    return snap, round(time.monotonic() - started, 3)


def not_released_message(snap, unit, waited, idle_memory_mib):
    holders = snap["gpu_ours"] + snap["gpu_foreign"]
    parts = []
    if snap["unit_pids"]:
        parts.append(f"processes still in {unit}: {snap['unit_pids']}")
    if holders:
        parts.append("GPU memory held by " + describe_processes(holders))
    busy = {k: v for k, v in snap["gpu_memory_used_mib"].items() if v > idle_memory_mib}
    if busy and not holders:
        parts.append(f"GPU memory used with no process listed: {busy} MiB")
    return (
        f"GPU memory not released {waited:.1f} s after stopping {unit}: "
        + "; ".join(parts)
        + ". A process that is gone but still holds memory (leaked allocation) is freed only by a GPU "
        "reset or a reboot; a live one must be stopped (it is not part of the unit)."
    )


def held_memory(snap, idle_memory_mib=512, before=None):
    """What holds the server's GPUs after a stop: ``{gpus, live_pids, gone_pids, no_process_gpus, text,
    caused_by_stop}``.

    ``text`` names each GPU's holders (PID, user, command line for a live one; "process gone: leaked
    allocation" for a PID that is gone) and, for a GPU whose memory is used with no process listed,
    "no process: memory held by the driver". ``before`` (a snapshot taken before the stop) tells memory
    the stopped version left behind (``caused_by_stop``) from memory that was already held by others."""
    holders = snap["gpu_ours"] + snap["gpu_foreign"]
    used = {int(k): int(v) for k, v in snap["gpu_memory_used_mib"].items()}
    busy = {g: v for g, v in used.items() if v > idle_memory_mib}
    listed = {h.get("gpu_index") for h in holders}
    no_process = sorted(g for g in busy if g not in listed)
    live = sorted({h["pid"] for h in holders if h.get("alive")} | set(snap.get("unit_pids") or []))
    gone = sorted({h["pid"] for h in holders if not h.get("alive")})
    parts = []
    if snap.get("unit_pids"):
        parts.append(f"processes still in the unit: {', '.join(str(p) for p in snap['unit_pids'])}")
    if holders:
        parts.append(describe_processes(holders))
    parts += [f"GPU {g}: {busy[g]} MiB used, no process: memory held by the driver" for g in no_process]
    caused = True
    if before is not None:
        pre_pids = {h["pid"] for h in before.get("gpu_foreign") or []}
        pre_used = {int(k): int(v) for k, v in (before.get("gpu_memory_used_mib") or {}).items()}
        pre_listed = {h.get("gpu_index") for h in (before.get("gpu_ours") or []) + (before.get("gpu_foreign") or [])}
        pre_no_process = {g for g, v in pre_used.items() if v > idle_memory_mib and g not in pre_listed}
        caused = (
            bool(snap.get("unit_pids"))
            or any(h["pid"] not in pre_pids for h in holders)
            or bool(set(no_process) - pre_no_process)
        )
    return {
        "gpus": sorted(set(busy) | {g for g in listed if g is not None}),
        "live_pids": live,
        "gone_pids": gone,
        "no_process_gpus": no_process,
        "text": "; ".join(parts),
        "caused_by_stop": caused and bool(busy or holders or snap.get("unit_pids")),
    }
