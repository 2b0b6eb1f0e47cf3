"""extensions/eda/plugins/event_source/alertmanager.py: Alertmanager's webhook (payload version 4, the fields of
Alertmanager 0.25.0's notify/webhook/webhook.go) becomes one rulebook event per alert, over real HTTP (aiohttp)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

SOURCE = Path(__file__).resolve().parents[3] / "extensions/eda/plugins/event_source/alertmanager.py"
spec = importlib.util.spec_from_file_location("gpufleet_eda_alertmanager", SOURCE)
am = importlib.util.module_from_spec(spec)
spec.loader.exec_module(am)


def alert(name: str, instance: str, status: str = "firing", **labels) -> dict:
    return {
        "status": status,
        "labels": {"alertname": name, "instance": instance, "job": "node", "severity": "critical", **labels},
        "annotations": {"summary": f"{name} on {instance}"},
        "startsAt": "2026-12-07T05:00:00.000Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://mon-01:9090/graph?g0.expr=...",
        "fingerprint": "3b0f6f4c1a2e9d7c",
    }


def payload(*alerts: dict) -> dict:
    """A webhook body as Alertmanager 0.25 sends it (webhook.Message: template.Data + version, groupKey,
    truncatedAlerts)."""
    return {
        "receiver": "gpufleet",
        "status": "firing",
        "alerts": list(alerts),
        "groupLabels": {"alertname": alerts[0]["labels"]["alertname"], "instance": alerts[0]["labels"]["instance"]},
        "commonLabels": alerts[0]["labels"],
        "commonAnnotations": alerts[0]["annotations"],
        "externalURL": "http://mon-01:9093",
        "version": "4",
        "groupKey": '{}:{alertname="GpufleetLivenessGaveUp", instance="gpufleet-02"}',
        "truncatedAlerts": 0,
    }


def test_each_alert_is_an_event_limited_to_its_host():
    body = payload(alert("GpufleetLivenessGaveUp", "gpufleet-02", unit="sglang-server.service"),
                   alert("GpufleetGpuFatalXid", "10.0.0.12:9100", code="79", gpu="3"))  # fmt: skip
    first, second = am.events(body)
    assert first["alert"]["labels"]["alertname"] == "GpufleetLivenessGaveUp"
    assert first["meta"] == {"hosts": ["gpufleet-02"]}
    assert second["meta"] == {"hosts": ["10.0.0.12"]} and second["alert"]["labels"]["code"] == "79"
    assert first["alertmanager"] == {"receiver": "gpufleet", "status": "firing",
                                     "groupKey": body["groupKey"], "externalURL": "http://mon-01:9093"}  # fmt: skip


def test_an_alert_about_no_host_has_no_meta_hosts():
    (event,) = am.events(payload(alert("GpufleetRouterWorkersBelowBudget", "")))
    assert event["meta"] == {}


@pytest.mark.parametrize(
    ("instance", "host"),
    [("gpufleet-02", "gpufleet-02"), ("gpufleet-02:9100", "gpufleet-02"), ("10.0.0.12:8000", "10.0.0.12"),
     ("[fd00::2]:9100", "fd00::2")],
)  # fmt: skip
def test_the_host_is_the_instance_without_its_port(instance, host):
    assert am.host_of(instance) == host


@pytest.mark.parametrize(
    "body", [{}, [], {"version": "3", "alerts": []}, {"version": "4"}, {"version": "4", "alerts": [1]}]
)
def test_what_is_not_alertmanagers_is_refused(body):
    with pytest.raises(am.NotAlertmanager):
        am.events(body)


async def _client(token: str = "") -> tuple[TestClient, asyncio.Queue]:
    queue: asyncio.Queue = asyncio.Queue()
    client = TestClient(TestServer(am.app(queue, "alerts", token)))
    await client.start_server()
    return client, queue


def test_the_endpoint_takes_a_payload_and_queues_its_events():
    async def run():
        client, queue = await _client()
        try:
            body = payload(alert("GpufleetLivenessGaveUp", "gpufleet-02"), alert("GpufleetGpuHot", "gpufleet-01"))
            resp = await client.post("/alerts", data=json.dumps(body), headers={"Content-Type": "application/json"})
            assert resp.status == 202 and await resp.text() == "2 event(s)\n"
            got = [await asyncio.wait_for(queue.get(), 5) for _ in range(2)]
            assert [e["meta"]["hosts"] for e in got] == [["gpufleet-02"], ["gpufleet-01"]]
            assert (await client.post("/alerts", data="not json")).status == 400
            assert (await client.post("/alerts", data=json.dumps({"version": "4"}))).status == 400
            assert (await client.post("/other", data=json.dumps(body))).status == 404
            await asyncio.sleep(0)  # nothing queued in the background either
            assert queue.qsize() == 0
        finally:
            await client.close()

    asyncio.run(run())


def test_with_a_token_only_alertmanagers_bearer_is_taken():
    async def run():
        client, queue = await _client(token="s3cret-token")
        try:
            body = json.dumps(payload(alert("GpufleetLivenessGaveUp", "gpufleet-02")))
            assert (await client.post("/alerts", data=body)).status == 401
            wrong = {"Authorization": "Bearer other"}
            assert (await client.post("/alerts", data=body, headers=wrong)).status == 401
            ok = {"Authorization": "Bearer s3cret-token"}
            assert (await client.post("/alerts", data=body, headers=ok)).status == 202
            assert (await asyncio.wait_for(queue.get(), 5))["meta"] == {"hosts": ["gpufleet-02"]}
            assert queue.qsize() == 0
        finally:
            await client.close()

    asyncio.run(run())
