"""The drain and the health check of fleet_router_workers (one module run on the gateway host per worker): the
worker's own requests are read as SGLang 0.5.9's GET /v1/loads answers them, waited on until 0 within the bound,
and a worker whose /health is not 200 is never added to the router."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
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
    """A loopback HTTP endpoint answering /v1/loads from a script of counts and /health with a status or a script of
    statuses (the last one of a script repeats)."""
    state = {"counts": [0], "health": 200, "gets": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            state["gets"].append(self.path)
            if self.path == "/health":
                health = state["health"]
                if isinstance(health, list):
                    health = health.pop(0) if len(health) > 1 else health[0]
                self.send_response(health)
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
    args = {"api_url": worker["url"], "api_key": "k", "state": "present", "urls": [worker["url"]], "health_timeout": 5,
            "wait_timeout": 10}  # fmt: skip
    result, failed = run_module("ansible_collections.gpufleet.fleet.plugins.modules.fleet_router_workers", args, capsys)
    assert failed and result["in_router"] is False
    assert f"not added to the router: {worker['url']}/health answered 503" in result["msg"]
    assert worker["gets"] == ["/workers", "/health"]


# smg's answers to a worker ID that is not a UUID and to one it does not know (lightseekorg/smg at commit
# 73da68ca9472, model_gateway/src/worker/service.rs: parse_worker_id, lines 249-256, runs first in delete_worker,
# lines 446-457; InvalidId is 400 BAD_REQUEST and NotFound 404 WORKER_NOT_FOUND, lines 51-72, with the messages of
# lines 78-83, in the body {error, code} of lines 102-109; the text after "Error:" is the uuid crate's there, Python's
# here). Python's uuid.UUID reads the forms Rust's uuid::Uuid::parse_str reads (hyphenated, 32 hex digits, braced,
# urn:uuid:).
def smg_worker_id_error(raw: str, known: bool) -> tuple[int, dict] | None:
    try:
        uuid.UUID(raw)
    except ValueError as exc:
        return 400, {"error": f"Invalid worker_id '{raw}' (expected UUID). Error: {exc}", "code": "BAD_REQUEST"}
    if not known:
        return 404, {"error": f"Worker {raw} not found", "code": "WORKER_NOT_FOUND"}
    return None


def http_health(url: str) -> bool:
    """smg's reachability probe of a worker (model_gateway/src/workflow/steps/util.rs try_http_reachable, lines
    75-91): GET <url>/health, and any 4xx/5xx answer (reqwest's error_for_status) or none at all is a failure."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status < 400
    except OSError:
        return False


@pytest.fixture
def router():
    """A loopback stand-in for smg's worker API (GET/POST /workers, DELETE /workers/<id>), as strict as smg 1.13.0
    where the module depends on it (cited from lightseekorg/smg at commit 73da68ca9472, whose crates say 1.9.0, and
    checked on the 1.13.0 wheel in the lab, docs/fleet-router.md "smg facts"):

    - a call without the control-plane key is answered 401;
    - a POSTed worker (and one smg's launcher re-adds at a start: state["register"](url, delay)) is a registration
      job, answered 202 with the worker's UUID; the job probes the worker's /health and lists it (healthy, under
      that UUID) only once a probe passes, as smg's detect_connection_mode step does (workflow/steps/local/
      detect_connection.rs, lines 55-83), once per check interval for a bounded number of attempts
      (workflow/steps/mod.rs, lines 80-85 and 107-120: at least 3; here one interval is one GET /workers and
      state["probes"] attempts), after which the job fails and the worker is never listed;
    - a POST of a URL it lists or is still registering is answered 409 (WORKER_ALREADY_EXISTS,
      WORKER_CREATE_IN_PROGRESS), as smg 1.13.0 answers it;
    - DELETE /workers/<id>: 400 for an ID that is not a UUID, 404 for a UUID it does not know, else 202; the deleted
      worker is listed as draining (not healthy) for the next state["settle_gets"] GETs, then gone, as smg lists it
      through its settle window (the real router takes seconds; the module waits); a DELETE of a draining worker is
      answered 202 again."""
    state = {"workers": {}, "calls": [], "settle_gets": 0, "draining": {}, "posted": [], "key": "k", "creating": {},
             "probes": 3}  # fmt: skip

    def register(url: str, delay: int = 0) -> str:
        """Start a registration job for ``url``: its first probe after ``delay`` GETs; the worker's UUID."""
        worker_id = str(uuid.uuid4())
        state["creating"][url] = {"id": worker_id, "delay": delay, "probes": state["probes"]}
        return worker_id

    def run_jobs() -> None:
        """One check interval of every registration job in flight: a probe; listed when it passes, dropped when
        its attempts are spent."""
        for url, job in list(state["creating"].items()):
            if job["delay"] > 0:
                job["delay"] -= 1
                continue
            if http_health(url):
                del state["creating"][url]
                state["workers"][job["id"]] = url
                continue
            job["probes"] -= 1
            if job["probes"] <= 0:
                del state["creating"][url]

    state["register"] = register

    class Handler(BaseHTTPRequestHandler):
        def answer(self, status, body=None):
            data = json.dumps(body or {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def refused(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {state['key']}":
                return False
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.answer(401, {"error": {"type": "unauthorized", "message": "Unauthorized"}})
            return True

        def do_GET(self):  # noqa: N802 (http.server's names)
            if self.refused():
                return
            state["calls"].append(("GET", self.path))
            run_jobs()
            workers = [{"id": i, "url": u, "is_healthy": True, "status": "ready"} for i, u in state["workers"].items()]
            for worker_id, (url, left) in list(state["draining"].items()):
                workers.append({"id": worker_id, "url": url, "is_healthy": False, "status": "draining"})
                state["draining"][worker_id] = (url, left - 1)
                if left <= 1:
                    del state["draining"][worker_id]
            self.answer(200, {"workers": workers})

        def do_POST(self):  # noqa: N802
            if self.refused():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            url = body["url"]
            state["calls"].append(("POST", url))
            state["posted"].append(body)
            known = [i for i, u in state["workers"].items() if u == url]
            if known or url in state["creating"]:  # smg 1.13.0: the URL is listed, or its registration job runs
                code = "WORKER_ALREADY_EXISTS" if known else "WORKER_CREATE_IN_PROGRESS"
                self.answer(409, {"error": f"Worker at URL '{url}': {code}", "code": code})
                return
            worker_id = register(url)
            self.answer(202, {"status": "accepted", "worker_id": worker_id, "url": url,
                              "location": f"/workers/{worker_id}"})  # fmt: skip

        def do_DELETE(self):  # noqa: N802
            if self.refused():
                return
            state.get("on_delete", lambda: None)()
            worker_id = self.path.rsplit("/", 1)[1]
            error = smg_worker_id_error(worker_id, worker_id in state["workers"] or worker_id in state["draining"])
            if error:
                state["calls"].append(("DELETE", worker_id))
                self.answer(*error)
                return
            url = state["workers"].pop(worker_id, None) or state["draining"][worker_id][0]
            state["calls"].append(("DELETE", url))
            if state["settle_gets"] and worker_id not in state["draining"]:
                state["draining"][worker_id] = (url, state["settle_gets"])
            self.answer(202, {"status": "accepted", "worker_id": worker_id,
                              "message": "Worker removal queued for background processing"})  # fmt: skip

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
    # the runtime is named: smg 1.13.0 then skips its classification probe (a /health, a second with SGLang)
    assert router["posted"] == [{"url": worker["url"], "runtime": "sglang"}]


def test_a_worker_the_router_lists_healthy_is_not_probed_again(router, worker, capsys):
    """A no-op deploy.yml: the router already lists the worker healthy (its own /health check passed), so the module
    neither waits for another /health (a one-token generation on SGLang) nor posts it again."""
    router["workers"][str(uuid.uuid4())] = worker["url"]
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"]], "health_timeout": 5,
            "leave_out_unhealthy": True}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed and not result["changed"], result
    assert result["in_router_urls"] == [worker["url"]]
    assert worker["gets"] == [] and router["posted"] == []


def test_a_worker_the_restarted_router_is_still_registering_is_waited_for_not_refused(router, worker, capsys):
    """Right after a router restart smg's launcher re-adds the gateway's record: a worker not yet listed is being
    created, and smg 1.13.0 answers a POST of it 409 (WORKER_CREATE_IN_PROGRESS). The module waits for it to be
    listed healthy instead of failing the run (the router's job lists it once its own probe of the worker passes,
    here two GETs after the module's first read)."""
    router["register"](worker["url"], delay=2)
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"]], "health_timeout": 5,
            "leave_out_unhealthy": True}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert result["in_router"] is True and result["in_router_urls"] == [worker["url"]]
    assert [c for c in router["calls"] if c[0] == "POST"] == [("POST", worker["url"])]


def test_a_worker_the_restarted_routers_probe_never_reaches_is_not_reported_in_the_router(router, worker, capsys):
    """smg's launcher re-adds the gateway's record at a start; a worker whose /health fails every probe of that
    registration job is never listed (smg's job gives up after its attempts). The module, told the URL is being
    created (409), waits for it and fails naming it: it never reports a worker in the router that the router left
    out."""
    worker["health"] = 503
    router["register"](worker["url"], delay=1)
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"]],
            "wait_timeout": 3}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert failed and result["in_router"] is False, result
    assert f"not healthy in its list: {worker['url']}" in result["msg"]
    assert router["workers"] == {} and router["creating"] == {}  # the job gave up: nothing listed
    assert worker["gets"].count("/health") == router["probes"]


def test_a_worker_that_answers_only_after_the_post_is_added_once_the_routers_probe_passes(router, worker, capsys):
    """smg's registration job probes a posted worker again at its check interval until a probe passes: a server
    whose /health answers 503 at the first probe and 200 at the next is added, and the module reports it in."""
    worker["health"] = [503, 200]
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"]],
            "wait_timeout": 10}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert result["in_router"] is True and result["in_router_urls"] == [worker["url"]]
    assert worker["gets"] == ["/health", "/health"]  # the router's two probes (the module's health_timeout is 0)


def test_the_stand_in_answers_deletes_as_smg_does(router):
    """DELETE /workers/<id>: 400 BAD_REQUEST for an ID that is not a UUID, 404 WORKER_NOT_FOUND for a UUID the router
    does not know, 202 for a listed worker and again while it drains (smg's worker/service.rs, cited above)."""
    worker_id, unknown = str(uuid.uuid4()), str(uuid.uuid4())
    router["workers"][worker_id] = "http://127.0.0.1:9"
    router["settle_gets"] = 5

    def delete(raw):
        req = urllib.request.Request(f"{router['url']}/workers/{raw}", method="DELETE")
        req.add_header("Authorization", "Bearer k")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = delete("a")
    assert status == 400 and body["code"] == "BAD_REQUEST"
    assert body["error"].startswith("Invalid worker_id 'a' (expected UUID). Error: ")
    assert delete(unknown) == (404, {"error": f"Worker {unknown} not found", "code": "WORKER_NOT_FOUND"})
    assert delete(worker_id)[0] == 202 and router["draining"] == {worker_id: ("http://127.0.0.1:9", 5)}
    assert delete(worker_id)[0] == 202  # queued already: accepted again
    assert router["workers"] == {}


def test_without_leave_out_one_unhealthy_worker_fails_the_run_and_adds_none(router, worker, capsys):
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"], "http://127.0.0.1:9"],
            "health_timeout": 2}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert failed and "http://127.0.0.1:9/health answered nothing" in result["msg"]
    assert not [c for c in router["calls"] if c[0] == "POST"]


def test_a_batch_is_taken_out_in_one_run_and_its_workers_drain_together(router, worker, capsys):
    other = "http://127.0.0.1:9"
    router["workers"].update({str(uuid.uuid4()): worker["url"], str(uuid.uuid4()): other})
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


def test_a_removed_worker_listed_as_draining_is_out_and_its_drain_starts_at_once(router, worker, capsys):
    """smg 1.13.0 lists a deleted worker as draining (its policies select it no more) for its settle window of 5 s:
    the removal does not wait for the worker to leave the list before the drain of the worker's own requests."""
    router["settle_gets"] = 100  # longer than the run: the worker stays listed as draining
    router["workers"][str(uuid.uuid4())] = worker["url"]
    args = {"api_url": router["url"], "api_key": "k", "state": "absent", "urls": [worker["url"]], "drain_timeout": 5,
            "wait_timeout": 3}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert result["draining"] == [worker["url"]]
    assert result["drain"][worker["url"]]["in_flight_left"] == 0
    assert router["draining"]  # the router still lists it


def test_a_worker_still_draining_is_added_back_only_after_the_router_dropped_it(router, worker, capsys):
    """A POST for a URL the router still lists as draining would race its removal: the module waits until it is gone
    (three more GETs here), then posts it and waits until it is healthy."""
    router["settle_gets"] = 3
    router["workers"][str(uuid.uuid4())] = worker["url"]
    out, failed = run_module(MODULE, {"api_url": router["url"], "api_key": "k", "state": "absent",
                                      "urls": [worker["url"]]}, capsys)  # fmt: skip
    assert not failed and out["draining"] == [worker["url"]]
    router["calls"].clear()
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"]], "health_timeout": 5,
            "wait_timeout": 10}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert result["added"] == [worker["url"]] and result["in_router_urls"] == [worker["url"]]
    post = router["calls"].index(("POST", worker["url"]))
    assert router["calls"][:post] == [("GET", "/workers")] * 3  # listed as draining twice, then gone: then the POST


def test_the_workers_health_is_checked_concurrently(router, capsys):
    """SGLang's /health answers after a one-token generation (at least a second): a batch's workers are checked at
    once. Each stand-in worker answers 200 only once all three checks are in flight together (else 503 after 5 s),
    so checks made one after another leave every worker out. (The router's own probe of a posted worker comes later:
    once the three were in flight together, a worker answers.)"""
    barrier = threading.Barrier(3, timeout=5)
    met = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            try:
                if not met.is_set():
                    barrier.wait()
                    met.set()
                status = 200
            except threading.BrokenBarrierError:
                status = 503
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(3)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{server.server_address[1]}" for server in servers]
    try:
        args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": urls, "health_timeout": 10,
                "leave_out_unhealthy": True}  # fmt: skip
        result, failed = run_module(MODULE, args, capsys)
    finally:
        for server in servers:
            server.shutdown()
    assert not failed, result
    assert result["left_out"] == {} and sorted(result["in_router_urls"]) == sorted(urls)


def test_a_call_without_the_control_plane_key_fails_naming_the_answer(router, worker, capsys):
    """smg 1.13.0 answers 401 to a worker-API call without the admin key: the module fails and says so; nothing is
    posted."""
    args = {"api_url": router["url"], "api_key": "not-the-key", "state": "present", "urls": [worker["url"]],
            "health_timeout": 5}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert failed and "401" in result["msg"], result
    assert router["posted"] == []


def test_the_servers_key_goes_with_each_post(router, worker, capsys):
    """With worker_api_key (the servers' API key) smg is given it with the worker (WorkerSpec.api_key), never shown."""
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": [worker["url"]], "health_timeout": 5,
            "worker_api_key": "server-key-123"}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert router["posted"] == [{"url": worker["url"], "runtime": "sglang", "api_key": "server-key-123"}]
    assert "server-key-123" not in json.dumps(result)


def test_a_runtime_the_router_does_not_know_is_refused_before_any_call(router, capsys):
    """smg 1.13.0 answers 400 to an unknown runtime; the module refuses it itself, naming the choices, before it calls
    the router at all."""
    args = {"api_url": router["url"], "api_key": "k", "state": "present", "urls": ["http://127.0.0.1:9"],
            "runtime": "sglang-0.5"}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert failed and "runtime" in result["msg"] and "sglang, vllm" in result["msg"], result
    assert router["calls"] == []


def test_the_worker_record_follows_every_add_and_removal(router, worker, capsys, tmp_path):
    """The gateway's record of the workers that should be in the router (read by the router's launcher at every
    start): a present adds the workers healthy in the router at the end (not one left out for its /health), an absent
    takes its workers out of the record before its DELETE, so a router restart at any moment after the removal
    starts without them."""
    record = tmp_path / "smg-router" / "workers.json"
    down = "http://127.0.0.1:9"
    seen_at_delete = []
    router["on_delete"] = lambda: seen_at_delete.append(json.loads(record.read_text())["workers"])
    base = {"api_url": router["url"], "api_key": "k", "workers_file": str(record)}
    result, failed = run_module(MODULE, {**base, "state": "present", "urls": [worker["url"], down],
                                         "health_timeout": 2, "leave_out_unhealthy": True}, capsys)  # fmt: skip
    assert not failed, result
    assert json.loads(record.read_text()) == {"workers": [worker["url"]]} and result["recorded"] == [worker["url"]]
    assert oct(record.stat().st_mode & 0o777) == "0o644"  # the router reads it as its own user
    # the same again: nothing to add, the record unchanged: changed false
    result, failed = run_module(MODULE, {**base, "state": "present", "urls": [worker["url"]]}, capsys)
    assert not failed and result["changed"] is False, result
    result, failed = run_module(MODULE, {**base, "state": "query"}, capsys)
    assert result["recorded"] == [worker["url"]] and result["changed"] is False
    result, failed = run_module(MODULE, {**base, "state": "absent", "urls": [worker["url"]]}, capsys)
    assert not failed and result["changed"] is True, result
    assert seen_at_delete == [[]]  # out of the record before the router was asked to remove it
    assert json.loads(record.read_text()) == {"workers": []} and result["recorded"] == []


def test_exclusive_makes_the_record_exactly_the_healthy_workers(router, worker, capsys, tmp_path):
    record = tmp_path / "workers.json"
    record.write_text(json.dumps({"workers": ["http://10.0.0.9:8000"]}))
    args = {"api_url": router["url"], "api_key": "k", "workers_file": str(record), "state": "present",
            "urls": [worker["url"]], "exclusive": True}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert not failed, result
    assert json.loads(record.read_text()) == {"workers": [worker["url"]]}


def test_a_record_that_is_not_a_worker_record_fails_before_any_router_call(router, capsys, tmp_path):
    record = tmp_path / "workers.json"
    record.write_text('["http://10.0.0.9:8000"]')
    # a key of more than one letter: Ansible masks a no_log value wherever it appears in the result
    args = {"api_url": router["url"], "api_key": "router-key-0123456789", "workers_file": str(record),
            "state": "absent", "urls": ["http://10.0.0.9:8000"]}  # fmt: skip
    result, failed = run_module(MODULE, args, capsys)
    assert failed and f"worker record not readable: {record} is not a worker record" in result["msg"], result
    assert router["calls"] == []


def test_a_router_that_restarts_is_waited_for_within_the_bound():
    """A router restarted by systemd does not listen for a second or two: an API call is tried again (every 0.5 s,
    restart_wait seconds in all) instead of failing the rollout's step; past the bound the refusal is raised."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            data = json.dumps({"workers": []}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    def start_later():
        time.sleep(1.2)
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        started.append(server)
        server.serve_forever()

    started: list = []
    with pytest.raises(OSError):
        frw.Router(f"http://127.0.0.1:{port}", "k", 2, restart_wait=0).call("GET", "/workers")
    threading.Thread(target=start_later, daemon=True).start()
    router = frw.Router(f"http://127.0.0.1:{port}", "k", 2, restart_wait=10)
    try:
        assert router.workers() == []
    finally:
        for server in started:
            server.shutdown()
    assert 1.0 <= router.waited_s <= 3.0
    # a POST whose connection was dropped may have been applied: never sent again
    assert frw.router_down(ConnectionRefusedError(), "POST") is True
    assert frw.router_down(http.client.RemoteDisconnected(), "POST") is False
    assert frw.router_down(http.client.RemoteDisconnected(), "GET") is True
