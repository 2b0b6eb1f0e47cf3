#!/usr/bin/python3
"""gpufleet: liveness of the SGLang server on this host (roles/sglang_server, docs/runbook.md "Liveness").

A unit can stay "active" while its engine no longer generates: its main process stopped (SIGSTOP) or wedged, a
scheduler hung in a collective. `/health` is not the proof the deploy uses; this is: every `interval_s` it asks the
server for a short chat completion, as the deploy's health check does, and counts a failure when no token comes back
within `timeout_s`, unless the engine's count of generated tokens (/metrics) grew meanwhile: then it is busy (a queue
longer than the timeout), not hung. After `failures` failures in a row it keeps an incident bundle (what SGLang's
maintainers ask for in a hung-server report: /get_server_info, /v1/loads, /metrics, the journal since the unit's
start, nvidia-smi -q, the unit, a py-spy stack dump of every process of the unit) and restarts the unit: SIGKILL to
every process of the unit, then `systemctl restart` (a hung engine finishes no in-flight request, so a drain would
only wait out TimeoutStopSec). At most `max_restarts` restarts in `window_s`: then it gives up, says so in the journal
and in the metric gpufleet_liveness_gave_up (alert GpufleetLivenessGaveUp), and leaves the server for a person or the
fleet's remediation. A crash loop does not flap forever.

It does nothing while the unit is not active (stopped by a person or a deploy, or failed: systemd's own Restart= and
StartLimitBurst handle an engine that exits), while the engine starts (until its first good answer, or
`start_grace_s` after the unit's start), while a deploy restarts it (the record of sglang_server_swap's start job,
`job_file`, says it runs) and while one of the `pause_paths` exists (a rollout's lock on this host).
Its state (the restarts in the window, given up) survives its own restart (`state_file`). It uses no fleet key: the
server's own API key is read from the unit's EnvironmentFile at each probe.

  gpufleet_sglang_liveness.py <config.json>            the service: probe for ever
  gpufleet_sglang_liveness.py <config.json> --once     one probe and its decision (prints the state as JSON)

Standard library only (the host's python3).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse

DEFAULTS = {
    "unit": "sglang-server.service",
    "base_url": "http://127.0.0.1:8000",
    "served_name": "default",
    "secrets_file": "",
    "prompt": "Say OK.",
    "max_tokens": 8,
    "interval_s": 5,
    "timeout_s": 10,
    "failures": 3,
    "start_grace_s": 1800,
    "max_restarts": 3,
    "window_s": 3600,
    "pause_paths": [],
    "state_file": "/var/lib/gpufleet/sglang-server/liveness-state.json",
    "job_file": "/var/lib/gpufleet/sglang-server/ready-job.json",
    "metrics_file": "",
    "bundle_dir": "/var/lib/gpufleet/incidents",
    "bundle_keep": 10,
    "bundle_timeout_s": 5,
    "py_spy": "",
}
SECRET_FIELDS = re.compile(r"(api[_-]?key|token|secret|password)", re.I)


def log(message: str) -> None:
    print(f"gpufleet-liveness: {message}", flush=True)


def load_config(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        config = DEFAULTS | json.load(f)
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise SystemExit(f"{path}: unknown settings {unknown}")
    return config


def read_env_value(path: str, name: str) -> str:
    """A value of a systemd EnvironmentFile line NAME="..." as sglang_server writes it (filter env_file_line)."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return ""
    for line in lines:
        if line.startswith(name + "="):
            value = line[len(name) + 1 :]
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            return value
    return ""


# --- the unit ---------------------------------------------------------------------------------------------------


def unit_state(unit: str, runner=subprocess.run) -> dict:
    props = "ActiveState,SubState,InvocationID,ActiveEnterTimestampMonotonic,MainPID,ControlGroup,NRestarts"
    out = runner(["systemctl", "show", unit, "-p", props], capture_output=True, text=True, check=False).stdout
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return state


def unit_age_s(state: dict) -> float:
    """Seconds since the unit became active (CLOCK_MONOTONIC, as systemd keeps it)."""
    entered = int(state.get("ActiveEnterTimestampMonotonic") or 0)
    return max(0.0, time.monotonic() - entered / 1e6) if entered else 0.0


def unit_pids(state: dict) -> list[int]:
    """The processes of the unit: its control group (cgroup v2 at /sys/fs/cgroup; a hybrid host's v2 or name=systemd
    hierarchy), and the main process with its descendants (read from /proc) where no hierarchy answers."""
    group = state.get("ControlGroup") or ""
    pids: set[int] = set()
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        if not group or pids:
            break
        for root, _dirs, files in os.walk(f"{mount}{group}"):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError), open(os.path.join(root, "cgroup.procs"), encoding="ascii") as f:
                    pids |= {int(p) for p in f.read().split() if int(p) > 0}
    main = int(state.get("MainPID") or 0)
    if main > 0 and not pids:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(entry))
        todo = [main]
        while todo:
            pid = todo.pop()
            pids.add(pid)
            todo += children.get(pid, [])
    return sorted(pids)


def deploy_at_work(config: dict, now: float) -> str:
    """The deploy's start job (sglang_server_swap: stop, start, readiness, proof by generation) while it runs: its
    record says started and not finished. A record older than the start grace and an hour: a job that died."""
    path = config["job_file"]
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        age = now - os.stat(path).st_mtime
    except (OSError, ValueError):
        return ""
    running = record.get("started") and not record.get("finished")
    return f"{path} (a deploy's start)" if running and age < float(config["start_grace_s"]) + 3600 else ""


# --- the probe --------------------------------------------------------------------------------------------------


def http_call(base_url: str, method: str, path: str, timeout: float, key: str = "", body: dict | None = None):
    """(status, text) of one request; (0, reason) when it could not be made or timed out."""
    url = urllib.parse.urlsplit(base_url)
    cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = cls(url.hostname, url.port or (443 if url.scheme == "https" else 80), timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(
            method, url.path.rstrip("/") + path, body=None if body is None else json.dumps(body), headers=headers
        )
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    finally:
        conn.close()


def generated_tokens(config: dict, caller=http_call) -> float | None:
    """The engine's work so far: sglang:generation_tokens_total (the tokens of finished requests) plus
    sglang:realtime_tokens_total (prefill and decode tokens, counted by 0.5.9's scheduler at each log interval: every
    --decode-log-interval steps, so long generations that none has finished yet still move it), summed over their
    series (SGLang's metrics, --enable-metrics); None when /metrics does not answer (a stopped main process) or has
    neither counter."""
    key = read_env_value(config["secrets_file"], "SGLANG_SERVER_API_KEY")
    # a server that answers HTTP answers /metrics at once; a stopped main process does not: 2 s at most
    status, text = caller(config["base_url"], "GET", "/metrics", min(2.0, float(config["bundle_timeout_s"])), key)
    if status != 200:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("sglang:generation_tokens_total", "sglang:realtime_tokens_total")) and " " in line
    ]
    return sum(values) if values else None


def probe(config: dict, caller=http_call) -> tuple[bool, str]:
    """A generation: ok when the server answers 200 with at least one completion token within timeout_s."""
    key = read_env_value(config["secrets_file"], "SGLANG_SERVER_API_KEY")
    body = {
        "model": config["served_name"],
        "messages": [{"role": "user", "content": config["prompt"]}],
        "max_tokens": int(config["max_tokens"]),
        "temperature": 0,
    }
    t0 = time.monotonic()
    status, text = caller(config["base_url"], "POST", "/v1/chat/completions", float(config["timeout_s"]), key, body)
    took = time.monotonic() - t0
    if status == 0:
        return False, f"no answer in {took:.1f}s ({text})"
    if status != 200:
        return False, f"HTTP {status} in {took:.1f}s: {text[:200]}"
    try:
        tokens = int(json.loads(text)["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return False, f"an answer that is not a chat completion: {text[:200]}"
    if tokens < 1:
        return False, "an answer with no generated token"
    return True, f"{tokens} token(s) in {took:.1f}s"


# --- the decision -----------------------------------------------------------------------------------------------


def new_state() -> dict:
    return {
        "invocation": "", "failures": 0, "seen_ok": False, "restarts": [], "restarts_total": 0, "gave_up": False,
        "phase": "idle", "last": "", "rounds": 0, "last_round": 0.0, "last_probe": 0.0, "last_ok": 0.0,
        "last_bundle": "", "tokens": None,
    }  # fmt: skip


def decide(state: dict, unit: dict, config: dict, now: float, paused_by: str, probe_fn, tokens_fn=lambda: None) -> str:
    """Update `state` with one round; return the action: 'none' or 'restart'. tokens_fn: the engine's count of
    generated tokens (None: unknown), read after a failed probe: an engine whose count grew is busy, not hung."""
    if paused_by:
        state.update(phase="paused", failures=0, last=f"paused: {paused_by}")
        return "none"
    if unit.get("ActiveState") != "active":
        state.update(phase="inactive", failures=0, last=f"unit {unit.get('ActiveState') or 'unknown'}")
        return "none"
    if unit.get("InvocationID") != state["invocation"]:
        # a new start (by systemd, a deploy or this service): a new chance, and a give-up ends with it
        state.update(invocation=unit.get("InvocationID", ""), failures=0, seen_ok=False, gave_up=False)
    ok, why = probe_fn()
    state.update(last_probe=now, last=why)
    if ok:
        state["tokens"] = None  # counted from the next failure on
        if state["gave_up"] or state["failures"]:
            log(f"{config['unit']} generates again: {why}")
        state.update(phase="ok", failures=0, seen_ok=True, gave_up=False, last_ok=now)
        return "none"
    if not state["seen_ok"] and unit_age_s(unit) < float(config["start_grace_s"]):
        state["phase"] = "starting"
        return "none"
    tokens, before = tokens_fn(), state.get("tokens")
    state["tokens"] = tokens
    if tokens is not None and before is not None and tokens > before:
        # a queue longer than the probe's timeout on an overloaded server: not a reason to kill it
        state.update(
            phase="busy", failures=0, last=f"{why}; busy, not hung: {tokens - before:g} tokens generated meanwhile"
        )
        return "none"
    state["failures"] += 1
    state["phase"] = "failing"
    log(f"{config['unit']}: probe failed ({state['failures']}/{config['failures']}): {why}")
    if state["failures"] < int(config["failures"]):
        return "none"
    state["restarts"] = [t for t in state["restarts"] if now - t < float(config["window_s"])]
    if len(state["restarts"]) >= int(config["max_restarts"]):
        if not state["gave_up"]:
            log(
                f"{config['unit']}: GAVE UP: {len(state['restarts'])} restart(s) in the last {config['window_s']}s "
                f"did not bring a generation back; the unit is left as it is for a person (docs/runbook.md)"
            )
        state.update(phase="gave_up", gave_up=True)
        return "none"
    return "restart"


# --- the incident bundle ----------------------------------------------------------------------------------------


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


def redact_json(value, secrets: list[str]):
    if isinstance(value, dict):
        return {
            k: ("<redacted>" if SECRET_FIELDS.search(k) and v else redact_json(v, secrets)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_json(v, secrets) for v in value]
    if isinstance(value, str):
        return redact(value, secrets)
    return value


def bundle(config: dict, unit: dict, why: str, runner=subprocess.run, caller=http_call) -> str:
    """Collect the incident bundle before the restart; returns its folder."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = config["unit"].removesuffix(".service")
    folder = os.path.join(config["bundle_dir"], f"{stamp}-{name}-liveness")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    secrets = [read_env_value(config["secrets_file"], n) for n in ("SGLANG_SERVER_API_KEY", "HF_TOKEN")]
    key, timeout = secrets[0], float(config["bundle_timeout_s"])
    index = {"unit": config["unit"], "why": why, "time": stamp, "invocation": unit.get("InvocationID", ""), "files": {}}

    def keep(filename: str, text: str, source: str) -> None:
        with open(os.path.join(folder, filename), "w", encoding="utf-8") as f:
            f.write(redact(text, secrets))
        index["files"][filename] = source

    def command(argv: list[str], limit: float) -> str:
        try:
            p = runner(argv, capture_output=True, text=True, timeout=limit, check=False)
            return p.stdout + (f"\n[stderr]\n{p.stderr}" if p.stderr.strip() else "") + f"\n[exit {p.returncode}]\n"
        except FileNotFoundError:
            return f"[{argv[0]} is not installed]\n"
        except subprocess.TimeoutExpired:
            return f"[no end within {limit:.0f}s]\n"

    pages = (("/get_server_info", "server_info.json"), ("/v1/loads", "loads.json"), ("/metrics", "metrics.txt"))
    with concurrent.futures.ThreadPoolExecutor(len(pages)) as pool:  # a hung server: one timeout, not three
        answers = list(pool.map(lambda page: caller(config["base_url"], "GET", page[0], timeout, key), pages))
    for (path, filename), (status, text) in zip(pages, answers, strict=True):
        if status == 200 and filename.endswith(".json"):
            with contextlib.suppress(ValueError):
                text = json.dumps(redact_json(json.loads(text), secrets), indent=1)
        keep(filename, text if status == 200 else f"[{path}: {'HTTP ' + str(status) if status else text}]\n", path)
    pids = unit_pids(unit)
    py_spy = config["py_spy"] if os.path.exists(config["py_spy"] or "/nonexistent") else shutil.which("py-spy") or ""

    def stack(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            return ""
        # --nonblocking: read the stacks without stopping the process (a SIGSTOPped one cannot be attached to)
        dump = (
            command([py_spy, "dump", "--nonblocking", "--pid", str(pid)], 20)
            if py_spy
            else "[py-spy is not installed]\n"
        )
        return f"=== pid {pid}: {cmdline}\n{dump}"

    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(pids)))) as pool:
        dumps = [d for d in pool.map(stack, pids) if d]
    keep("stacks.txt", "\n".join(dumps) or "[no process in the unit]\n", f"py-spy dump of each process ({py_spy})")
    since = ["--since", f"@{int(time.time() - unit_age_s(unit))}"] if unit_age_s(unit) else []
    keep("journal.txt", command(["journalctl", "-u", config["unit"], "--no-pager", "-o", "short-iso", *since], 30),
         "journalctl -u since the unit's start")  # fmt: skip
    keep("nvidia-smi.txt", command(["nvidia-smi", "-q"], 30), "nvidia-smi -q")
    keep("unit.txt", command(["systemctl", "cat", config["unit"]], 10), "systemctl cat")
    keep("unit-state.json", json.dumps(unit, indent=1), "systemctl show")
    with open(os.path.join(folder, "index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1)
    prune_bundles(config)
    return folder


def prune_bundles(config: dict) -> None:
    """Keep the newest bundle_keep bundles of this service."""
    try:
        names = sorted(n for n in os.listdir(config["bundle_dir"]) if n.endswith("-liveness"))
    except FileNotFoundError:
        return
    for name in names[: max(0, len(names) - int(config["bundle_keep"]))]:
        shutil.rmtree(os.path.join(config["bundle_dir"], name), ignore_errors=True)


def restart(config: dict, runner=subprocess.run) -> str:
    unit = config["unit"]
    runner(["systemctl", "kill", "--signal=SIGKILL", unit], capture_output=True, text=True, check=False)
    # systemd's start limit (StartLimitBurst) counts these starts too; liveness has its own cap (max_restarts)
    runner(["systemctl", "reset-failed", unit], capture_output=True, text=True, check=False)
    p = runner(["systemctl", "restart", unit], capture_output=True, text=True, check=False)
    return "" if p.returncode == 0 else (p.stderr or p.stdout).strip() or f"systemctl restart exited {p.returncode}"


# --- state and metrics ------------------------------------------------------------------------------------------


def write_atomically(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def load_state(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return new_state() | json.load(f)
    except (FileNotFoundError, ValueError):
        return new_state()


def number(value) -> str:
    """A sample value in full (a Unix time keeps its seconds: ``%g`` would round it to 6 digits)."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(round(value, 3))


def render_metrics(state: dict, config: dict) -> str:
    unit = config["unit"]
    rows = [
        ("probe_success", "gauge", "Whether the last generation probe answered (1) or not (0).",
         1 if state["phase"] == "ok" else 0),
        ("consecutive_failures", "gauge", "Failed generation probes in a row.", state["failures"]),
        ("restarts_total", "counter", "Restarts of the server unit by liveness.", state["restarts_total"]),
        ("restarts_in_window", "gauge", "Liveness restarts in the last window_s seconds.", len(state["restarts"])),
        ("gave_up", "gauge", "1 when liveness stopped restarting (max_restarts in window_s reached).",
         1 if state["gave_up"] else 0),
        ("last_round_timestamp_seconds", "gauge", "When liveness last looked at the unit (every interval_s).",
         state["last_round"]),
        ("last_probe_timestamp_seconds", "gauge", "When the last probe ran (0: none yet).", state["last_probe"]),
        ("last_success_timestamp_seconds", "gauge", "When a probe last answered.", state["last_ok"]),
    ]  # fmt: skip
    lines = []
    for name, kind, helptext, value in rows:
        lines += [f"# HELP gpufleet_liveness_{name} {helptext}", f"# TYPE gpufleet_liveness_{name} {kind}",
                  f'gpufleet_liveness_{name}{{unit="{unit}"}} {number(value)}']  # fmt: skip
    lines += ["# HELP gpufleet_liveness_phase What liveness sees (1 for the current phase).",
              "# TYPE gpufleet_liveness_phase gauge"]  # fmt: skip
    lines += [
        f'gpufleet_liveness_phase{{unit="{unit}",phase="{p}"}} {1 if state["phase"] == p else 0}'
        for p in ("idle", "paused", "inactive", "starting", "ok", "busy", "failing", "gave_up")
    ]
    return "\n".join(lines) + "\n"


def round_once(config: dict, state: dict, runner=subprocess.run, caller=http_call) -> dict:
    now = time.time()
    unit = unit_state(config["unit"], runner)
    paused_by = next((p for p in config["pause_paths"] if os.path.exists(p)), "") or deploy_at_work(config, now)
    action = decide(
        state, unit, config, now, paused_by, lambda: probe(config, caller), lambda: generated_tokens(config, caller)
    )
    state["rounds"] += 1
    state["last_round"] = now
    if action == "restart":
        why = state["last"]
        state["last_bundle"] = bundle(config, unit, why, runner, caller)
        log(f"{config['unit']}: restarting it: {state['failures']} failed probes, the last: {why}; incident bundle "
            f"{state['last_bundle']}")  # fmt: skip
        error = restart(config, runner)
        state["restarts"].append(now)
        state["restarts_total"] += 1
        state.update(failures=0, seen_ok=False, phase="starting")
        if error:
            log(f"{config['unit']}: the restart failed: {error}")
    write_atomically(config["state_file"], json.dumps(state))
    if config["metrics_file"]:
        write_atomically(config["metrics_file"], render_metrics(state, config))
    return state


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--once"):
        print(__doc__, file=sys.stderr)
        return 2
    config = load_config(argv[1])
    state = load_state(config["state_file"])
    if len(argv) == 3:
        print(json.dumps(round_once(config, state)))
        return 0
    log(f"watching {config['unit']} every {config['interval_s']}s: restart after {config['failures']} failed "
        f"generations, at most {config['max_restarts']} in {config['window_s']}s")  # fmt: skip
    while True:
        round_once(config, state)
        time.sleep(float(config["interval_s"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
