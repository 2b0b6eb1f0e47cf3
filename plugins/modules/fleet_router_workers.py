#!/usr/bin/python
"""Register workers with the Shepherd Model Gateway (smg) or remove them, through its REST worker API."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_router_workers
short_description: Add, remove or list the workers of a Shepherd Model Gateway (smg) router
author: gpufleet maintainers (!UNKNOWN)
description:
  - Talks to the router's worker-management API (smg 1.13.0 C(GET|POST /workers), C(DELETE /workers/<uuid>))
    with a control-plane key (an C(Authorization) header with C(Bearer <key>)).
  - C(POST /workers) answers 202 and registers the worker in the background only once the worker answers;
    C(DELETE) is asynchronous too. The module waits (bounded by I(wait_timeout)) until the router's list
    shows the wanted state, so a worker added here is healthy in the router when the module returns.
  - A removed worker counts as out once the router lists it with status C(draining). smg 1.13.0 moves it there
    at the C(DELETE) and its policies select it no more; it drops from the list after the router's settle
    window (C(--drain-settle-secs), 5 s, a fixed sleep that does not look at the worker's requests; smg
    C(workflow/steps/local/drain_workers.rs)). A worker asked to be present while still listed as C(draining)
    is posted only once the router has dropped it.
  - The workers' C(/health) and C(/v1/loads) are read concurrently (SGLang's C(/health) runs a one-token
    generation and answers after at least a second), so a batch of workers costs the time of one.
  - Run it on the gateway host (the router API is reached on I(api_url), usually 127.0.0.1).
  - >-
    With I(workers_file), the gateway's record of the workers that should be in the router is kept beside it;
    every worker removed here leaves the record before its C(DELETE), every worker healthy in the router after a
    C(present) joins it. When the router's API does not answer, the record still takes the intent (C(absent) drops
    the URLs, C(present) adds those whose C(/health) answers 200 with I(health_timeout)) and the module fails saying
    so: the router's next start serves the intended workers. The router's launcher starts smg with the recorded
    workers (C(--worker-urls)), so a router restart (a crash, an OOM kill, a reboot) comes back serving them without
    Ansible, and a worker a rollout took out stays out.
options:
  api_url: {type: str, default: "http://127.0.0.1:30000", description: Router base URL.}
  api_key: {type: str, required: true, description: Control-plane key (admin role).}
  state:
    type: str
    choices: [present, absent, query]
    default: query
    description: >-
      present adds I(urls) and waits until healthy; absent removes them and waits until the router routes
      nothing more to them (gone from its list, or listed as draining).
  urls: {type: list, elements: str, default: [], description: Worker URLs (http://host:port).}
  exclusive: {type: bool, default: false, description: "With present, remove every other worker."}
  worker_api_key:
    type: str
    default: ""
    description:
      - >-
        The servers' API key, sent with each C(POST /workers) (smg 1.13.0's C(api_key) of a worker, crates/protocols
        C(WorkerSpec)); smg uses it to read the worker's model information and to call it. Without it a server with
        an API key is listed but no request for its model reaches it (smg answers 404 C(model_not_found)).
  runtime:
    type: str
    default: sglang
    choices: [unspecified, sglang, vllm, trtllm, mlx, tokenspeed, generic, external]
    description:
      - The worker's runtime, sent with each C(POST /workers) (smg 1.13.0's C(runtime), one of C(unspecified),
        C(sglang), C(vllm), C(trtllm), C(mlx), C(tokenspeed), C(generic), C(external); another value is refused
        with 400). A named runtime spares the router's classification probe of the worker (smg
        C(workflow/steps/classify.rs)), a C(/health) that SGLang answers after at least a second; C(unspecified)
        lets the router probe.
  wait_timeout: {type: int, default: 120, description: Seconds to wait for the router to show the state.}
  http_timeout: {type: int, default: 10, description: Seconds per API call.}
  drain_timeout:
    type: int
    default: 0
    description:
      - With absent, the drain of each removed worker in the same module run (the rollout used three tasks for
        it). Its running requests are read (C(GET <url>/v1/loads)) just before the C(DELETE); once the router
        routes nothing more to it (gone or draining), they are read every second until 0, until the worker stops
        answering, or for at most this many seconds. 0 reads and waits for nothing.
  health_timeout:
    type: int
    default: 0
    description:
      - With present, each worker must answer C(GET <url>/health) with 200 (this many seconds per request) before
        it is added; one that does not is not added and the module fails (a failed host never gets traffic).
        A worker the router already lists healthy (its own C(/health) check passed) is not asked again. A
        C(POST) answered 409 (smg knows the URL, as when its launcher re-adds the gateway's record at a start) is
        waited for like one posted here.
        0 checks nothing before the C(POST).
  workers_file:
    type: path
    description:
      - The gateway's record of the workers that should be in the router (JSON, a C(workers) list of URLs, mode
        0644, written atomically), read by the router's launcher at every start. absent takes I(urls) out of it
        before the C(DELETE)s; present adds the URLs healthy in the router at the end (with I(exclusive) the record
        becomes exactly those); query only reads it (C(recorded)). Unset, no record is read or kept.
  restart_wait:
    type: int
    default: 30
    description:
      - Seconds, in all, to try an API call again while the router does not listen (a router restarted by systemd
        listens again after a second or two). A C(POST) or C(DELETE) whose connection was dropped is not sent again.
  service:
    type: str
    description:
      - The router's systemd unit on this host. Its C(InvocationID) (new at every start of the unit, a restart by
        systemd after a crash included) is returned as C(router_invocation), so a caller that compares two answers
        knows whether the router restarted between them.
  leave_out_unhealthy:
    type: bool
    default: false
    description:
      - With present and I(health_timeout), a worker whose C(/health) is not 200 is left out (listed in
        C(left_out)) and the others are added; the module does not fail for it. One module run adds back every
        healthy worker of a rollout batch.
"""

EXAMPLES = r"""
- name: Take a worker out of the router (waits until the router no longer lists it)
  gpufleet.fleet.fleet_router_workers:
    api_url: http://127.0.0.1:30000
    api_key: "{{ fleet_router_control_plane_api_key }}"
    state: absent
    urls: [http://10.0.0.11:8000]
  delegate_to: gateway-01

- name: Add it back once it is healthy (waits until the router lists it healthy)
  gpufleet.fleet.fleet_router_workers:
    api_url: http://127.0.0.1:30000
    api_key: "{{ fleet_router_control_plane_api_key }}"
    state: present
    urls: [http://10.0.0.11:8000]
  delegate_to: gateway-01

- name: Take a worker out and wait (at most 120 s) until its own running requests are 0
  gpufleet.fleet.fleet_router_workers:
    api_key: "{{ fleet_router_control_plane_api_key }}"
    state: absent
    urls: [http://10.0.0.11:8000]
    drain_timeout: 120
  delegate_to: gateway-01

- name: Add a worker back only if its /health answers 200
  gpufleet.fleet.fleet_router_workers:
    api_key: "{{ fleet_router_control_plane_api_key }}"
    state: present
    urls: [http://10.0.0.11:8000]
    health_timeout: 30
  delegate_to: gateway-01

- name: Add back the workers of a batch that answer /health (the others are left out and listed)
  gpufleet.fleet.fleet_router_workers:
    api_key: "{{ fleet_router_control_plane_api_key }}"
    state: present
    urls: [http://10.0.0.11:8000, http://10.0.0.12:8000]
    health_timeout: 30
    leave_out_unhealthy: true
  delegate_to: gateway-01
  run_once: true
"""

RETURN = r"""
workers:
  type: list
  elements: dict
  returned: always
  description: The router's workers at the end (C(id), C(url), C(model_id), C(is_healthy), C(status)).
added: {type: list, elements: str, returned: always, description: URLs added.}
removed:
  type: list
  elements: dict
  returned: always
  description: The workers removed (C(url) and C(id)).
draining:
  type: list
  elements: str
  returned: when state is present or absent, not in check mode
  description: With absent, the removed URLs the router still lists as draining at the end.
in_router:
  type: bool
  returned: when state is present or absent, not in check mode
  description: With present, every URL is healthy in the router (false when the module failed).
in_router_urls:
  type: list
  elements: str
  returned: when state is present or absent, not in check mode
  description: With present, the URLs asked for that are healthy in the router at the end.
left_out:
  type: dict
  returned: when state is present or absent, not in check mode
  description: With leave_out_unhealthy, the URLs not added because their /health was not 200 (URL -> status, 0 none).
router_invocation:
  type: str
  returned: always
  description: With service, the unit's systemd InvocationID (empty when systemd does not know the unit).
router_unavailable_s:
  type: float
  returned: always
  description: Seconds this run waited for a router that did not listen (a restart under way).
recorded:
  type: list
  elements: str
  returned: always
  description: With workers_file, the URLs the record holds at the end (the workers a router restart comes back with).
drain:
  type: dict
  returned: when state is present or absent, not in check mode
  description:
    - With absent and drain_timeout, per URL removed - in_flight_at_removal (running requests just before the
      DELETE, null when unreadable), waited_s, in_flight_left (null when the worker stopped answering), timed_out.
"""


import http.client as http_client
import json
import os
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.http_request import open_url
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import write_json
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_http import http
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import unit_state

# The status smg 1.13.0 lists a worker with from its DELETE until its removal (openai_protocol WorkerStatus::Draining,
# serialized lowercase; seen in the lab's GET /workers right after a DELETE).
DRAINING = "draining"
# The runtimes smg 1.13.0's POST /workers accepts (its 400 answer to another one lists them): refused here, before any
# call to the router, rather than by the router in the middle of a rollout's add-back.
RUNTIMES = ("unspecified", "sglang", "vllm", "trtllm", "mlx", "tokenspeed", "generic", "external")


def norm(url: str) -> str:
    return url.rstrip("/")


def read_record(path: str | None) -> list[str]:
    """The recorded worker URLs (none when there is no record yet); a record that is not ours fails loudly."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
        raise ValueError(f'{path} is not a worker record ({{"workers": [...]}})')
    return [norm(str(u)) for u in data["workers"]]


def write_record(path: str | None, urls: list[str], before: list[str]) -> bool:
    """Write the record (sorted, atomically, mode 0644: the router runs as its own user) when it differs."""
    urls = sorted(set(urls))
    if not path or urls == sorted(set(before)):
        return False
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    write_json(Path(path), {"workers": urls}, mode=0o644)
    return True


def router_down(exc: BaseException, method: str) -> bool:
    """The router is not listening (restarting: refused), or dropped a GET without an answer. A POST or DELETE whose
    connection was dropped may have been applied: it is not sent again."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return True
    return method == "GET" and isinstance(reason, (ConnectionResetError, http_client.RemoteDisconnected))


class Router:
    def __init__(self, base: str, key: str, timeout: int, restart_wait: float = 0):
        self.base, self.key, self.timeout, self.restart_wait = norm(base), key, timeout, restart_wait
        self.waited_s = 0.0  # seconds this run waited for a router that did not listen

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """One API call; while the router does not listen (a restart takes a few seconds) it is tried again every
        0.5 s for at most restart_wait seconds in all."""
        while True:
            try:
                return self._call(method, path, body)
            except (OSError, http_client.HTTPException) as exc:
                if not router_down(exc, method) or self.waited_s >= self.restart_wait:
                    raise
                time.sleep(0.5)
                self.waited_s += 0.5

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.key}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            with open_url(self.base + path, data=data, headers=headers, method=method, timeout=self.timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, {"error": raw.decode(errors="replace")[:300]}

    def workers(self) -> list[dict]:
        status, body = self.call("GET", "/workers")
        if status == 401:
            raise RuntimeError("the router refused the control-plane key (401): check the router key variable")
        if status != 200:
            raise RuntimeError(f"GET /workers answered {status}: {body}")
        return [
            {k: w.get(k) for k in ("id", "url", "model_id", "is_healthy", "status")} for w in body.get("workers", [])
        ]


def invocation(service: str | None) -> str:
    """The systemd InvocationID of the router's unit ('' without a service or when systemd does not know it)."""
    return unit_state(service)["invocation_id"] if service else ""


def http_get(url: str, timeout: float) -> tuple[int, dict | None]:
    """Status and JSON body of a GET to a worker (sglang_server_http.http; 0 and None when it does not answer)."""
    status, text, _seconds = http("GET", url, timeout=timeout)
    try:
        return status, json.loads(text) if text else {}
    except ValueError:
        return status, None


def get_each(urls: list[str], path: str, timeout: float) -> dict[str, tuple[int, dict | None]]:
    """http_get of <url><path> for every URL at once (status, body by URL): a slow answer (SGLang's /health is a
    one-token generation, at least a second) costs the batch the time of one, not one per worker."""
    if not urls:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(urls))) as pool:
        return dict(zip(urls, pool.map(lambda url: http_get(f"{url}{path}", timeout), urls), strict=True))


def running_requests(body: dict | None) -> int | None:
    """A worker's requests (running and waiting) from its GET /v1/loads answer (SGLang 0.5.9
    entrypoints/v1_loads.py: aggregate.total_reqs, else the sum of each DP rank's num_total_reqs or
    num_running_reqs); None when the answer has neither."""
    if not isinstance(body, dict):
        return None
    aggregate = body.get("aggregate")
    if isinstance(aggregate, dict) and aggregate.get("total_reqs") is not None:
        return int(aggregate["total_reqs"])
    loads = body.get("loads")
    if isinstance(loads, list):
        return sum(int(x.get("num_total_reqs", x.get("num_running_reqs")) or 0) for x in loads if isinstance(x, dict))
    return None


def drain_all(at_removal: dict, timeout_s: int, http_timeout: int, sleep=time.sleep) -> dict:
    """Wait until each worker's own running requests are 0, it stops answering, or timeout_s ran out; the workers
    are read together once a second (those of one batch drain at the same time)."""
    started = time.monotonic()
    state = {url: {"left": n, "answered": True, "done": False, "waited_s": 0.0} for url, n in at_removal.items()}
    for attempt in range(timeout_s + 1):
        answers = get_each([url for url, st in state.items() if not st["done"]], "/v1/loads", http_timeout)
        for url, (status, body) in answers.items():
            st = state[url]
            st["answered"] = status == 200
            st["left"] = running_requests(body) if st["answered"] else None
            if not st["answered"] or st["left"] == 0 or attempt == timeout_s:
                st["done"], st["waited_s"] = True, round(time.monotonic() - started, 2)
        if all(st["done"] for st in state.values()):
            break
        sleep(1)
    return {
        url: {
            "in_flight_at_removal": at_removal[url],
            "waited_s": st["waited_s"],
            "in_flight_left": st["left"] if st["answered"] else None,
            "timed_out": bool(st["answered"] and st["left"] != 0),
        }
        for url, st in state.items()
    }


def drain(url: str, at_removal: int | None, timeout_s: int, http_timeout: int, sleep=time.sleep) -> dict:
    """drain_all of one worker."""
    return drain_all({url: at_removal}, timeout_s, http_timeout, sleep)[url]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "api_url": {"type": "str", "default": "http://127.0.0.1:30000"},
            "api_key": {"type": "str", "required": True, "no_log": True},
            "state": {"type": "str", "choices": ["present", "absent", "query"], "default": "query"},
            "urls": {"type": "list", "elements": "str", "default": []},
            "exclusive": {"type": "bool", "default": False},
            "runtime": {"type": "str", "default": "sglang", "choices": list(RUNTIMES)},
            "worker_api_key": {"type": "str", "default": "", "no_log": True},
            "wait_timeout": {"type": "int", "default": 120},
            "http_timeout": {"type": "int", "default": 10},
            "drain_timeout": {"type": "int", "default": 0},
            "health_timeout": {"type": "int", "default": 0},
            "leave_out_unhealthy": {"type": "bool", "default": False},
            "workers_file": {"type": "path"},
            "restart_wait": {"type": "int", "default": 30},
            "service": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    router = Router(p["api_url"], p["api_key"], p["http_timeout"], p["restart_wait"])
    wanted = [norm(u) for u in p["urls"]]
    try:
        recorded = read_record(p["workers_file"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"worker record not readable: {exc}")
    try:
        current = router.workers()
    except (OSError, RuntimeError) as exc:
        down = f"router API at {p['api_url']} not usable: {exc}"
        if p["state"] == "query" or module.check_mode or not p["workers_file"]:
            module.fail_json(msg=down)
        # The record is the intent, kept whether the router answers or not: a router that is down starts again from
        # it (its launcher's --worker-urls), so a worker removed now stays out and one added back now (its /health
        # answering 200 from here, when health_timeout asks for the check) is in its list at the router's next start.
        keep = [u for u in recorded if u not in wanted]
        back = wanted
        if p["state"] == "present" and p["health_timeout"] > 0:
            answers = get_each(wanted, "/health", p["health_timeout"])
            back = [u for u, (status, _body) in answers.items() if status == 200]
        intent = keep + back if p["state"] == "present" else keep
        changed = write_record(p["workers_file"], intent, recorded)
        module.fail_json(
            msg=f"{down}; its record ({p['workers_file']}) now lists {', '.join(sorted(set(intent))) or 'no worker'} "
            "for its next start",
            changed=changed, recorded=sorted(set(intent)), in_router=False, in_router_urls=[],
        )  # fmt: skip
    by_url = {norm(w["url"]): w for w in current}
    left_out = {}
    if p["state"] == "present" and p["health_timeout"] > 0 and not module.check_mode:
        # a worker the router already lists healthy passed the router's own /health check: not probed again (a
        # no-op deploy.yml would otherwise wait a one-token generation per worker for nothing)
        unknown = [u for u in wanted if not by_url.get(u, {}).get("is_healthy")]
        for url, (status, _unused) in get_each(unknown, "/health", p["health_timeout"]).items():
            if status == 200:
                continue
            if not p["leave_out_unhealthy"]:
                module.fail_json(
                    msg=f"not added to the router: {url}/health answered {status or 'nothing'} (a failed host never "
                    "gets traffic)",
                    workers=current, added=[], removed=[], in_router=False, health_status=status,
                )  # fmt: skip
            left_out[url] = status
        wanted = [u for u in wanted if u not in left_out]
    deadline = time.monotonic() + p["wait_timeout"]
    if p["state"] == "present" and not module.check_mode:
        # a worker still draining after an earlier DELETE goes first (the router drops it after its settle window)
        while any(by_url.get(u, {}).get("status") == DRAINING for u in wanted) and time.monotonic() < deadline:
            time.sleep(0.5)
            current = router.workers()
            by_url = {norm(w["url"]): w for w in current}
    added, removed = [], []
    if p["state"] == "present":
        added = [u for u in wanted if u not in by_url]
        if p["exclusive"]:
            removed = [{"url": u, "id": w["id"]} for u, w in by_url.items() if u not in wanted]
    elif p["state"] == "absent":
        removed = [{"url": u, "id": by_url[u]["id"]} for u in wanted if u in by_url]
    changed = bool(added or removed)
    if module.check_mode or p["state"] == "query":
        module.exit_json(
            changed=changed, workers=current, added=added, removed=removed, recorded=recorded,
            router_invocation=invocation(p["service"]), router_unavailable_s=router.waited_s,
        )  # fmt: skip

    # a worker leaves the record before its DELETE: a router restart from here on does not bring it back
    record_changed = False
    if p["state"] == "absent":
        record_changed = write_record(p["workers_file"], [u for u in recorded if u not in wanted], recorded)
        recorded = [u for u in recorded if u not in wanted]

    # with absent and drain_timeout, every URL asked for is drained (also one the router did not list)
    at_removal = {}
    if p["state"] == "absent" and p["drain_timeout"] > 0:
        for url, (status, body) in get_each(wanted, "/v1/loads", p["http_timeout"]).items():
            at_removal[url] = running_requests(body) if status == 200 else None
    for url in added:
        spec = {"url": url, "runtime": p["runtime"]}
        if p["worker_api_key"]:
            spec["api_key"] = p["worker_api_key"]  # smg's WorkerSpec.api_key: what smg sends to this worker
        status, body = router.call("POST", "/workers", spec)
        if status == 409:
            # smg 1.13.0 knows the URL already: listed since the read above, or its registration job still runs (its
            # launcher re-adds the gateway's record at each start); waited for below like a worker posted here
            continue
        if status not in (200, 201, 202):
            module.fail_json(msg=f"POST /workers {url} answered {status}: {body}", workers=current)
    for item in removed:
        status, body = router.call("DELETE", f"/workers/{item['id']}")
        if status not in (200, 202, 204, 404):
            module.fail_json(msg=f"DELETE /workers/{item['id']} ({item['url']}) answered {status}: {body}")

    gone = {i["url"] for i in removed}
    need_healthy = set(wanted) if p["state"] == "present" else set()
    while True:
        workers = router.workers()
        urls = {norm(w["url"]): w for w in workers}
        missing = sorted(u for u in need_healthy if not (u in urls and urls[u].get("is_healthy")))
        # draining: the router's policies select it no more (it leaves the list after the settle window)
        lingering = sorted(u for u in gone if u in urls and urls[u].get("status") != DRAINING)
        if not missing and not lingering:
            break
        if time.monotonic() > deadline:
            module.fail_json(
                in_router=False,
                msg=(
                    f"router at {p['api_url']} after {p['wait_timeout']} s: "
                    + (
                        f"not healthy in its list: {', '.join(missing)} (the router adds a worker only once it "
                        "answers; is the server up and reachable from the gateway host?) "
                        if missing
                        else ""
                    )
                    + (f"still listed and not draining after DELETE: {', '.join(lingering)}" if lingering else "")
                ),
                workers=workers,
                added=added,
                removed=removed,
            )
        time.sleep(0.5)
    drained = drain_all(at_removal, p["drain_timeout"], p["http_timeout"]) if at_removal else {}
    healthy = sorted(u for u in wanted if u in urls and urls[u].get("is_healthy")) if p["state"] == "present" else []
    if p["state"] == "present":
        keep = [] if p["exclusive"] else recorded
        record_changed = write_record(p["workers_file"], keep + healthy, recorded)
        recorded = sorted(set(keep + healthy))
    module.exit_json(
        changed=changed or record_changed, workers=workers, added=added, removed=removed, drain=drained,
        left_out=left_out, recorded=recorded if p["workers_file"] else [],
        router_invocation=invocation(p["service"]), router_unavailable_s=router.waited_s,
        in_router=p["state"] == "present" and not left_out, in_router_urls=healthy,
        draining=sorted(u for u in gone if u in urls),
    )  # fmt: skip


if __name__ == "__main__":
    main()
