"""The drain and the health check of fleet_router_workers (one module run on the gateway host per worker): the
worker's own requests are read as SGLang 0.5.9's GET /v1/loads answers them, waited on until 0 within the bound,
and a worker whose /health is not 200 is never added to the router."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.gpufleet.fleet.plugins.modules import fleet_router_workers as frw
from module_runner import run_module  # tests/support


def loads_answer(total: int) -> dict:
    """The shape of SGLang 0.5.9's get_loads JSON (one DP rank; lab/sglang-sim answers the same)."""
    load = {"dp_rank": 0, "num_running_reqs": total, "num_waiting_reqs": 0, "num_total_reqs": total}
    return {"dp_rank_count": 1, "loads": [load], "aggregate": {"total_running_reqs": total, "total_reqs": total}}


@pytest.fixture
def worker():
    """A loopback HTTP endpoint answering /v1/loads from a script of counts (the last one repeats) and /health."""
    state = {"counts": [0], "health": 200, "gets": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            state["gets"].append(self.path)
            if self.path == "/health":
                self.send_response(state["health"])
                self.end_headers()
                return
            count = state["counts"].pop(0) if len(state["counts"]) > 1 else state["counts"][0]
            body = json.dumps(loads_answer(count)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()


def test_requests_are_read_from_the_aggregate_or_summed_over_dp_ranks():
    assert frw.running_requests(loads_answer(3)) == 3
    two_ranks = {"loads": [{"num_running_reqs": 1, "num_total_reqs": 2}, {"num_running_reqs": 4}]}
    assert frw.running_requests(two_ranks) == 6
    assert frw.running_requests({"unexpected": True}) is None
    assert frw.running_requests(None) is None


def test_the_drain_waits_until_the_workers_own_requests_are_0(worker):
    worker["counts"] = [2, 1, 0]
    slept = []
    result = frw.drain(worker["url"], 2, 30, 5, sleep=slept.append)
    assert result["in_flight_at_removal"] == 2
    assert result["in_flight_left"] == 0 and result["timed_out"] is False
    assert slept == [1, 1]  # read every second: 2, 1, then 0
    assert worker["gets"] == ["/v1/loads"] * 3


def test_a_drain_that_does_not_end_is_bounded_and_says_so(worker):
    worker["counts"] = [1]
    result = frw.drain(worker["url"], 1, 3, 5, sleep=lambda s: None)
    assert result["timed_out"] is True and result["in_flight_left"] == 1
    assert len(worker["gets"]) == 4  # the first read and one a second for 3 s


def test_a_worker_that_stops_answering_ends_the_drain_without_a_timeout():
    result = frw.drain("http://127.0.0.1:9", 1, 30, 1, sleep=lambda s: None)  # nothing listens on port 9
    assert result == {**result, "in_flight_left": None, "timed_out": False}


def test_a_worker_whose_health_is_not_200_is_never_added(worker, capsys):
    """The module fails before any POST (the endpoint stands in for the router too: it lists no worker and
    answers no POST, so a POST would fail with another message)."""
    worker["health"] = 503
    args = {"api_url": worker["url"], "api_key": "k", "state": "present", "urls": [worker["url"]], "health_timeout": 5}
    result, failed = run_module("ansible_collections.gpufleet.fleet.plugins.modules.fleet_router_workers", args, capsys)
    assert failed and result["in_router"] is False
    assert f"not added to the router: {worker['url']}/health answered 503" in result["msg"]
    assert worker["gets"] == ["/workers", "/health"]
