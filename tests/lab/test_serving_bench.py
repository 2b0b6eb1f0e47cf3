"""playbooks/bench.yml, the canary gate and the fleet report on a lab of two hosts (one lab for all tests).

Each host runs the simulated engine under the role's own unit (roles/sglang_server template) with an API key;
bench-02 is made slower through the simulator's speed setting SGLANG_SIM_TOKENS_PER_S (lab/sglang-sim README,
"Speed model"). The controller runs sglang 0.5.9's real bench_serving against both. bench-01's run becomes the
baseline of the GPU class; the gate refuses bench-02 and the fleet report says why; the HTML report, opened in
headless Chromium with the network cut, shows the tables and both plots.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import jinja2
import pytest
from conftest import LAB_ENV, ROOT, lab, lab_json
from lab_host import health

sys.path.insert(0, str(ROOT / "roles/sglang_server/filter_plugins"))
import sglang_server as role_filters  # noqa: E402

NAME = "t-bench"
HOSTS = {"bench-01": "60", "bench-02": "20"}  # SGLANG_SIM_TOKENS_PER_S: bench-02 is 3x slower
KEY = "bench-key-5b0d"
LAUNCHER = ROOT / "roles/sglang_server/files/sglang-log-redact.py"
TEMPLATE = ROOT / "roles/sglang_server/templates/sglang-server.service.j2"
ARTIFACTS = ROOT / "tests/lab/artifacts"


def unit(tokens_per_s: str) -> str:
    env = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters.update(role_filters.FilterModule().filters())
    argv = ["--model-path", "/srv/models/glm-5-sim", "--served-model-name", "glm-5", "--tp", "2",
            "--host", "0.0.0.0", "--port", "8000", "--max-running-requests", "64"]  # fmt: skip
    return env.from_string(TEMPLATE.read_text()).render(
        sglang_server_served_name="glm-5", sglang_server_release_id="sim-a",
        sglang_server_start_limit_interval_s=3600, sglang_server_start_limit_burst=3,
        sglang_server_user="sglang", sglang_server_group="sglang", sglang_server_supplementary_groups=[],
        sglang_server_cache_dir="/var/cache/sglang-server", sglang_server_runtime_dir_name="sglang-server",
        sglang_server_secrets_file="/etc/sglang-server/secrets.env",
        sglang_server_unit_environment={"PYTHONPATH": "/opt/sglang-sim", "SGLANG_SIM_LOAD_SECONDS": "0.5",
                                        "SGLANG_SIM_GRAPH_SECONDS": "0.5", "SGLANG_SIM_ACCESS_LOG": "0",
                                        "SGLANG_SIM_TOKENS_PER_S": tokens_per_s},
        sglang_server_api_key=KEY, sglang_server_hf_token="", sglang_server_use_redactor=True,
        sglang_server_redactor_sha256=hashlib.sha256(LAUNCHER.read_bytes()).hexdigest(),
        sglang_server_python="/usr/bin/python3",
        sglang_server_redactor_path="/usr/local/libexec/gpufleet/sglang-log-redact",
        sglang_server_module="sglang_sim.launch_server", sglang_server_argv=argv,
        sglang_server_timeout_start_s=120, sglang_server_timeout_stop_s=20, sglang_server_restart_policy="on-failure",
        sglang_server_restart_sec=5, sglang_server_user_home="/var/lib/sglang", sglang_server_read_write_paths=[],
    )  # fmt: skip


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


def tokenizer_files() -> dict[str, bytes]:
    sys.path.insert(0, str(ROOT / "lab"))
    from testhub import model

    files = model._files_for(1)
    return {n: files[n] for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("inv") / "hosts.yml"
    result = lab_json("--name", NAME, "up", "--hosts", "2", "--host-names", ",".join(HOSTS),
                      "--profile", "h200x2-vm", "--inventory", str(inventory))  # fmt: skip
    hosts = {h["name"]: h for h in result["hosts"]}
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        tf.add(
            ROOT / "lab/sglang-sim/src/sglang_sim",
            "sglang_sim",
            filter=lambda t: None if "__pycache__" in t.name else t,
        )
        for name, data in tokenizer_files().items():
            info = tarfile.TarInfo(f"tokenizer/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    for name, speed in HOSTS.items():
        h = hosts[name]
        on(h, "mkdir -p /opt/sglang-sim /srv/models/glm-5-sim && tar -x -C /opt/sglang-sim && "
              "mv /opt/sglang-sim/tokenizer/* /srv/models/glm-5-sim/ && chmod -R a+rX /opt/sglang-sim /srv/models",
           stdin=tar.getvalue())  # fmt: skip
        on(h, "mkdir -p /usr/local/libexec/gpufleet && cat > /usr/local/libexec/gpufleet/sglang-log-redact && "
              "chmod 0755 /usr/local/libexec/gpufleet/sglang-log-redact", stdin=LAUNCHER.read_text())  # fmt: skip
        on(h, "id sglang >/dev/null 2>&1 || useradd --system --home-dir /var/lib/sglang --create-home sglang; "
              "install -d -o sglang -g sglang -m 0750 /var/cache/sglang-server; "
              "install -d -m 0755 /etc/sglang-server; "
              f"umask 077; printf 'SGLANG_SERVER_API_KEY=\"%s\"\\n' {KEY} "
              "> /etc/sglang-server/secrets.env")  # fmt: skip
        on(h, "cat > /etc/systemd/system/sglang-server.service && systemctl daemon-reload && "
              "systemctl start sglang-server.service", stdin=unit(speed))  # fmt: skip
    deadline = time.monotonic() + 90
    for h in hosts.values():
        while health(h["address"]) != 200:
            assert time.monotonic() < deadline, on(h, "journalctl -u sglang-server --no-pager -n 40", check=False)
            time.sleep(0.5)
    reports = tmp_path_factory.mktemp("reports")
    (inventory.parent / "host_vars").mkdir()
    (inventory.parent / "host_vars/bench-01.yml").write_text("serving_bench_save_baseline: true\n")
    yield {"inventory": inventory, "hosts": hosts, "reports": reports}
    lab("--name", NAME, "down", check=False)


def playbook(fleet, playbook: str, extra: dict, limit: str | None = None) -> tuple[int, str]:
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(fleet["reports"] / ".facts"))
    extra = {
        "sglang_server_args": {
            "port": 8000,
            "served-model-name": "glm-5",
            "model-path": "/srv/models/glm-5-sim",
            "tp": 2,
        },
        "serving_bench_api_key": KEY,
        "serving_bench_reports_dir": str(fleet["reports"]),
        "serving_bench_concurrencies": [4, 16],
        "serving_bench_prompts_per_concurrency": 2,
        "serving_bench_input_len": 64,
        "serving_bench_output_len": 24,
        "serving_bench_gate_concurrency": 16,
        "serving_bench_gate_max_regression_pct": 25,
        **extra,
    }
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(fleet["inventory"]), playbook, "-e", json.dumps(extra)]
    if limit:
        cmd += ["-l", limit]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def chromium(html, *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Chromium is missing: `make setup` installs Debian's chromium"
    # no network: every host name resolves to nothing and any proxy use goes to a closed port
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--proxy-server=127.0.0.1:9", "--window-size=1280,2400", *args, html.as_uri()]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_bench_baseline_gate_and_report(fleet):
    reports = fleet["reports"]
    # 1. the sweep on both hosts, one at a time; bench-01's run becomes the GPU class baseline (host_vars)
    rc, out = playbook(fleet, "playbooks/bench.yml", {})
    assert rc == 0, out[-4000:]
    assert KEY not in out
    for host in HOSTS:
        latest = json.loads((reports / "bench" / host / "latest.json").read_text())
        assert latest["gpu_class"] == "NVIDIA H200 x2"
        assert [r["max_concurrency"] for r in latest["results"]] == [4, 16]
        assert all(r["failed"] == 0 and r["output_throughput"] > 0 for r in latest["results"])
        assert (
            reports / "bench" / host / latest["config_hash"] / (latest["run_dir"].rsplit("/", 1)[1] + ".json")
        ).exists()
    fast = json.loads((reports / "bench/bench-01/latest.json").read_text())
    slow = json.loads((reports / "bench/bench-02/latest.json").read_text())
    assert fast["config_hash"] != slow["config_hash"]  # the environments differ (SGLANG_SIM_TOKENS_PER_S)
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
                  r"the baseline [\d.]+ of GPU class 'NVIDIA H200 x2' \(allowed: 25% below\)", flat)  # fmt: skip
    assert m and float(m.group(1)) > 40, flat[-3000:]
    verdict = json.loads((reports / "gate/bench-02.json").read_text())
    assert verdict["ok"] is False and verdict["baseline_host"] == "bench-01"
    md = (reports / "fleet-report.md").read_text()
    assert "REFUSED" in md and "below the baseline" in md

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
    assert "NVIDIA H200 x2" in page and "NCCL" in page and "REFUSED" in page
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]{2000,})"', page)
    assert [a for a, _ in imgs] == ["Throughput vs concurrency per host and configuration",
                                    "Latency percentiles vs concurrency"]  # fmt: skip
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "fleet-report.png"
    shot.unlink(missing_ok=True)
    res = chromium(html, f"--screenshot={shot}")
    assert res.returncode == 0 and shot.stat().st_size > 20000, res.stderr[-2000:]
