"""Host-side helpers of the sglang_server modules: systemd unit state, the unit's processes (by cgroup),
the journal of one start (invocation), GPU compute processes and memory (nvidia-smi), TCP listeners
(ss), HTTP calls to the server, and the account of a stop's drain (requests in flight, requests cut).
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from ansible_collections.gpufleet.fleet.plugins.module_utils.procfs import (  # noqa: F401  (the modules' API)
    CMDLINE_MAX,
    pid_alive,
    pid_cmdline,
    pid_unit,
    pid_user,
    redact_cmdline,
    unit_pids,
    user_name,
)


def write_root_file(path: str, data: bytes, mode: int) -> None:
    """Write data to path atomically: a temporary file in the same folder, root-owned with mode, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".gpufleet-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.chown(tmp, 0, 0)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


UNIT_PROPS = (
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "ExecMainPID",
    "NRestarts",
    "InvocationID",
    "ExecMainStartTimestamp",
    "ExecMainStartTimestampMonotonic",
    "ExecMainStatus",
    "ExecMainCode",
    "LoadState",
    "FragmentPath",
)

# SGLang's start-up log lines -> phase (the last one seen is the current phase).
PHASES = (
    ("starting", re.compile(r"Uvicorn running on|server_args=|Started server process")),
    ("loading weights", re.compile(r"Load weight begin")),
    ("weights loaded", re.compile(r"Load weight end")),
    ("KV cache allocated", re.compile(r"KV Cache is allocated")),
    ("capturing CUDA graphs", re.compile(r"Capture cuda graph begin")),
    ("CUDA graphs captured", re.compile(r"Capture cuda graph end")),
    ("warming up", re.compile(r"Start of (?:co-?)?locate warmup|warmup request|End of prefill disaggregation")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
    ("draining", re.compile(r"Draining requests and shutting down|Gracefully exiting")),
)


def run(argv, timeout=60):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s: {' '.join(argv)}"
    return proc.returncode, proc.stdout, proc.stderr


def unit_state(unit, runner=run):
    rc, out, err = runner(["systemctl", "show", unit, "--property=" + ",".join(UNIT_PROPS)])
    props = show_properties(out)
    state = {
        "unit": unit,
        "load_state": props.get("LoadState", ""),
        "active_state": props.get("ActiveState", "unknown"),
        "sub_state": props.get("SubState", ""),
        "result": props.get("Result", ""),
        "main_pid": int(props.get("MainPID") or 0),
        # the start's main process, kept after it exited (MainPID is 0 then): its stdout lines carry it as _PID
        "exec_main_pid": int(props.get("ExecMainPID") or 0),
        "n_restarts": int(props.get("NRestarts") or 0),
        "invocation_id": props.get("InvocationID", ""),
        "exec_main_start": props.get("ExecMainStartTimestamp", ""),
        "exec_main_start_monotonic_us": int(props.get("ExecMainStartTimestampMonotonic") or 0),
        "exec_main_status": props.get("ExecMainStatus", ""),
        "exec_main_code": props.get("ExecMainCode", ""),
        "fragment_path": props.get("FragmentPath", ""),
    }
    if rc != 0:
        state["error"] = err.strip()
    return state


def show_properties(out):
    """``{key: value}`` of ``systemctl show`` output; a key shown on several lines (EnvironmentFiles, ExecStart with
    more than one command) keeps every line, joined by newlines."""
    props = {}
    for line in str(out or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key] = f"{props[key]}\n{value}" if key in props else value
    return props


def env_readback(props, environ=None, prefix="NCCL_"):
    """The ``prefix`` variables the server really runs with, read back, never recomputed.

    ``environ``: the bytes of ``/proc/<MainPID>/environ`` (source ``process``); without them the unit's
    ``Environment=`` from ``systemctl show`` (source ``unit``). Only ``prefix`` names are kept: the process
    environment also holds the secrets of the EnvironmentFile, and they never leave the host.
    """
    import shlex  # noqa: PLC0415

    if environ:
        items = environ.decode("utf-8", "replace").split("\0")
        source = "process"
    elif "Environment" in props:
        try:
            items = shlex.split(props["Environment"])
        except ValueError:
            items = props["Environment"].split()
        source = "unit"
    else:
        items, source = [], "none"
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key.startswith(prefix):
            env[key] = value
    try:
        main_pid = int(props.get("MainPID") or 0)
    except ValueError:
        main_pid = 0
    return {"source": source, "main_pid": main_pid, "nccl_env": dict(sorted(env.items()))}


def read_manifest(path: str) -> dict:
    """A kept version's manifest (JSON object), {} when the path is empty, missing or not a JSON object."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def readback(unit: str, manifest: str, prefix: str = "NCCL_", runner=run, proc_root: str = "/proc") -> dict:
    """What the deploy report reads back from the host (sglang_server_readback, and sglang_server_last_good right
    after a save): the unit's main process, the ``prefix`` variables it runs with (env_readback) and the manifest."""
    _rc, out, _err = runner(["systemctl", "show", "--property=MainPID", "--property=Environment", unit])
    props = show_properties(out)
    environ = None
    pid = env_readback(props)["main_pid"]
    if pid > 0:
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            environ = None
    return {**env_readback(props, environ, prefix), "manifest": read_manifest(manifest)}


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


def _since(value) -> str:
    """journalctl --since: an epoch as ``@N``; a systemd timestamp (``ExecMainStartTimestamp``) as it is."""
    return f"--since=@{int(value)}" if isinstance(value, (int, float)) else f"--since={value}"


def journal_match(unit, invocation_id=None, main_pid=0, since=None, unit_since=None):
    """journalctl matches for the lines of one start of the unit.

    Its InvocationID, or else the unit since ``unit_since`` (else this boot); and, OR-ed in, its main process
    (``_PID`` since ``since``, the start). journald attributes a stdout line to the unit and invocation by
    reading the writer's cgroup from /proc when it handles the line; a process that crashes at once (a CUDA
    init failure) has often exited by then, and its last lines carry ``_PID`` but no
    ``_SYSTEMD_UNIT``/``_SYSTEMD_INVOCATION_ID`` (systemd issue 2913; systemd PR 33021 stops using
    ``journalctl -u`` for such lines). Used by the modules (journal_lines) and, as the filter
    sglang_journal_match, by the rollback's journal excerpt."""
    if invocation_id:
        match = [f"_SYSTEMD_INVOCATION_ID={invocation_id}"]
    else:
        match = ["-u", unit] + ([_since(unit_since)] if unit_since else ["-b"])
    if int(main_pid or 0) and since:
        match += ["+", f"_PID={int(main_pid)}", _since(since)]
    return match


def journal_lines(unit, invocation_id=None, runner=run, lines=None, main_pid=0, since=None):
    """``[(epoch_seconds, message)]`` of one start of the unit (journal_match), oldest first."""
    argv = ["journalctl", "--no-pager", "-o", "json"] + journal_match(unit, invocation_id, main_pid, since)
    if lines:
        argv += ["-n", str(int(lines))]
    rc, out, _err = runner(argv, timeout=60)
    result = []
    if rc != 0:
        return result
    for line in out.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        msg = rec.get("MESSAGE", "")
        if isinstance(msg, list):  # binary message: journald gives bytes
            msg = bytes(msg).decode("utf-8", "replace")
        ts = int(rec.get("__REALTIME_TIMESTAMP", "0")) / 1e6
        result.append((ts, msg or ""))
    return result


def phase_timeline(entries):
    """``[{"phase", "at"}]``: the first time each phase's log line appeared (journal order)."""
    seen, timeline = set(), []
    for ts, msg in entries:
        for phase, rx in PHASES:
            if phase not in seen and rx.search(msg):
                seen.add(phase)
                timeline.append({"phase": phase, "at": ts})
    return timeline


def current_phase(timeline):
    return timeline[-1]["phase"] if timeline else "process started"


def monotonic_us():
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def http(method, url, body=None, headers=None, timeout=30):
    """``(status, body_text, seconds)``; status 0 with the error text when there is no HTTP answer."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
            return resp.status, text, time.monotonic() - started
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace") if exc.fp else ""
        return exc.code, text, time.monotonic() - started
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, str(reason), time.monotonic() - started


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


def read_env_file(path):
    """KEY="value" lines of a systemd EnvironmentFile written by the role (backslash escapes)."""
    values = {}
    if not path:
        return values
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return values
    for line in lines:
        m = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*$', line)
        if m:
            values[m.group(1)] = re.sub(r"\\(.)", r"\1", m.group(2))
    return values


def _metric_sum(text, name):
    total, seen = 0.0, False
    for line in text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", line)
        if m:
            total += float(m.group(1))
            seen = True
    return int(total) if seen else None


def engine_load(base_url, headers=None, timeout=5, http_get=None):
    """Requests the engine holds right now (running + waiting over every DP rank), from SGLang 0.5.9's
    ``GET /v1/loads?include=core`` (``aggregate.total_reqs``; no flag needed), else from ``/metrics``
    (``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``; needs ``--enable-metrics``).
    ``{"in_flight", "running", "waiting", "source"}``; ``in_flight`` None with ``error`` when neither answers."""
    get = http_get or (lambda url: http("GET", url, headers=headers, timeout=timeout))
    errors = []
    status, body, _ = get(base_url.rstrip("/") + "/v1/loads?include=core")
    if status == 200:
        try:
            agg = json.loads(body)["aggregate"]
            running, waiting = int(agg["total_running_reqs"]), int(agg["total_waiting_reqs"])
            return {"in_flight": running + waiting, "running": running, "waiting": waiting, "source": "/v1/loads"}
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"/v1/loads: unexpected answer ({exc})")
    else:
        errors.append(f"/v1/loads: HTTP {status} {body.strip()[:120]}")
    status, body, _ = get(base_url.rstrip("/") + "/metrics")
    if status == 200:
        running = _metric_sum(body, "sglang:num_running_reqs")
        waiting = _metric_sum(body, "sglang:num_queue_reqs")
        if running is not None:
            return {"in_flight": running + (waiting or 0), "running": running, "waiting": waiting or 0,
                    "source": "/metrics"}  # fmt: skip
        errors.append("/metrics: no sglang:num_running_reqs")
    else:
        errors.append(f"/metrics: HTTP {status} {body.strip()[:120]}")
    return {"in_flight": None, "running": None, "waiting": None, "source": None, "error": "; ".join(errors)}


# SGLang 0.5.9 TokenizerManager.sigterm_watchdog, every 5 s after SIGTERM until no request remains.
DRAIN_RX = re.compile(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)")
FORCED_RX = re.compile(r"Signal SIGTERM received while (?:force shutdown flag set|health check failed)\. Force exiting")


def drain_account(in_flight_at_stop, entries, stop_state, was_active=True):
    """How a stop went for the requests: in flight at the stop, the drain's own count, how many were cut.

    ``entries``: journal ``[(ts, msg)]`` of the stopped invocation; ``stop_state``: ``unit_state`` after the
    stop. Cut requests are those still open when the server went away: the last count of the drain when
    systemd killed it (Result=timeout: "State 'stop-sigterm' timed out. Killing.") or when it ended without
    finishing the drain; every request in flight when the engine ended without draining at all (SIGTERM
    before its drain handler existed, SGL_FORCE_SHUTDOWN, a failed health check)."""
    remaining = [int(m.group(1)) for _, msg in entries for m in [DRAIN_RX.search(msg or "")] if m]
    forced = any(FORCED_RX.search(msg or "") for _, msg in entries)
    result = stop_state.get("result", "")
    account = {
        "in_flight_at_stop": in_flight_at_stop,
        "drain_remaining": remaining,
        "stop_result": result,
        "exit": {"code": stop_state.get("exec_main_code", ""), "status": stop_state.get("exec_main_status", "")},
        "cut": None,
    }
    if not was_active:
        account.update(in_flight_at_stop=0, cut=0, how="the server was not running")
    elif result == "timeout":
        cut = remaining[-1] if remaining else in_flight_at_stop
        account.update(cut=cut, how="TimeoutStopSec ran out: systemd killed the server (stop-sigterm timed out)")
    elif forced:
        account.update(cut=in_flight_at_stop, how="the engine force-exited without draining")
    elif remaining and remaining[-1] == 0:
        account.update(cut=0, how="drained: every request finished before the engine exited")
    elif remaining:
        account.update(cut=remaining[-1], how="the engine ended while requests remained")
    else:
        account.update(cut=in_flight_at_stop, how="the engine ended without a drain (no 'Gracefully exiting' line)")
    return account


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


def record_stop(manifests, unit_sha256, released, held, at, waited_s):
    """Write the outcome of a stop into the kept versions' manifests whose unit is the one stopped:
    ``stopped_cleanly`` true (every GPU released), false (memory stayed held by what it left behind).
    Returns the paths written."""
    written = []
    if not unit_sha256:
        return written
    for path in manifests:
        try:
            with open(path, encoding="utf-8") as fh:
                manifest = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(manifest, dict) or manifest.get("unit_sha256") != unit_sha256:
            continue
        clean = bool(released) or not (held or {}).get("caused_by_stop", True)
        if manifest.get("stopped_cleanly") is False and clean:
            clean = False  # once seen to leak, always a leaker (never a rollback target again)
        manifest["stopped_cleanly"] = clean
        manifest["last_stop"] = {
            "at": at,
            "released": bool(released),
            "waited_s": waited_s,
            "held": (held or {}).get("text", ""),
        }
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=4, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        written.append(path)
    return written
