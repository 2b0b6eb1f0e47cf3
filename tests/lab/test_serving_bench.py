"""playbooks/bench.yml, the canary gate, the fleet report and playbooks/tune.yml on one lab of two hosts.

The simulated engine is the hosts' "ml-env release" and playbooks/deploy_server.yml (the sglang_server role)
deploys it with an API key; bench-02 is made 3x slower through the simulator's speed setting
SGLANG_SIM_TOKENS_PER_S (lab/sglang-sim README, "Speed model"). The controller runs sglang 0.5.9's real
bench_serving against both. bench-01's sweep becomes the GPU class baseline; the gate passes bench-01 and
refuses bench-02 with the reason in the report; the HTML report, opened in headless Chromium with the network
cut, shows the tables and both plots. The tuning sweep ranks three --max-running-requests variants on bench-01
and leaves it as it was.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import simfleet
from conftest import LAB_ENV, ROOT, ClientThreads, lab, lab_json
from lab_host import chromium, health

NAME = "t-bench"
GPU_CLASS = "NVIDIA RTX PRO 6000 Blackwell Server Edition x8"  # the lab profile rtx-pro-6000x8-vm
HOSTS = {"bench-01": "60", "bench-02": "20"}  # SGLANG_SIM_TOKENS_PER_S: bench-02 is 3x slower
KEY = "bench-key-5b0d"
ARTIFACTS = ROOT / "tests/lab/artifacts"


def on(host: dict, script: str, stdin: bytes | str | None = None, check: bool = True) -> str:
    """A shell script inside a lab host (bytes on stdin, so a tar survives)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", "--name", NAME, "exec", host["name"], "--", "bash", "-c", script],
        input=data, capture_output=True, env=LAB_ENV, check=False, timeout=120,
    )  # fmt: skip
    out = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    if check:
        assert proc.returncode == 0, f"{script} on {host['name']}: rc {proc.returncode}\n{out}"
    return out


ROUTER_KEY = "bench-router-key-not-a-secret"  # the gateway's control-plane key (lab equipment)
GATEWAY = f"{NAME}-router-01"
GROUP_VARS = simfleet.GROUP_VARS | {
    "sglang_server_api_key": KEY,
    "fleet_router_control_plane_api_key": ROUTER_KEY,
    "fleet_router_wheelhouse": str(ROOT / ".cache/smg/wheelhouse"),
    "serving_bench_concurrencies": [4, 16],
    "serving_bench_prompts_per_concurrency": 2,
    "serving_bench_input_len": 64,
    "serving_bench_output_len": 24,
    "serving_bench_gate_concurrency": 16,
    "serving_bench_gate_max_regression_pct": 25,
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("inv") / "hosts.yml"
    reports = tmp_path_factory.mktemp("reports")
    subprocess.run(["make", "-s", "router-wheelhouse"], cwd=ROOT, check=True, timeout=300)
    result = lab_json("--name", NAME, "up", "--hosts", "2", "--host-names", ",".join(HOSTS), "--routers", "1",
                      "--profile", "rtx-pro-6000x8-vm", "--inventory", str(inventory))  # fmt: skip
    hosts = {h["name"]: h for h in result["hosts"]}
    (inventory.parent / "group_vars").mkdir()
    group_vars = GROUP_VARS | {
        "sglang_server_report_dir": str(reports / "deploy"),
        "serving_bench_reports_dir": str(reports),
        "fleet_name": "bench-lab",
    }
    (inventory.parent / "group_vars/all.yml").write_text(json.dumps(group_vars, indent=1))
    (inventory.parent / "host_vars").mkdir()
    for name, speed in HOSTS.items():
        host_vars = {
            "sglang_server_environment": GROUP_VARS["sglang_server_environment"] | {"SGLANG_SIM_TOKENS_PER_S": speed}
        }
        if name == "bench-01":
            host_vars["serving_bench_save_baseline"] = True  # bench-01's sweep is the GPU class baseline
        (inventory.parent / f"host_vars/{name}.yml").write_text(json.dumps(host_vars))
    for name in HOSTS:
        simfleet.install(NAME, name, LAB_ENV)
    rc, out = playbook({"inventory": inventory, "reports": reports}, "playbooks/deploy_server.yml", {})
    assert rc == 0, out[-5000:]
    for name in HOSTS:
        assert health(hosts[name]["address"]) == 200
    # the gateway in front of them: benchmarks and tuning take a server off the serving path while they measure it
    rc, out = playbook({"inventory": inventory, "reports": reports}, "playbooks/router.yml", {})
    assert rc == 0, out[-5000:]
    yield {"inventory": inventory, "hosts": hosts, "reports": reports}
    lab("--name", NAME, "down", check=False)


def playbook(fleet, playbook: str, extra: dict, limit: str | None = None, timeout: int = 900) -> tuple[int, str]:
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(fleet["reports"] / ".facts"))
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(fleet["inventory"]), playbook]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    if limit:
        cmd += ["-l", limit]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_bench_baseline_gate_and_report(fleet):
    reports = fleet["reports"]
    # 1. the sweep on both hosts, one at a time, each out of the router while it is measured and back after;
    # bench-01's run becomes the GPU class baseline (host_vars)
    rc, out = playbook(fleet, "playbooks/bench.yml", {})
    assert rc == 0, out[-4000:]
    assert KEY not in out and ROUTER_KEY not in out
    flat = " ".join(out.split())
    for host in HOSTS:
        assert (
            f"{host} is out of {GATEWAY} and drained for the experiment" in flat
            and f"{host} is back in {GATEWAY}" in flat
        )
    assert healthy_in_router(fleet) == sorted(HOSTS)
    assert on(fleet["hosts"][GATEWAY], "ls /var/lib/gpufleet/locks 2>/dev/null || true").strip() == ""
    for host in HOSTS:
        latest = json.loads((reports / "bench" / host / "latest.json").read_text())
        assert latest["gpu_class"] == GPU_CLASS
        assert [r["max_concurrency"] for r in latest["results"]] == [4, 16]
        assert all(r["failed"] == 0 and r["output_throughput"] > 0 for r in latest["results"])
        assert (
            reports / "bench" / host / latest["config_hash"] / (latest["run_dir"].rsplit("/", 1)[1] + ".json")
        ).exists()
    fast = json.loads((reports / "bench/bench-01/latest.json").read_text())
    slow = json.loads((reports / "bench/bench-02/latest.json").read_text())
    assert fast["config_hash"] != slow["config_hash"]  # the environments differ (SGLANG_SIM_TOKENS_PER_S)
    assert fast["engine_version"] == "0.5.9-sim" and fast["ml_env_release_id"] == "sim"
    assert slow["results"][1]["output_throughput"] < 0.6 * fast["results"][1]["output_throughput"]
    assert slow["vs_baseline"][1]["delta_pct"] < -40
    saved = "".join(p.read_text(errors="replace") for p in reports.rglob("*") if p.is_file())
    assert KEY not in saved and '"api_key": "<redacted>"' in saved

    # 2. the canary gate (both hosts as canaries at once) passes bench-01 and refuses the slower bench-02
    rc, out = playbook(fleet, "tests/lab/playbooks/bench_gate.yml", {"serving_bench_concurrencies": [16]})
    assert rc != 0
    flat = " ".join(out.split())
    assert "CANARY GATE PASSED: bench-01: output_throughput at concurrency 16" in flat, flat[-3000:]
    assert "bench-01 : ok=" in flat and "failed=0" in flat.split("bench-01 : ok=")[1][:80]
    m = re.search(r"CANARY GATE REFUSED: bench-02: output_throughput at concurrency 16 is [\d.]+, ([\d.]+)% below "
                  r"the baseline [\d.]+ of GPU class '" + GPU_CLASS + r"' \(allowed: 25% below\)", flat)  # fmt: skip
    assert m and float(m.group(1)) > 40, flat[-3000:]
    verdict = json.loads((reports / "gate/bench-02.json").read_text())
    assert verdict["ok"] is False and verdict["baseline_host"] == "bench-01"
    md = (reports / "fleet-report.md").read_text()
    assert "REFUSED" in md and "below the baseline" in md
    assert md.startswith("# gpufleet fleet report: bench-lab\n")  # the inventory's fleet_name

    # 3. the HTML page in headless Chromium, no network: tables, both plots, the gate's reason
    html = reports / "fleet-report.html"
    text = html.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "the page must not fetch anything"
    dom = chromium(html, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    for host in HOSTS:
        assert f'data-host="{host}"' in page
    assert page.count('<table class="bench"') == 2
    assert GPU_CLASS in page and "NCCL_P2P_LEVEL=PHB" in page and "REFUSED" in page
    assert "0.5.9-sim (simulator)" in page
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]{2000,})"', page)
    assert [a for a, _ in imgs] == ["Throughput vs concurrency per host and configuration",
                                    "Latency percentiles vs concurrency"]  # fmt: skip
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "fleet-report.png"
    shot.unlink(missing_ok=True)
    res = chromium(html, f"--screenshot={shot}")
    assert res.returncode == 0 and shot.stat().st_size > 20000, res.stderr[-2000:]


def router_workers(fleet) -> list[dict]:
    out = on(
        fleet["hosts"][GATEWAY], f"curl -s -m 5 -H 'Authorization: Bearer {ROUTER_KEY}' http://127.0.0.1:30000/workers"
    )
    return json.loads(out)["workers"]


def healthy_in_router(fleet) -> list[str]:
    by_address = {f"http://{h['address']}:8000": name for name, h in fleet["hosts"].items()}
    return sorted(by_address.get(w["url"].rstrip("/"), w["url"]) for w in router_workers(fleet) if w["is_healthy"])


class Clients(ClientThreads):
    """Clients that send short chat completions one after another from `workers` threads to one address and record
    each request's latency; every failure counts, whatever its kind."""

    def __init__(self, address: str, port: int, key: str | None = None, workers: int = 4):
        self.address, self.port, self.key = address, port, key
        self.latencies: list[float] = []
        self.failures: list[str] = []
        super().__init__(workers)

    def _run(self, index: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            body = {
                "model": "glm-5",
                "messages": [{"role": "user", "content": f"client {index}-{n}"}],
                "max_tokens": 16,
                "ignore_eos": True,
                "chat_template_kwargs": {"enable_thinking": False},
            }
            headers = {"Content-Type": "application/json"} | (
                {"Authorization": f"Bearer {self.key}"} if self.key else {}
            )
            start = time.monotonic()
            try:
                conn = http.client.HTTPConnection(self.address, self.port, timeout=60)
                conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if resp.status != 200 or json.loads(data)["choices"][0]["message"]["content"] is None:
                    raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
                self.latencies.append(time.monotonic() - start)
            except Exception as exc:
                self.failures.append(f"client {index} request {n}: {exc!r}")
                time.sleep(0.2)

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_tune_ranks_variants_and_leaves_the_canary_as_it_was(fleet):
    """Under client load through the gateway, the whole sweep: the canary is out of the router while it runs variants
    (clients see no failed request and no latency beyond what bench-02 alone gives: the capacity lost), the running
    configuration is measured as the control, and the canary ends as it was."""
    reports, host = fleet["reports"], fleet["hosts"]["bench-01"]
    gateway, other = fleet["hosts"][GATEWAY]["address"], fleet["hosts"]["bench-02"]["address"]
    # the capacity left while the canary is out: the same clients straight at bench-02 (the slower host), 20 s
    with Clients(other, 8000, key=KEY) as alone:
        time.sleep(20)
    assert not alone.failures and len(alone.latencies) > 20, (alone.failures[:3], len(alone.latencies))
    assert healthy_in_router(fleet) == sorted(HOSTS), router_workers(fleet)  # both serve before the sweep
    # While the sweep runs, the router is read every second with the canary's running max-running-requests: the canary
    # is never in the router while it runs a variant (or restarts), and it is back at the end.
    seen, stop = [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                info = json.loads(on(host, f"curl -s -m 5 -H 'Authorization: Bearer {KEY}' "
                                           "http://127.0.0.1:8000/get_server_info", check=False) or "{}")  # fmt: skip
            except ValueError:
                info = {}
            with contextlib.suppress(ValueError, KeyError):
                seen.append((info.get("max_running_requests"), "bench-01" in healthy_in_router(fleet)))
            time.sleep(1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    before = on(host, "sha256sum /etc/systemd/system/sglang-server.service /var/lib/gpufleet/sglang-server/*/*")
    # --max-running-requests caps the simulated engine's batch (lab/sglang-sim README, "Speed model"): at 16
    # concurrent requests, 2 running at once is far slower than 8, and 8 than 32
    variants = [
        {"name": "mrr-8", "args": {"max-running-requests": 8}},
        {"name": "mrr-2", "args": {"max-running-requests": 2}},
        {"name": "mrr-32", "args": {"max-running-requests": 32}},
    ]
    extra = {"serving_bench_tune_variants": variants, "serving_bench_tune_canary": "bench-01",
             "serving_bench_concurrencies": [16], "serving_bench_tune_concurrency": 16}  # fmt: skip
    # five safe restarts and three benchmarks: 600 s was not enough on this 2-core machine at load 29
    try:
        # the servers ask for a key, so the gateway does too (fleet_router_worker_api_key): clients send it
        with Clients(gateway, 30000, key=KEY) as clients:
            rc, out = playbook(fleet, "playbooks/tune.yml", extra, timeout=1800)
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert rc == 0, out[-5000:]
    assert not clients.failures and clients.latencies, (len(clients.failures), clients.failures[:5])
    measured = {
        "bench-02 alone": {"requests": len(alone.latencies), "p50_s": alone.p(0.5), "p99_s": alone.p(0.99)},
        "gateway during tune.yml": {"requests": len(clients.latencies), "failed": len(clients.failures),
                                    "p50_s": clients.p(0.5), "p99_s": clients.p(0.99), "max_s": max(clients.latencies)},
    }  # fmt: skip
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "tune-under-load.json").write_text(json.dumps(measured, indent=1))
    print("tune.yml under client load:", json.dumps(measured))
    # the canary's variants (one lets 2 requests run) and restarts never reach a client: what is left is bench-02's
    assert clients.p(0.99) <= 2 * alone.p(0.99) + 1.0, measured
    variants_seen = [in_router for mrr, in_router in seen if mrr not in (None, 64)]
    assert variants_seen and not any(variants_seen), seen  # variants ran, never in the router
    assert healthy_in_router(fleet) == sorted(HOSTS)  # back in after the sweep
    tune_report = json.loads((reports / "tune/bench-01.json").read_text())
    # the running configuration was measured as the control; a winner is advice only when it beats it
    assert tune_report["control"]["name"] == "running" and tune_report["control"]["ok"] is True
    assert tune_report["winner_beats_control"] == (tune_report["winner"]["score"] > tune_report["control"]["score"])
    # the host's own bench result is the running configuration's (the control), not a variant's
    latest = json.loads((reports / "bench/bench-01/latest.json").read_text())
    assert latest["config_hash"] == tune_report["control"]["config_hash"]
    tune = json.loads((reports / "tune/bench-01.json").read_text())
    assert [v["name"] for v in tune["ranking"]] == ["mrr-32", "mrr-8", "mrr-2"], tune["ranking"]
    scores = [v["score"] for v in tune["ranking"]]
    assert scores[0] > 1.3 * scores[1] and scores[1] > 1.3 * scores[2], scores
    assert tune["winner"]["name"] == "mrr-32" and "max-running-requests: 32" in tune["winner_yaml"]
    assert tune["restored"] is True
    flat = " ".join(out.split())
    assert "bench-01 is back on its original configuration" in flat
    # the canary is as it was: same unit, same last-good and previous-good, serving, and no variant in its flags
    assert on(host, "sha256sum /etc/systemd/system/sglang-server.service /var/lib/gpufleet/sglang-server/*/*") == before
    assert health(host["address"]) == 200
    assert "--max-running-requests 64" in on(host, "systemctl show -p ExecStart sglang-server.service")
    assert "Tuning on bench-01" in (reports / "fleet-report.md").read_text()


def test_bench_of_one_host_with_limit_writes_the_fleet_report(fleet):
    """`bench.yml -l <host>`, as docs/benchmarks.md documents it, measures that host and writes the fleet report (its
    report play ran on localhost, which -l left out: no report at all)."""
    reports = fleet["reports"]
    for name in ("fleet-report.md", "fleet-report.html"):
        (reports / name).unlink(missing_ok=True)
    before = json.loads((reports / "bench/bench-01/latest.json").read_text())
    rc, out = playbook(fleet, "playbooks/bench.yml", {"serving_bench_concurrencies": [4]}, limit="bench-02")
    assert rc == 0, out[-4000:]
    assert (reports / "fleet-report.html").exists() and "bench-02" in (reports / "fleet-report.md").read_text()
    assert json.loads((reports / "bench/bench-01/latest.json").read_text()) == before  # the other host untouched
