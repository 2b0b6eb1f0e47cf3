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


def serving(handler, state: dict):
    """Serve the handler on a loopback port while the fixture's test runs; state["url"] is its address."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()


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

    yield from serving(Handler, state)


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


@pytest.fixture
def router():
    """A loopback stand-in for smg's worker API (GET/POST /workers, DELETE /workers/<id>): a POSTed worker is listed
    healthy at once, a deleted one is gone at once (the real router takes seconds; the module waits for the list)."""
    state = {"workers": {}, "calls": []}

    class Handler(BaseHTTPRequestHandler):
        def answer(self, status, body=None):
            data = json.dumps(body or {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's names)
            state["calls"].append(("GET", self.path))
            workers = [{"id": i, "url": u, "is_healthy": True, "status": "ready"} for i, u in state["workers"].items()]
            self.answer(200, {"workers": workers})

        def do_POST(self):  # noqa: N802
            url = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["url"]
            state["calls"].append(("POST", url))
            state["workers"][f"id-{len(state['calls'])}"] = url
            self.answer(202)

        def do_DELETE(self):  # noqa: N802
            worker_id = self.path.rsplit("/", 1)[1]
            state["calls"].append(("DELETE", state["workers"].pop(worker_id, worker_id)))
            self.answer(202)

        def log_message(self, *args):
            pass

    yield from serving(Handler, state)


MODULE = "ansible_collections.gpufleet.fleet.plugins.modules.fleet_router_workers"


def test_a_batch_is_added_back_in_one_run_leaving_out_the_unhealthy_worker(router, worker, capsys):
    """One module run for a rollout batch: the worker whose /health answers 200 goes back into the router, the one
    that does not (a failed host) is left out and named; the run does not fail for it."""
    down = "http://127.0.0.1:9"  # nothing listens: a host whose server is not up
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"], down],
            "health_timeout": 2, "leave_out_unhealthy": True}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert result["in_router_urls"] == [worker["url"]] and result["left_out"] == {down: 0}
    assert result["in_router"] is False  # not every URL asked for is in the router
    assert [c for c in router["calls"] if c[0] == "POST"] == [("POST", worker["url"])]


def test_without_leave_out_one_unhealthy_worker_fails_the_run_and_adds_none(router, worker, capsys):
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"], "http://127.0.0.1:9"],
            "health_timeout": 2}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert failed and "http://127.0.0.1:9/health answered nothing" in result["msg"]
    assert not [c for c in router["calls"] if c[0] == "POST"]


def test_a_batch_is_taken_out_in_one_run_and_its_workers_drain_together(router, worker, capsys):
    other = "http://127.0.0.1:9"
    router["workers"].update({"a": worker["url"], "b": other})
    worker["counts"] = [2, 1, 0]  # read before the DELETE, then once a second
    args = {"api_url": router["url"], "api_key": "k", "state": "absent", "urls": [worker["url"], other],
            "drain_timeout": 10}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert sorted(r["url"] for r in result["removed"]) == sorted([worker["url"], other])
    assert router["workers"] == {}
    assert result["drain"][worker["url"]]["in_flight_at_removal"] == 2
    assert result["drain"][worker["url"]]["in_flight_left"] == 0
    assert result["drain"][other] == {"in_flight_at_removal": None, "waited_s": result["drain"][other]["waited_s"],
                                      "in_flight_left": None, "timed_out": False}  # fmt: skip


def test_drain_all_reads_every_worker_in_each_round(worker):
    worker["counts"] = [1, 1, 0]
    slept = []
    result = frw.drain_all({worker["url"]: 1, "http://127.0.0.1:9": 0}, 10, 2, sleep=slept.append)
    assert result[worker["url"]]["in_flight_left"] == 0 and slept == [1, 1]
    assert result["http://127.0.0.1:9"]["in_flight_left"] is None
