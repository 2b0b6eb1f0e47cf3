"""plugins/module_utils/sglang_server_drain.py: requests in flight before a stop, and how many the stop cut."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests/unit/sglang_sim"))

from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_drain as server_drain  # noqa: E402
from sglang_sim_helpers import Sim  # noqa: E402

DRAINED = {"result": "success", "exec_main_code": "1", "exec_main_status": "137"}
TIMED_OUT = {"result": "timeout", "exec_main_code": "2", "exec_main_status": "9"}


def journal(*counts, extra=()):
    lines = [
        (
            100.0,
            "[2026-11-30 17:00:00] SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
        )
    ]
    lines += [
        (101.0 + i, f"[2026-11-30 17:00:0{i}] Gracefully exiting... Remaining number of requests {n}. "
                    f"Remaining requests remaining_rids={['r'] * n}.")
        for i, n in enumerate(counts)
    ]  # fmt: skip
    return lines + [(120.0, m) for m in extra]


def test_a_drain_that_finishes_cuts_nothing():
    a = server_drain.drain_account(2, journal(2, 1, 0), DRAINED)
    assert a["cut"] == 0 and a["drain_remaining"] == [2, 1, 0] and a["in_flight_at_stop"] == 2
    assert a["stop_result"] == "success" and a["exit"] == {"code": "1", "status": "137"}
    assert a["how"].startswith("drained")


def test_a_stop_timeout_cuts_what_the_drain_still_held():
    # KillMode=control-group: the schedulers died, the count never falls, systemd kills at TimeoutStopSec
    a = server_drain.drain_account(1, journal(1, 1, 1, 1), TIMED_OUT)
    assert a["cut"] == 1 and "stop-sigterm timed out" in a["how"]


def test_a_stop_without_any_drain_cuts_everything_in_flight():
    a = server_drain.drain_account(3, [(1.0, "Load weight end.")], {"result": "success"})
    assert a["cut"] == 3 and "without a drain" in a["how"]
    assert server_drain.drain_account(0, [], {"result": "success"})["cut"] == 0  # idle server stopped while loading


def test_a_forced_exit_cuts_everything_in_flight():
    forced = "Signal SIGTERM received while force shutdown flag set. Force exiting."
    assert server_drain.drain_account(2, journal(extra=[forced]), DRAINED)["cut"] == 2


def test_unknown_in_flight_stays_unknown():
    assert server_drain.drain_account(None, [], {"result": "success"})["cut"] is None
    assert server_drain.drain_account(None, journal(0), DRAINED)["cut"] == 0
    idle = server_drain.drain_account(None, [], {"result": "success"}, was_active=False)
    assert (idle["in_flight_at_stop"], idle["cut"]) == (0, 0)  # nothing was running: nothing in flight


def test_engine_load_prefers_v1_loads_then_metrics():
    calls = []

    def fake(answers):
        def get(url):
            calls.append(url.rsplit("/", 1)[-1])
            return answers[url.rsplit("/", 1)[-1]]

        return get

    loads = '{"aggregate": {"total_running_reqs": 2, "total_waiting_reqs": 1, "total_reqs": 3}}'
    r = server_drain.engine_load("http://x:8000", http_get=fake({"loads?include=core": (200, loads, 0.0)}))
    assert r == {"in_flight": 3, "running": 2, "waiting": 1, "source": "/v1/loads"}
    metrics = 'sglang:num_running_reqs{model_name="m"} 4.0\nsglang:num_queue_reqs{model_name="m"} 2.0\n'
    r = server_drain.engine_load(
        "http://x:8000", http_get=fake({"loads?include=core": (404, "Not Found", 0.0), "metrics": (200, metrics, 0.0)})
    )
    assert r == {"in_flight": 6, "running": 4, "waiting": 2, "source": "/metrics"}
    r = server_drain.engine_load(
        "http://x:8000",
        http_get=fake({"loads?include=core": (0, "refused", 0.0), "metrics": (404, '{"detail":"Not Found"}', 0.0)}),
    )
    assert r["in_flight"] is None and "/v1/loads: HTTP 0 refused" in r["error"] and "/metrics: HTTP 404" in r["error"]


def test_engine_load_counts_a_running_request_of_the_simulated_engine(tmp_path):
    sim = Sim(tmp_path, ["--api-key", "k-123"], env={"SGLANG_SIM_TOKENS_PER_S": "50"}).start()
    try:
        sim.wait_ready()
        headers = {"Authorization": "Bearer k-123"}
        url = f"http://127.0.0.1:{sim.port}"
        assert server_drain.engine_load(url, headers)["in_flight"] == 0
        body = {"text": "x", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
        t = threading.Thread(target=lambda: sim.post("/generate", body, headers=headers))
        t.start()
        time.sleep(0.3)
        assert server_drain.engine_load(url, headers) == {
            "in_flight": 1,
            "running": 1,
            "waiting": 0,
            "source": "/v1/loads",
        }
        # the key is needed, as for every path but /health
        assert server_drain.engine_load(url, {})["in_flight"] is None
        t.join(timeout=10)
    finally:
        sim.stop()
