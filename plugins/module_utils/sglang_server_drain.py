"""The account of a stop's drain: the requests the engine holds before the stop (``/v1/loads`` or
``/metrics``) and, from the stopped invocation's journal and the unit's state after it, how many the stop cut.
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_http import http


def _metric_sum(text, name):
    total, seen = 0.0, False
    for line in text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", line)
        if m:
            total += float(m.group(1))
            seen = True
    return int(total) if seen else None


def engine_load(base_url, headers=None, timeout=5, http_get=None):
    """Requests the engine holds right now (running + waiting over every DP rank), from SGLang 0.5.9's
    ``GET /v1/loads?include=core`` (``aggregate.total_reqs``; no flag needed), else from ``/metrics``
    (``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``; needs ``--enable-metrics``).
    ``{"in_flight", "running", "waiting", "source"}``; ``in_flight`` None with ``error`` when neither answers."""
    get = http_get or (lambda url: http("GET", url, headers=headers, timeout=timeout))
    errors = []
    status, body, _unused = get(base_url.rstrip("/") + "/v1/loads?include=core")
    if status == 200:
        try:
            agg = json.loads(body)["aggregate"]
            running, waiting = int(agg["total_running_reqs"]), int(agg["total_waiting_reqs"])
            return {"in_flight": running + waiting, "running": running, "waiting": waiting, "source": "/v1/loads"}
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"/v1/loads: unexpected answer ({exc})")
    else:
        errors.append(f"/v1/loads: HTTP {status} {body.strip()[:120]}")
    status, body, _unused = get(base_url.rstrip("/") + "/metrics")
    if status == 200:
        running = _metric_sum(body, "sglang:num_running_reqs")
        waiting = _metric_sum(body, "sglang:num_queue_reqs")
        if running is not None:
            return {"in_flight": running + (waiting or 0), "running": running, "waiting": waiting or 0,
                    "source": "/metrics"}  # fmt: skip
        errors.append("/metrics: no sglang:num_running_reqs")
    else:
        errors.append(f"/metrics: HTTP {status} {body.strip()[:120]}")
    return {"in_flight": None, "running": None, "waiting": None, "source": None, "error": "; ".join(errors)}


# SGLang 0.5.9 TokenizerManager.sigterm_watchdog, every 5 s after SIGTERM until no request remains.
DRAIN_RX = re.compile(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)")
FORCED_RX = re.compile(r"Signal SIGTERM received while (?:force shutdown flag set|health check failed)\. Force exiting")


def drain_account(in_flight_at_stop, entries, stop_state, was_active=True):
    """How a stop went for the requests: in flight at the stop, the drain's own count, how many were cut.

    ``entries``: journal ``[(ts, msg)]`` of the stopped invocation; ``stop_state``: ``unit_state`` after the
    stop. Cut requests are those still open when the server went away: the last count of the drain when
    systemd killed it (Result=timeout: "State 'stop-sigterm' timed out. Killing.") or when it ended without
    finishing the drain; every request in flight when the engine ended without draining at all (SIGTERM
    before its drain handler existed, SGL_FORCE_SHUTDOWN, a failed health check)."""
    remaining = [int(m.group(1)) for _unused, msg in entries for m in [DRAIN_RX.search(msg or "")] if m]
    forced = any(FORCED_RX.search(msg or "") for _unused, msg in entries)
    result = stop_state.get("result", "")
    account = {
        "in_flight_at_stop": in_flight_at_stop,
        "drain_remaining": remaining,
        "stop_result": result,
        "exit": {"code": stop_state.get("exec_main_code", ""), "status": stop_state.get("exec_main_status", "")},
        "cut": None,
    }
    if not was_active:
        account.update(in_flight_at_stop=0, cut=0, how="the server was not running")
    elif result == "timeout":
        cut = remaining[-1] if remaining else in_flight_at_stop
        account.update(cut=cut, how="TimeoutStopSec ran out: systemd killed the server (stop-sigterm timed out)")
    elif forced:
        account.update(cut=in_flight_at_stop, how="the engine force-exited without draining")
    elif remaining and remaining[-1] == 0:
        account.update(cut=0, how="drained: every request finished before the engine exited")
    elif remaining:
        account.update(cut=remaining[-1], how="the engine ended while requests remained")
    else:
        account.update(cut=in_flight_at_stop, how="the engine ended without a drain (no 'Gracefully exiting' line)")
    return account
