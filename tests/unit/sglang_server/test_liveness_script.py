"""roles/sglang_server/files/gpufleet_sglang_liveness.py: the decisions of the liveness service (when it counts a
failure, restarts, gives up, waits), its probe against a real HTTP server on loopback, the incident bundle's
redaction and retention, and its metrics. The lab test (tests/lab/test_liveness.py) runs it under systemd."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible_collections.gpufleet.fleet.plugins.filter.sglang_server import env_file_line

SCRIPT = Path(__file__).resolve().parents[3] / "roles/sglang_server/files/gpufleet_sglang_liveness.py"
spec = importlib.util.spec_from_file_location("gpufleet_sglang_liveness", SCRIPT)
live = importlib.util.module_from_spec(spec)
spec.loader.exec_module(live)

KEY = 'k"e$y\\`x'  # every character env_file_line escapes


def config(tmp_path: Path, **over) -> dict:
    return (
        live.DEFAULTS
        | {
            "state_file": str(tmp_path / "state.json"),
            "job_file": str(tmp_path / "ready-job.json"),
            "metrics_file": str(tmp_path / "textfile/gpufleet_liveness.prom"),
            "bundle_dir": str(tmp_path / "incidents"),
        }
        | over
    )


def active(invocation: str = "inv-1", age_s: float = 3600) -> dict:
    entered = int((time.monotonic() - age_s) * 1e6)
    return {"ActiveState": "active", "InvocationID": invocation, "ActiveEnterTimestampMonotonic": str(entered)}


def rounds(state, cfg, unit, results, now=1000.0, paused_by=""):
    """One decide() per probe result; the actions taken."""
    actions = []
    for i, ok in enumerate(results):
        actions.append(live.decide(state, unit, cfg, now + i, paused_by, lambda ok=ok: (ok, "ok" if ok else "hung")))
    return actions


def test_failures_in_a_row_after_a_good_answer_make_one_restart(tmp_path):
    cfg, state = config(tmp_path), live.new_state()
    assert rounds(state, cfg, active(), [True, False, False, True, False, False, False]) == [
        "none", "none", "none", "none", "none", "none", "restart",
    ]  # fmt: skip
    assert state["failures"] == 3 and state["phase"] == "failing"


def test_a_starting_engine_is_not_counted_until_it_answered_or_the_grace_ended(tmp_path):
    cfg, state = config(tmp_path, start_grace_s=600), live.new_state()
    assert rounds(state, cfg, active(age_s=10), [False] * 5) == ["none"] * 5
    assert state["phase"] == "starting" and state["failures"] == 0
    # past the grace (the model's load took too long, or the engine hangs before its first answer): counted
    assert rounds(state, cfg, active(age_s=700), [False] * 3) == ["none", "none", "restart"]


def test_restarts_are_capped_in_the_window_then_it_gives_up_until_a_new_start(tmp_path):
    cfg, state = config(tmp_path, max_restarts=2, window_s=3600), live.new_state()
    state["restarts"] = [900.0, 950.0]  # two in the window already
    assert rounds(state, cfg, active(), [True, False, False, False, False]) == ["none"] * 5
    assert state["gave_up"] and state["phase"] == "gave_up"
    # an answer ends it (a person fixed it), and so does a new start of the unit
    rounds(state, cfg, active(), [True])
    assert not state["gave_up"]
    state["gave_up"] = True
    rounds(state, cfg, active("inv-2", age_s=5), [False])
    assert not state["gave_up"] and state["phase"] == "starting"
    # restarts older than the window do not count
    state2 = live.new_state() | {"restarts": [100.0, 200.0]}
    assert rounds(state2, cfg | {"window_s": 600}, active(), [True, False, False, False], now=5000.0)[-1] == "restart"


def test_a_pause_or_an_inactive_unit_probes_nothing_and_counts_nothing(tmp_path):
    cfg, state = config(tmp_path), live.new_state()

    def never():
        raise AssertionError("probed")

    state["failures"] = 2
    assert live.decide(state, active(), cfg, 1.0, "/var/lib/gpufleet/locks/rollout-host.lock", never) == "none"
    assert state["phase"] == "paused" and state["failures"] == 0
    for unit in ({"ActiveState": "failed"}, {"ActiveState": "deactivating"}, {"ActiveState": "inactive"}):
        assert live.decide(state, unit, cfg, 1.0, "", never) == "none"
        assert state["phase"] == "inactive"


def test_a_deploy_start_job_pauses_it_while_it_runs(tmp_path):
    cfg = config(tmp_path)
    job = Path(cfg["job_file"])
    assert live.deploy_at_work(cfg, time.time()) == ""
    job.write_text(json.dumps({"started": 1, "finished": 0, "ansible_job_id": "j1"}))
    assert "a deploy's start" in live.deploy_at_work(cfg, time.time())
    # a record left by a job that died with its host long ago does not pause it for ever
    old = time.time() - float(cfg["start_grace_s"]) - 3700
    os.utime(job, (old, old))
    assert live.deploy_at_work(cfg, time.time()) == ""
    job.write_text(json.dumps({"started": 1, "finished": 1, "failed": True}))
    assert live.deploy_at_work(cfg, time.time()) == ""


class Engine(BaseHTTPRequestHandler):
    """Loopback stand-in for the engine's OpenAI API: answers, hangs or fails as `mode` says."""

    mode = "ok"
    seen: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Engine.seen.append((self.path, self.headers.get("Authorization"), body))
        if Engine.mode == "hang":
            time.sleep(3)
        if Engine.mode == "503":
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"error": "busy"}')
            return
        tokens = 0 if Engine.mode == "empty" else 2
        answer = {"choices": [{"message": {"content": "OK" if tokens else ""}}],
                  "usage": {"completion_tokens": tokens}}  # fmt: skip
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the probe gave up waiting (mode "hang")
            self.wfile.write(data)

    def do_GET(self):
        data = json.dumps({"api_key": KEY, "model_path": "/srv/models/m", "note": f"key {KEY} inside"}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Engine.mode, Engine.seen = "ok", []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_probe_is_a_chat_generation_with_the_servers_own_key(tmp_path, engine):
    secrets = tmp_path / "secrets.env"
    secrets.write_text(env_file_line("SGLANG_SERVER_API_KEY", KEY) + "\n" + env_file_line("HF_TOKEN", "hf_x") + "\n")
    cfg = config(tmp_path, base_url=engine, served_name="glm-5", secrets_file=str(secrets), timeout_s=1)
    assert live.probe(cfg)[0] is True
    path, auth, body = Engine.seen[-1]
    assert path == "/v1/chat/completions" and auth == f"Bearer {KEY}" and body["model"] == "glm-5"
    assert body["max_tokens"] == 8 and body["messages"][0]["role"] == "user"
    Engine.mode = "hang"
    ok, why = live.probe(cfg)
    assert not ok and why.startswith("no answer in") and "timed out" in why
    Engine.mode = "503"
    ok, why = live.probe(cfg)
    assert not ok and why.startswith("HTTP 503 in")
    Engine.mode = "empty"
    assert live.probe(cfg) == (False, "an answer with no generated token")


def test_no_server_at_all_is_a_failure_not_an_error(tmp_path):
    ok, why = live.probe(config(tmp_path, base_url="http://127.0.0.1:9", timeout_s=1))
    assert not ok and "ConnectionRefusedError" in why


def test_the_bundle_keeps_what_maintainers_ask_for_with_the_secrets_redacted(tmp_path, engine):
    secrets = tmp_path / "secrets.env"
    secrets.write_text(env_file_line("SGLANG_SERVER_API_KEY", KEY) + "\n" + env_file_line("HF_TOKEN", "hf_x") + "\n")
    cfg = config(tmp_path, base_url=engine, secrets_file=str(secrets), py_spy="/nonexistent/py-spy", bundle_keep=2)
    commands = []

    def runner(argv, **kwargs):
        commands.append(argv)
        out = f"output of {argv[0]} with {KEY} and hf_x\n"
        return type("P", (), {"stdout": out, "stderr": "", "returncode": 0})()

    unit = active() | {"ControlGroup": "", "MainPID": "0"}
    folder = Path(live.bundle(cfg, unit, "no answer in 15.0s", runner))
    files = {p.name: p.read_text() for p in folder.iterdir()}
    assert {"server_info.json", "loads.json", "metrics.txt", "stacks.txt", "journal.txt", "nvidia-smi.txt", "unit.txt",
            "unit-state.json", "index.json"} <= set(files)  # fmt: skip
    assert all(KEY not in text and "hf_x" not in text for text in files.values()), files
    assert json.loads(files["server_info.json"])["api_key"] == "<redacted>"
    assert json.loads(files["index.json"])["why"] == "no answer in 15.0s"
    assert ["nvidia-smi", "-q"] in commands and any(c[:3] == ["journalctl", "-u", cfg["unit"]] for c in commands)
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    # retention: the newest bundle_keep
    for stamp in ("20200101T000000Z", "20200102T000000Z", "20200103T000000Z"):
        (Path(cfg["bundle_dir"]) / f"{stamp}-sglang-server-liveness").mkdir()
    live.prune_bundles(cfg)
    assert sorted(os.listdir(cfg["bundle_dir"])) == ["20200103T000000Z-sglang-server-liveness", folder.name]


def test_the_metrics_say_what_it_sees(tmp_path):
    cfg = config(tmp_path)
    state = live.new_state() | {"phase": "gave_up", "gave_up": True, "failures": 3, "restarts": [1.0, 2.0]}
    state |= {"restarts_total": 5, "last_round": 7.0, "last_probe": 1765000123.4567}
    text = live.render_metrics(state, cfg)
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    u = 'unit="sglang-server.service"'
    assert values[f"gpufleet_liveness_gave_up{{{u}}}"] == "1"
    assert values[f"gpufleet_liveness_probe_success{{{u}}}"] == "0"
    assert values[f"gpufleet_liveness_restarts_in_window{{{u}}}"] == "2"
    assert values[f"gpufleet_liveness_restarts_total{{{u}}}"] == "5"
    assert values[f"gpufleet_liveness_last_round_timestamp_seconds{{{u}}}"] == "7"
    # a Unix time in full (GpufleetLivenessNotRunning compares it with time(); %g kept 6 digits: 1.765e+09)
    assert values[f"gpufleet_liveness_last_probe_timestamp_seconds{{{u}}}"] == "1765000123.457"
    assert values[f'gpufleet_liveness_phase{{{u},phase="gave_up"}}'] == "1"
    assert values[f'gpufleet_liveness_phase{{{u},phase="ok"}}'] == "0"


def test_a_round_restarts_through_systemd_after_the_bundle_and_keeps_its_state(tmp_path, engine):
    cfg = config(tmp_path, base_url=engine, timeout_s=1, failures=1, py_spy="/nonexistent/py-spy")
    calls = []

    def runner(argv, **kwargs):
        calls.append(argv)
        out = "ActiveState=active\nInvocationID=inv-9\nActiveEnterTimestampMonotonic=1\nControlGroup=\n" if argv[
            :2] == ["systemctl", "show"] else ""  # fmt: skip
        return type("P", (), {"stdout": out, "stderr": "", "returncode": 0})()

    Engine.mode = "hang"
    state = live.round_once(cfg, live.load_state(cfg["state_file"]), runner)
    restart_calls = [c for c in calls if c[1:2] in (["kill"], ["reset-failed"], ["restart"])]
    assert restart_calls == [
        ["systemctl", "kill", "--signal=SIGKILL", cfg["unit"]],
        ["systemctl", "reset-failed", cfg["unit"]],
        ["systemctl", "restart", cfg["unit"]],
    ]
    assert calls.index(["nvidia-smi", "-q"]) < calls.index(restart_calls[0])  # the bundle first
    assert state["restarts_total"] == 1 and Path(state["last_bundle"]).is_dir()
    saved = live.load_state(cfg["state_file"])
    assert saved["restarts_total"] == 1 and len(saved["restarts"]) == 1  # survives the service's own restart
    assert "gpufleet_liveness_restarts_total" in Path(cfg["metrics_file"]).read_text()


def test_the_units_processes_are_its_main_process_and_descendants_where_no_cgroup_answers():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(live.unit_pids({"MainPID": str(child.pid)})) < 2:
            time.sleep(0.05)
        pids = live.unit_pids({"MainPID": str(child.pid), "ControlGroup": "/no/such/group"})
        assert pids[0] == child.pid and len(pids) == 2, pids  # python and its sleep
    finally:
        child.kill()
        child.wait()


def test_an_overloaded_engine_that_still_generates_is_busy_not_hung(tmp_path):
    cfg, state = config(tmp_path), live.new_state()
    counts = iter([100.0, 180.0, 260.0, 260.0, 260.0, 260.0])  # generated tokens after each failed probe

    def step(ok):
        return live.decide(state, active(), cfg, 1.0, "", lambda: (ok, "no answer in 15.0s"), lambda: next(counts))

    assert step(True) == "none"
    assert [step(False) for _ in range(3)] == ["none"] * 3
    assert state["phase"] == "busy" and state["failures"] == 0  # the first failure had no count to compare with
    assert "busy, not hung: 80 tokens generated meanwhile" in state["last"]
    # the count stops: hung; failures go on from where they were
    assert [step(False) for _ in range(3)] == ["none", "none", "restart"]
    # a /metrics that does not answer (a stopped main process) is no sign of work
    state2 = live.new_state() | {"seen_ok": True, "invocation": "inv-1"}
    acts = [live.decide(state2, active(), cfg, 1.0, "", lambda: (False, "x"), lambda: None) for _ in range(3)]
    assert acts == ["none", "none", "restart"]


def test_the_work_count_moves_with_long_generations_none_of_which_finished(tmp_path):
    """A server full of long generations (every running slot taken, the probe queued behind them, nothing finishing
    within the failure window) is busy: 0.5.9's realtime_tokens_total counts the decode tokens at each log interval
    while generation_tokens_total waits for a request's end. Read from 0.5.9's own exposition (the simulator's golden
    file, written by 0.5.9's collector.py)."""
    golden = (Path(__file__).parents[1] / "sglang_sim/fixtures/metrics-0.5.9-text.txt").read_text()
    cfg = config(tmp_path)
    assert live.generated_tokens(cfg, lambda *a: (200, golden)) == 8.0 + 7.0 + 2.0  # finished, prefill, decode
    series = 'sglang:realtime_tokens_total{engine_type="unified",mode="decode",model_name="glm-5",moe_ep_rank="0",'
    series += 'pp_rank="0",tp_rank="0"}'
    assert f"{series} 2.0" in golden
    decoding = golden.replace(f"{series} 2.0", f"{series} 642.0")  # 640 decode tokens later, nothing finished
    state = live.new_state() | {"seen_ok": True, "invocation": "inv-1"}
    counts = iter([golden, decoding])
    acts = [
        live.decide(state, active(), cfg, 1.0, "", lambda: (False, "no answer in 10.0s"),
                    lambda: live.generated_tokens(cfg, lambda *a: (200, next(counts))))
        for _ in range(2)
    ]  # fmt: skip
    assert acts == ["none", "none"] and state["phase"] == "busy", state
    assert "640 tokens generated meanwhile" in state["last"]


def test_the_token_count_is_sglangs_generation_counter(tmp_path):
    text = (
        "# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{model_name="glm-5",engine_type="unified",tp_rank="0"} 1200.0\n'
        'sglang:generation_tokens_total{model_name="glm-5",engine_type="unified",tp_rank="1"} 1200.0\n'
        'sglang:prompt_tokens_total{model_name="glm-5"} 99.0\n'
    )
    cfg = config(tmp_path)
    assert live.generated_tokens(cfg, lambda *a: (200, text)) == 2400.0
    assert live.generated_tokens(cfg, lambda *a: (0, "timed out")) is None
    assert live.generated_tokens(cfg, lambda *a: (200, "up 1\n")) is None
