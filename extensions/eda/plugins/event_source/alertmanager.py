"""gpufleet.fleet.alertmanager: an event source for ansible-rulebook that receives Alertmanager's webhook.

Alertmanager POSTs its webhook payload (version 4: ``version``, ``groupKey``, ``truncatedAlerts``, ``status``,
``receiver``, ``groupLabels``, ``commonLabels``, ``commonAnnotations``, ``externalURL``, ``alerts[]``; Alertmanager
0.25.0 notify/webhook/webhook.go:65-93, template/template.go:238-258) to ``http://<host>:<port>/<endpoint>``. Each
alert of the payload becomes one event on the rulebook's queue::

    {"alert": {"status": "firing", "labels": {...}, "annotations": {...}, "startsAt": ..., "endsAt": ...,
               "fingerprint": ...},
     "alertmanager": {"receiver": ..., "status": ..., "groupKey": ..., "externalURL": ...},
     "meta": {"hosts": ["gpufleet-02"]}}

``meta.hosts`` is the alert's ``instance`` label without a port (ansible-rulebook limits a run_playbook action to the
event's hosts), as the ``ansible.eda.alertmanager`` source does (event-driven-ansible
extensions/eda/plugins/event_source/alertmanager.py:72-151); ``ansible.eda`` is not on PyPI, so the collection ships
its own. It answers 202 to a payload it took, 400 to one that is not Alertmanager's, 401 when ``token`` is set and
the request does not carry it as a bearer token (Alertmanager's ``http_config.authorization``), 404 elsewhere.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from typing import Any

from aiohttp import web

DOCUMENTATION = r"""
---
short_description: Receive Alertmanager's webhook and put one event per alert on the rulebook's queue.
description:
  - An HTTP endpoint for Alertmanager's webhook receiver (payload version 4). Each alert becomes an event
    C({alert, alertmanager, meta: {hosts}}); meta.hosts is the alert's instance label without a port.
options:
  host:
    description: Address to listen on.
    type: str
    default: 127.0.0.1
  port:
    description: TCP port to listen on.
    type: int
    default: 5000
  endpoint:
    description: URL path (without the leading slash) Alertmanager posts to.
    type: str
    default: alerts
  token:
    description:
      - Bearer token the request must carry (Alertmanager's http_config authorization credentials). Empty, any
        request is taken. Pass it from a vault or the environment, never in the rulebook itself.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Remediation
  hosts: sglang_servers
  sources:
    - gpufleet.fleet.alertmanager:
        host: 127.0.0.1
        port: 5000
        endpoint: alerts
  rules:
    - name: Print each firing alert
      condition: event.alert.status == "firing"
      action:
        debug:
"""

PAYLOAD_KEYS = ("receiver", "status", "groupKey", "externalURL")


class NotAlertmanager(ValueError):
    """A body that is not an Alertmanager webhook payload (version 4)."""


def host_of(instance: str) -> str:
    """The inventory host of an instance label: ``gpufleet-02:9100`` -> ``gpufleet-02``, ``[fd00::2]:9100`` ->
    ``fd00::2``; a bare name is itself."""
    m = re.fullmatch(r"\[([^\]]+)\](?::\d+)?|([^:]+)(?::\d+)?", instance.strip())
    if not m:
        return instance.strip()
    return m.group(1) or m.group(2)


def events(payload: Any) -> list[dict]:
    """The events of one webhook payload, one per alert (NotAlertmanager for anything else)."""
    if (
        not isinstance(payload, dict)
        or str(payload.get("version")) != "4"
        or not isinstance(payload.get("alerts"), list)
    ):
        raise NotAlertmanager("not an Alertmanager webhook payload (version 4 with alerts)")
    common = {k: payload.get(k) for k in PAYLOAD_KEYS}
    out = []
    for alert in payload["alerts"]:
        if not isinstance(alert, dict) or not isinstance(alert.get("labels"), dict):
            raise NotAlertmanager("an alert without labels")
        instance = alert["labels"].get("instance", "")
        event = {"alert": alert, "alertmanager": common, "meta": {}}
        if instance:
            event["meta"]["hosts"] = [host_of(instance)]
        out.append(event)
    return out


def app(queue: asyncio.Queue, endpoint: str = "alerts", token: str = "") -> web.Application:
    async def receive(request: web.Request) -> web.Response:
        if token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return web.Response(status=401, text="unauthorized\n")
        try:
            found = events(await request.json())
        except (ValueError, json.JSONDecodeError) as exc:
            return web.Response(status=400, text=f"{exc}\n")
        # Answered at once, queued in the background: the rulebook takes its next event only after its current
        # action (a playbook run, sequential), and Alertmanager would time the webhook out meanwhile and send again.
        for event in found:
            task = asyncio.get_running_loop().create_task(queue.put(event))
            pending.add(task)
            task.add_done_callback(pending.discard)
        return web.Response(status=202, text=f"{len(found)} event(s)\n")

    pending: set[asyncio.Task] = set()
    application = web.Application()
    application.router.add_post(f"/{endpoint.strip('/')}", receive)
    return application


async def main(queue: asyncio.Queue, args: dict[str, Any]) -> None:
    """ansible-rulebook's entry point: serve until the rulebook stops."""
    runner = web.AppRunner(app(queue, str(args.get("endpoint", "alerts")), str(args.get("token") or "")))
    await runner.setup()
    site = web.TCPSite(runner, str(args.get("host", "127.0.0.1")), int(args.get("port", 5000)))
    await site.start()
    try:
        await asyncio.Future()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    # Run alone: print the events of what Alertmanager posts (python alertmanager.py [port]).
    import sys

    class PrintQueue(asyncio.Queue):
        async def put(self, item: dict) -> None:
            print(json.dumps(item), flush=True)

    asyncio.run(main(PrintQueue(), {"port": int(sys.argv[1]) if len(sys.argv) > 1 else 5000}))
