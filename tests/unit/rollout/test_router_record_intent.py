"""The gateway's record is the intent (fleet_router_workers with workers_file): an add or a removal that finds the
router down still updates the record, which the router's launcher starts smg with, so the gateway serves what the
product intended once it is back; the run fails and says what the record now holds."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from module_runner import run_module  # tests/support

MODULE = "ansible_collections.gpufleet.fleet.plugins.modules.fleet_router_workers"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def healthy_worker():
    """A worker whose /health answers 200 (the check the module makes before it records a worker added back)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def args(record, state: str, urls: list[str], **more) -> dict:
    # restart_wait 1: the router does not come back within it (the module waits 30 s for a restart by default)
    return {"api_url": f"http://127.0.0.1:{closed_port()}", "api_key": "router-key-0123456789", "state": state,
            "urls": urls, "workers_file": str(record), "restart_wait": 1, **more}  # fmt: skip


def test_a_worker_added_back_while_the_router_is_down_is_in_its_record(tmp_path, healthy_worker, capsys):
    record = tmp_path / "workers.json"
    other, dead = "http://10.0.0.7:8000", "http://127.0.0.1:9"
    record.write_text(json.dumps({"workers": [other]}))
    result, failed = run_module(
        MODULE, args(record, "present", [healthy_worker, dead], health_timeout=2, leave_out_unhealthy=True), capsys
    )
    assert failed and result["in_router"] is False
    assert "not usable" in result["msg"] and f"now lists {other}, {healthy_worker} for its next start" in result["msg"]
    # the worker whose /health answers joins the record; the one that does not answer is not recorded
    assert json.loads(record.read_text()) == {"workers": sorted([other, healthy_worker])}
    assert result["recorded"] == sorted([other, healthy_worker]) and result["changed"] is True


def test_a_worker_removed_while_the_router_is_down_leaves_its_record(tmp_path, capsys):
    record = tmp_path / "workers.json"
    keep, out = "http://10.0.0.7:8000", "http://10.0.0.8:8000"
    record.write_text(json.dumps({"workers": [keep, out]}))
    result, failed = run_module(MODULE, args(record, "absent", [out]), capsys)
    assert failed and f"now lists {keep} for its next start" in result["msg"], result
    assert json.loads(record.read_text()) == {"workers": [keep]}


def test_a_query_of_a_router_that_is_down_changes_no_record(tmp_path, capsys):
    record = tmp_path / "workers.json"
    record.write_text(json.dumps({"workers": ["http://10.0.0.7:8000"]}))
    result, failed = run_module(MODULE, args(record, "query", []), capsys)
    assert failed and "not usable" in result["msg"] and "record" not in result["msg"]
    assert json.loads(record.read_text()) == {"workers": ["http://10.0.0.7:8000"]}
