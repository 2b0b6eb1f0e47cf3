"""Rolling deploys behind the real router, on ONE lab: 4 server hosts + 2 gateway hosts running the Shepherd Model
Gateway (smg 1.13.0, roles/fleet_router), each with every healthy worker, the simulated engine on the servers; the
load is a client with both gateways (docs/fleet-router.md, "Two or more gateways").

In order, on the same lab (one bring-up):
0. a router killed with SIGKILL under load comes back (systemd) serving every worker of the gateway's record within
   seconds, without Ansible, losing only the requests it held; a worker taken out of the router on purpose stays out
   across such a restart; a gateway that dies for good leaves the other one serving;
1. a plan that would take the last healthy worker of the model out of the router is refused before any change;
2. a full rollout of a flag change under a continuous load through the router (streaming and non-streaming,
   long requests in flight when each worker leaves the router) sees zero failed requests; a second rollout
   started meanwhile is refused with the first one's lock owner; each host restarted exactly once; the
   router lists the four workers at the end;
3. the same rollout again changes nothing: every host is proven where it runs, none leaves the router, no batch
   runs, nothing restarts;
4. a worker left out of the router (what a rollout killed mid-batch leaves: its add-back never ran) is put back by
   the next rollout, which proves it healthy where it runs; nothing restarts;
5. a rollout whose router is killed (SIGKILL) while its first batch is out of it carries on: systemd restarts the
   router with the gateway's record (without the batch's workers), the add-back puts them in, the second batch runs;
   at the end every worker is in, and the report says the router restarted;
6. a rollout of another flag change with a start fault on the third host stops at that batch: the host is
   rolled back and, proven healthy on its previous version, back in the router; the fourth is untouched (same
   unit, same start), the first two keep the new flag; exit status, report and last line say so;
7. a gateway's router stopped while a rollout holds its lock: the run ends ROLLOUT STOPPED with a report of this run
   naming that gateway, the locks given back; started again, the gateway serves every healthy worker (its record).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
import threading
import time

import fleet_lab
import pytest
import yaml
from conftest import ROOT, ClientThreads
from fleet_lab import KEY, ROUTER_PORT, healthy_urls, router_workers, unit_state, unit_text
from lab_host import on

sys.path.insert(0, str(ROOT / "tests/support"))
from gpufleet_testinfra import changed_tasks, playbook_env, recap  # noqa: E402

NAME = "t-rollout"
WORK = ROOT / "tmp" / NAME  # two levels under the project: the lab group_vars' inventory_dir paths resolve
SERVERS = [f"{NAME}-0{i}" for i in range(1, 5)]
GATEWAYS = [f"{NAME}-router-01", f"{NAME}-router-02"]  # two gateways, each with every healthy worker
GATEWAY = GATEWAYS[0]


EXTRA_ENV = {"MOLECULE_EPHEMERAL_DIRECTORY": str(WORK / "eph"), "GPUFLEET_ROOT": str(ROOT)}


play = fleet_lab.runner(WORK, EXTRA_ENV)


def common_extra(**more) -> dict:
    return {**fleet_lab.report_dirs(WORK), **more}


def router_delete(address: str, worker_id: str) -> int:
    conn = http.client.HTTPConnection(address, ROUTER_PORT, timeout=10)
    conn.request("DELETE", f"/workers/{worker_id}", headers={"Authorization": f"Bearer {KEY}"})
    status = conn.getresponse().status
    conn.close()
    return status


def router_view(address: str) -> list[tuple]:
    return sorted((w["id"], w["url"], w["is_healthy"]) for w in router_workers(address))


def lock_files(hosts: dict) -> dict:
    return {name: on(h, "ls /var/lib/gpufleet/locks 2>/dev/null || true").split() for name, h in hosts.items()}


def background_rollout(name: str, extra: dict) -> subprocess.Popen:
    """rollout.yml started in the background with ``extra`` (a vars file ``<name>.json`` in the lab's work folder),
    its output piped: the test acts on the fleet while the run goes on."""
    vars_file = WORK / f"{name}.json"
    vars_file.write_text(json.dumps(extra))
    argv = ["ansible-playbook", "-i", str(WORK / "hosts.yml"), "-e", f"@{vars_file}", "playbooks/rollout.yml"]
    return subprocess.Popen(
        argv, cwd=ROOT, env=playbook_env(EXTRA_ENV), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


class Load(ClientThreads):
    """Continuous requests through the router: non-streaming short chat/completions and streaming long
    generations (several seconds each, so some are in flight when a worker leaves the router).

    With several gateway addresses it is a client with a list of gateways (docs/fleet-router.md, "Two or more
    gateways"): its requests are spread over them, and a request that a gateway refuses to connect or answers "no
    worker available" (a gateway down or restarting) goes to the next one; a request that fails once a gateway took it
    (an error answer, a cut stream) is a failure."""

    def __init__(self, address, workers: int = 12, limit_s: float = 420, limit_count: int = 5000):
        self.addresses = [address] if isinstance(address, str) else list(address)
        self.workers = workers
        self.deadline = time.monotonic() + limit_s
        self.limit_count = limit_count
        self.ok = {"stream": 0, "plain": 0}
        self.failures: list[str] = []
        self.failed_at: list[float] = []  # time.monotonic() of each failure
        self.lock = threading.Lock()
        super().__init__(workers)

    def _one(self, index: int, n: int) -> None:
        stream = index % 3 != 0
        body = fleet_lab.load_request(index, n, "rolling deploys", stream, 600 if stream else 24)
        count = len(self.addresses)
        for attempt in range(count):
            address = self.addresses[(index + n + attempt) % count]
            conn = http.client.HTTPConnection(address, ROUTER_PORT, timeout=60)
            try:
                conn.connect()
            except OSError:
                if attempt == count - 1:
                    raise
                continue  # this gateway is down: the next one
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read().decode(errors="replace")
            if resp.status in (404, 503) and "worker" in data.lower() and attempt < count - 1:
                continue  # this gateway has no worker (it restarts): the next one
            break
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status} from {address}: {data[:200]}")
        if stream:
            events = [line[6:] for line in data.splitlines() if line.startswith("data: ")]
            chunks = [json.loads(e) for e in events[:-1]]
            reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
            if events[-1:] != ["[DONE]"] or not any(reasons) or len(reasons) < 100:
                raise RuntimeError(f"stream cut or short ({len(reasons)} chunks): {data[-200:]}")
        elif json.loads(data)["choices"][0]["message"]["content"] is None:
            raise RuntimeError(f"no content: {data[:200]}")
        with self.lock:
            self.ok["stream" if stream else "plain"] += 1

    def _run(self, index: int) -> None:
        n = 0
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            with self.lock:
                if sum(self.ok.values()) + len(self.failures) >= self.limit_count:
                    return
            n += 1
            try:
                self._one(index, n)
            except Exception as exc:  # every failure counts, whatever its kind
                with self.lock:
                    self.failures.append(f"worker {index} request {n}: {exc!r}")
                    self.failed_at.append(time.monotonic())
                time.sleep(0.2)  # a client that backs off a little, not a busy loop against a router that is down


class InFlight(ClientThreads):
    """Requests held open on each worker while it is in the router, so that each one has a request in flight when a
    rollout takes it out (what the drain must wait for): a load through the router spreads its requests round-robin and
    can leave a worker idle at that moment. Two threads per worker, each sending a long streamed generation straight
    to the worker whenever the gateway lists it healthy (and waiting on that list otherwise); they start a second apart,
    so one of them is always in the middle of a request. Their answers are not the load's: the load counts failures."""

    def __init__(self, gateway: str, workers: list[str], limit_s: float = 420):
        self.gateway, self.urls = gateway, workers
        self.deadline = time.monotonic() + limit_s
        super().__init__(2 * len(workers))

    def _run(self, index: int) -> None:
        url = self.urls[index // 2]
        if index % 2:
            self.stop.wait(1.0)  # the second thread of the worker runs a second behind the first
        n = 0
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            if url not in healthy_urls(self.gateway):
                self.stop.wait(0.2)  # out of the router (being drained or restarted): no new request for it
                continue
            n += 1
            body = fleet_lab.load_request(1000 + index, n, "draining", True, 600)
            host, port = url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
                conn.getresponse().read()
            conn.close()


@pytest.fixture(scope="module")
def fleet():
    yield from fleet_lab.fleet_up(NAME, WORK, play, common_extra(sglang_server_serial=4), servers=4, routers=2)


def test_router_serves_the_fleet_and_keeps_its_key_out_of_argv(fleet):
    gw = fleet[GATEWAY]
    urls = sorted(w["url"] for w in router_workers(gw["address"]) if w["is_healthy"])
    assert urls == sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    # every gateway registers every healthy worker
    assert sorted(w["url"] for w in router_workers(fleet[GATEWAYS[1]]["address"]) if w["is_healthy"]) == urls
    # The worker API refuses a caller without the key; the key is in no argv, unit or systemd property.
    conn = http.client.HTTPConnection(gw["address"], ROUTER_PORT, timeout=10)
    conn.request("GET", "/workers")
    assert conn.getresponse().status == 401
    seen = on(gw, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; cat /etc/systemd/system/smg-router.service; "
                  "systemctl show smg-router; journalctl -u smg-router --no-pager")  # fmt: skip
    assert KEY not in seen
    assert on(gw, "stat -c '%a %U' /etc/smg-router/secrets.env").split() == ["600", "root"]
    # A second run of the router stage changes nothing: same unit, same process, same workers.
    pid = on(gw, "systemctl show -p MainPID --value smg-router").strip()
    again = play("playbooks/router.yml")
    assert again.returncode == 0, again.stdout[-3000:]
    assert recap(again.stdout)[GATEWAY]["changed"] == 0, changed_tasks(again.stdout)
    assert on(gw, "systemctl show -p MainPID --value smg-router").strip() == pid
    assert sorted(w["url"] for w in router_workers(gw["address"]) if w["is_healthy"]) == urls
    # The no-op fast path compares the host with what the run would write: a hand edit of the unit is seen and undone,
    # and the router restarted on it serves every worker again.
    unit = on(gw, "cat /etc/systemd/system/smg-router.service")
    on(gw, "echo 'Environment=HAND_EDIT=1' >> /etc/systemd/system/smg-router.service && systemctl daemon-reload")
    undone = play("playbooks/router.yml")
    assert undone.returncode == 0, undone.stdout[-3000:]
    assert recap(undone.stdout)[GATEWAY]["changed"] > 0
    assert "differs: /etc/systemd/system/smg-router.service" in undone.stdout
    assert on(gw, "cat /etc/systemd/system/smg-router.service") == unit
    assert on(gw, "systemctl show -p MainPID --value smg-router").strip() != pid
    assert sorted(w["url"] for w in router_workers(gw["address"]) if w["is_healthy"]) == urls


RECORD = "/var/lib/smg-router/workers.json"  # fleet_router_workers_file's default
REMOVE = """
- name: Take one worker out of the router as a rollout's batch does (the module, with the gateway's record)
  hosts: fleet_routers
  gather_facts: false
  tasks:
    - name: Remove it
      gpufleet.fleet.fleet_router_workers:
        api_key: "{{ fleet_router_control_plane_api_key }}"
        state: absent
        urls: ["{{ url }}"]
        workers_file: "{{ record }}"
"""


def kill_router_and_wait(gw: dict, wanted: list[str], bound_s: float = 30) -> tuple[float, float]:
    """SIGKILL of smg's main process (a crash or an OOM kill); the time of the kill and the seconds until the router
    (restarted by systemd, no Ansible) lists exactly `wanted` as healthy."""
    killed_at = time.monotonic()
    on(gw, "kill -9 $(systemctl show -p MainPID --value smg-router)")
    while True:
        try:
            if healthy_urls(gw["address"]) == wanted:
                return killed_at, time.monotonic() - killed_at
        except (OSError, AssertionError, http.client.HTTPException):
            pass  # the router is down or restarting: its API does not answer yet
        assert time.monotonic() - killed_at < bound_s, f"the router did not list {wanted} within {bound_s} s"
        time.sleep(0.2)


def test_a_killed_router_comes_back_serving_its_recorded_workers_without_ansible(fleet):
    """The router stage recorded the four workers on each gateway; smg killed with SIGKILL under load (a client with
    both gateways) is restarted by systemd and its launcher starts it with the recorded workers: every worker is
    healthy in it again within seconds, with no Ansible run, and only the requests it held fail (the count and the
    seconds are printed)."""
    gw = fleet[GATEWAY]
    everyone = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    for name in GATEWAYS:
        assert json.loads(on(fleet[name], f"cat {RECORD}")) == {"workers": everyone}
    restarts = int(on(gw, "systemctl show -p NRestarts --value smg-router"))
    with Load([fleet[g]["address"] for g in GATEWAYS], workers=4, limit_s=90) as load:
        time.sleep(3)  # serving through the router before the kill
        killed_at, back_s = kill_router_and_wait(gw, everyone)
        served_before = sum(load.ok.values())
        time.sleep(5)  # and serving again after it
    assert int(on(gw, "systemctl show -p NRestarts --value smg-router")) == restarts + 1
    print(f"router SIGKILL under load: {len(load.failures)} failed requests, all within "
          f"{max(load.failed_at, default=killed_at) - killed_at:.1f} s of the kill; every worker healthy in the "
          f"restarted router {back_s:.1f} s after it")  # fmt: skip
    assert back_s < 15
    # only what the killed gateway held: each of the 4 clients had one request in flight at most
    assert len(load.failures) <= 4, load.failures
    assert all(killed_at - 1 <= t <= killed_at + 2 for t in load.failed_at), load.failures[:5]
    assert sum(load.ok.values()) > served_before  # served again after the restart
    journal = on(gw, "journalctl -u smg-router --no-pager -n 400")
    assert f"starting with the 4 recorded worker(s) of {RECORD}" in journal

    # A worker taken out on purpose (what a rollout's batch does) leaves the record first: a restart keeps it out.
    out = f"http://{fleet[SERVERS[0]]['address']}:8000"
    (WORK / "remove-worker.yml").write_text(REMOVE)
    proc = play(str(WORK / "remove-worker.yml"), extra={"url": out, "record": RECORD})
    assert proc.returncode == 0, proc.stdout[-3000:]
    rest = [u for u in everyone if u != out]
    assert json.loads(on(gw, f"cat {RECORD}")) == {"workers": rest}
    kill_router_and_wait(gw, rest)
    time.sleep(3)  # longer than a registration (about 2 s): the removed worker does not come back
    assert healthy_urls(gw["address"]) == rest
    # The router stage registers every server that answers /health, and records it.
    again = play("playbooks/router.yml")
    assert again.returncode == 0, again.stdout[-3000:]
    assert healthy_urls(gw["address"]) == everyone
    assert json.loads(on(gw, f"cat {RECORD}")) == {"workers": everyone}


def test_a_gateway_that_dies_leaves_the_other_serving(fleet):
    """Two gateways, a client with both: one gateway's router dies for good (SIGKILL with systemd's restart turned
    off, as a gateway host that went down); the client's requests go on through the other one, and only those the
    dead one held fail. Started again (no Ansible), it comes back with its recorded workers."""
    dead = fleet[GATEWAYS[1]]
    everyone = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    dropin = "/run/systemd/system/smg-router.service.d"
    on(dead, f"mkdir -p {dropin} && printf '[Service]\\nRestart=no\\n' > {dropin}/gone.conf && systemctl daemon-reload")
    try:
        with Load([fleet[g]["address"] for g in GATEWAYS], workers=4, limit_s=60) as load:
            time.sleep(3)
            killed_at = time.monotonic()
            on(dead, "kill -9 $(systemctl show -p MainPID --value smg-router)")
            time.sleep(8)
            assert on(dead, "systemctl is-active smg-router || true").strip() != "active"
            served_after = sum(load.ok.values())
            time.sleep(4)
        assert sum(load.ok.values()) > served_after  # served through the other gateway meanwhile
        assert len(load.failures) <= 4, load.failures  # at most the requests in flight on the dead one
        assert all(t <= killed_at + 2 for t in load.failed_at), load.failures[:5]
        print(f"one of two gateways killed for good under load: {len(load.failures)} failed requests")
    finally:
        on(dead, f"rm -f {dropin}/gone.conf && systemctl daemon-reload && systemctl start smg-router")
    deadline = time.monotonic() + 30
    while True:
        try:
            if healthy_urls(dead["address"]) == everyone:
                break
        except (OSError, AssertionError, http.client.HTTPException):
            pass
        assert time.monotonic() < deadline, "the gateway did not come back with its workers"
        time.sleep(0.5)


def test_plan_taking_the_last_healthy_worker_is_refused_before_any_change(fleet):
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    workers_before = router_view(fleet[GATEWAY]["address"])
    proc = play("playbooks/rollout.yml", extra=common_extra(
        rollout_serial=["100%"], rollout_max_unavailable=4, sglang_server_args_host={"chunked-prefill-size": 2048},
    ))  # fmt: skip
    assert proc.returncode != 0
    assert "ROLLOUT REFUSED before any change" in proc.stdout
    assert "would take the last healthy worker of model 'glm-5'" in proc.stdout
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before
    assert router_view(fleet[GATEWAY]["address"]) == workers_before
    assert all(not files for files in lock_files(fleet).values())


def test_rollout_under_load_has_zero_failed_requests_and_a_second_rollout_is_refused(fleet):
    gw = fleet[GATEWAY]
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    t0 = on(fleet[SERVERS[0]], "date +%s").strip()
    extra = common_extra(
        rollout_serial=[1, "100%"], rollout_max_unavailable=3, sglang_server_args_host={"chunked-prefill-size": 4096}
    )
    urls = [f"http://{fleet[h]['address']}:8000" for h in SERVERS]
    with Load([fleet[g]["address"] for g in GATEWAYS]) as load, InFlight(gw["address"], urls):
        deadline = time.monotonic() + 60
        while load.ok["plain"] == 0:  # the load is served through the gateways before the first worker leaves them
            assert time.monotonic() < deadline and not load.failures, (load.ok, load.failures[:3])
            time.sleep(0.2)
        first = background_rollout("rollout-a", extra)
        deadline = time.monotonic() + 120
        while "rollout-fleet.lock" not in on(gw, "ls /var/lib/gpufleet/locks 2>/dev/null || true"):
            assert first.poll() is None and time.monotonic() < deadline, "the first rollout never took its lock"
            time.sleep(0.5)
        holder = json.loads(on(gw, "cat /var/lib/gpufleet/locks/rollout-fleet.lock"))
        second = play("playbooks/rollout.yml", extra=common_extra(sglang_server_args_host={"chunked-prefill-size": 1}))
        out, _ = first.communicate(timeout=540)
        (WORK / "rollout-a.log").write_text(out)
    assert second.returncode != 0
    assert "LOCKED" in second.stdout and holder["run_id"] in second.stdout, second.stdout[-2000:]
    assert first.returncode == 0, out[-4000:]
    assert "ROLLOUT OK" in out
    # Zero failed requests, both kinds, a real amount.
    assert load.failures == [], load.failures[:5]
    assert load.ok["stream"] >= 8 and load.ok["plain"] >= 20, load.ok
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "ok" and set(report["hosts"].values()) == {"updated"}
    assert sorted(report["locked_hosts"]) == sorted(SERVERS)
    # The rollout's own cost per batch, split from the engine's warm-up (benchmarks/suite/fleet_rollout.py reads it).
    timings = report["batch_timings"]
    assert [t["hosts"] for t in timings] == [SERVERS[:1], SERVERS[1:]], timings
    for t in timings:
        assert 0 < t["engine_start_to_ready_s"] < t["wall_s"], t
        assert t["overhead_s"] == pytest.approx(t["wall_s"] - t["engine_start_to_ready_s"], abs=0.01), t
        # the engine's own time: its stop (SGLang's drain, seconds with these long requests) and its warm-up
        assert t["engine_stop_s"] > 0 and t["engine_start_to_ready_s"] < t["engine_s"] < t["wall_s"], t
        assert t["own_overhead_s"] == pytest.approx(t["wall_s"] - t["engine_s"], abs=0.01), t
    # Long requests were in flight at each worker's removal from the router (InFlight holds one on each; the load's
    # requests through the gateways, none failed, may have been elsewhere at that moment).
    assert all(report["drain"][h]["in_flight_at_removal"] >= 1 for h in SERVERS), report["drain"]
    for h in SERVERS:
        assert unit_state(fleet[h])["start"] != before[h]["start"]
        assert "--chunked-prefill-size 4096" in unit_text(fleet[h])
        starts = on(fleet[h], f"journalctl -u sglang-server --since @{t0} --no-pager | grep -c 'fired up and ready'")
        assert starts.strip() == "1", f"{h} started {starts.strip()} times"
    everyone = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    # drained from both gateways (zero failures above with requests through both) and back in both
    assert report["router_workers"] == dict.fromkeys(GATEWAYS, everyone)
    for name in GATEWAYS:
        assert healthy_urls(fleet[name]["address"]) == everyone
    assert all(not files for files in lock_files(fleet).values())


def test_a_rollout_with_nothing_to_change_restarts_nothing_and_no_worker_leaves_the_router(fleet):
    """The same configuration again: every host is proven by a generation where it runs (the decide play), no batch
    runs, no worker leaves the router at any moment, nothing restarts; the report says so and the locks are back."""
    gw = fleet[GATEWAY]
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    everyone = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    seen: list[list[str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(sorted(w["url"] for w in router_workers(gw["address"]) if w["is_healthy"]))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        proc = play("playbooks/rollout.yml", extra=common_extra(
            rollout_serial=[1, "100%"], rollout_max_unavailable=3,
            sglang_server_args_host={"chunked-prefill-size": 4096},
        ))  # fmt: skip
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "nothing to restart" in proc.stdout
    assert "skipping: no hosts matched" in proc.stdout  # the batch play had no host
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "ok" and report["batches"] == [] and report["batch_timings"] == []
    assert report["hosts"] == dict.fromkeys(SERVERS, "unchanged") and report["unchanged_in_place"] == SERVERS
    # These hosts were last changed by a rollout, which writes no converged record (only deploy.yml, which runs
    # every stage, does: docs/sglang-server.md): so they went through the server stage under their locks, which
    # proved them unchanged. After a deploy.yml the same run takes no lock (benchmarks/suite/fleet_rollout.py).
    assert sorted(report["locked_hosts"]) == sorted(SERVERS)
    assert len(seen) >= 5 and all(view == everyone for view in seen), [v for v in seen if v != everyone][:3]
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before
    deploy = {h: json.loads((WORK / f"reports/deploy/{h}.json").read_text()) for h in SERVERS}
    assert all(d["result"] == "unchanged" and d["health"]["ok"] for d in deploy.values()), deploy
    assert all(not files for files in lock_files(fleet).values())


def test_a_worker_a_killed_rollout_left_out_of_the_router_is_put_back_by_the_next_rollout(fleet):
    """A controller killed mid-batch never runs the batch's add-back (`always:`): its workers stay out of the
    router, healthy. The next rollout proves each host where it runs (a generation) and puts back, under its fleet
    lock and before it checks the budget, every worker proven healthy on the wanted version that is not in the
    router; nothing restarts, and the report and the plan line name the worker."""
    gw = fleet[GATEWAY]
    left = SERVERS[1]
    url = f"http://{fleet[left]['address']}:8000"
    everyone = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    # what the killed run's batch did to this worker: DELETE /workers/<uuid> on the router (as the rollout's removal)
    worker = next(w for w in router_workers(gw["address"]) if w["url"].rstrip("/") == url)
    assert router_delete(gw["address"], worker["id"]) in (200, 202, 204)
    deadline = time.monotonic() + 30
    while url in [w["url"].rstrip("/") for w in router_workers(gw["address"]) if w["is_healthy"]]:
        assert time.monotonic() < deadline, "the router still lists the worker as healthy"
        time.sleep(0.5)
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    proc = play("playbooks/rollout.yml", extra=common_extra(
        rollout_serial=[1, "100%"], rollout_max_unavailable=3, sglang_server_args_host={"chunked-prefill-size": 4096},
    ))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"put back into the router: {left};" in proc.stdout
    assert "nothing to restart" in proc.stdout
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "ok" and report["put_back"] == [left]
    assert report["hosts"] == dict.fromkeys(SERVERS, "unchanged")
    assert left in report["locked_hosts"]  # the worker went back under this run's fleet lock
    assert sorted(w["url"].rstrip("/") for w in router_workers(gw["address"]) if w["is_healthy"]) == everyone
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before
    assert all(not files for files in lock_files(fleet).values())


def test_a_router_killed_in_the_middle_of_a_rollout_comes_back_and_the_rollout_says_so(fleet):
    gw = fleet[GATEWAY]
    everyone = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    first = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS[:2])
    extra = common_extra(
        rollout_serial=[2], rollout_max_unavailable=2, sglang_server_args_host={"chunked-prefill-size": 6144}
    )
    rollout = background_rollout("rollout-kill", extra)
    try:
        # the first batch's workers left the gateway's record (before their DELETE): kill the router then
        deadline = time.monotonic() + 300
        while json.loads(on(gw, f"cat {RECORD}"))["workers"] != [u for u in everyone if u not in first]:
            assert rollout.poll() is None and time.monotonic() < deadline, "the first batch never left the router"
            time.sleep(0.3)
        restarts = int(on(gw, "systemctl show -p NRestarts --value smg-router"))
        on(gw, "kill -9 $(systemctl show -p MainPID --value smg-router)")
        out, _ = rollout.communicate(timeout=540)
    finally:
        if rollout.poll() is None:
            rollout.kill()
    (WORK / "rollout-kill.log").write_text(out)
    assert rollout.returncode == 0, out[-4000:]
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "ok" and set(report["hosts"].values()) == {"updated"}, report["hosts"]
    assert report["router_restarted"] is True
    assert int(on(gw, "systemctl show -p NRestarts --value smg-router")) == restarts + 1
    assert report["router"] == {"in": sorted(SERVERS), "out": {}}
    assert "A router restarted during this run" in " ".join(out.split())
    assert healthy_urls(gw["address"]) == everyone
    assert json.loads(on(gw, f"cat {RECORD}")) == {"workers": everyone}
    for h in SERVERS:
        assert "--chunked-prefill-size 6144" in unit_text(fleet[h])
    assert all(not files for files in lock_files(fleet).values())


def test_fault_on_the_third_host_stops_the_rollout_there(fleet):
    gw = fleet[GATEWAY]
    third, fourth = SERVERS[2], SERVERS[3]
    env = yaml.safe_load((ROOT / "inventory/lab/group_vars/gpufleet_lab/sglang_server.yml").read_text())
    fault_env = {**env["sglang_server_environment"], "SGLANG_SIM_FAULT": "crash-after-load"}
    (WORK / "host_vars" / f"{third}.yml").write_text(yaml.safe_dump({"sglang_server_environment": fault_env}))
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    try:
        proc = play("playbooks/rollout.yml", extra=common_extra(
            rollout_serial=[2, 1], sglang_server_args_host={"chunked-prefill-size": 8192},
        ))  # fmt: skip
    finally:
        (WORK / "host_vars" / f"{third}.yml").unlink()
    assert proc.returncode != 0
    assert f"ROLLOUT STOPPED at batch 2: {third} failed" in proc.stdout, proc.stdout[-3000:]
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "stopped" and report["stopped_at_batch"] == 2
    assert report["failed_hosts"] == [third]
    assert report["hosts"] == {SERVERS[0]: "updated", SERVERS[1]: "updated", third: "rolled_back", fourth: "untouched"}
    # Earlier hosts keep the new version; the third runs the previous one again; the fourth is untouched.
    for h in SERVERS[:2]:
        assert "--chunked-prefill-size 8192" in unit_text(fleet[h])
    third_unit = unit_text(fleet[third])
    assert "--chunked-prefill-size 6144" in third_unit and "SGLANG_SIM_FAULT" not in third_unit
    assert unit_state(fleet[third])["start"] != before[third]["start"]
    assert unit_state(fleet[fourth]) == before[fourth]
    # The router: the third rolled back and, proven healthy on the version it served before, is back in it; so the
    # fleet keeps its capacity. The report and the last line say where each host is, from the router's own list.
    urls = sorted(w["url"] for w in router_workers(gw["address"]) if w["is_healthy"])
    assert urls == sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    assert report["router"] == {"in": sorted(SERVERS), "out": {}}
    assert report["router_restarted"] is False
    assert f"In the router: {', '.join(sorted(SERVERS))}." in " ".join(proc.stdout.split())
    assert json.loads(on(gw, f"cat {RECORD}")) == {"workers": urls}
    assert all(not files for files in lock_files(fleet).values())


def test_a_gateway_stopped_in_the_middle_of_a_rollout_ends_it_with_a_true_account(fleet):
    """The second gateway's router is stopped once the rollout holds its lock: the batch then under way cannot take
    its workers out of (or put them back into) that gateway. The run ends ROLLOUT STOPPED with its report (last.json
    is this run's, naming the gateway it could not read) and gives its locks back; the stopped gateway's record kept
    the intent, so once started again it serves every healthy worker, without Ansible."""
    gw, down = fleet[GATEWAYS[0]], fleet[GATEWAYS[1]]
    extra = common_extra(
        rollout_serial=[1, "100%"], rollout_max_unavailable=3, sglang_server_args_host={"chunked-prefill-size": 2048}
    )
    run = background_rollout("rollout-gateway-down", extra)
    try:
        deadline = time.monotonic() + 180
        while "rollout-fleet.lock" not in on(gw, "ls /var/lib/gpufleet/locks 2>/dev/null || true"):
            assert run.poll() is None and time.monotonic() < deadline, "the rollout never took its lock"
            time.sleep(0.5)
        on(down, "systemctl stop smg-router")
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    (WORK / "rollout-gateway-down.log").write_text(out)
    seen = " ".join(out.split())
    assert run.returncode != 0 and "ROLLOUT STOPPED at batch 1" in seen, out[-4000:]
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "stopped" and report["run_id"] in out, report
    assert list(report["router_unread"]) == [GATEWAYS[1]], report["router_unread"]
    assert f"Gateways not read at the end: {GATEWAYS[1]}:" in seen
    assert set(report["hosts"]) == set(SERVERS) and report["hosts"][SERVERS[1]] == "untouched", report["hosts"]
    assert all(not files for files in lock_files(fleet).values())
    # the stopped gateway comes back with its record: every healthy worker, the canary included
    everyone = sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    assert json.loads(on(down, f"cat {RECORD}")) == {"workers": everyone}
    # the record as node-exporter's textfile metrics (written by systemd's path unit when the record changes): what
    # GpufleetRouterRecordDrift compares with smg's own list
    metrics = "/var/lib/prometheus/node-exporter/gpufleet_router_record.prom"
    assert f"gpufleet_router_recorded_workers {len(SERVERS)}" in on(down, f"cat {metrics}")
    on(down, "systemctl start smg-router")
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(OSError, AssertionError):
            if healthy_urls(down["address"]) == everyone:
                break
        assert time.monotonic() < deadline, "the restarted gateway does not serve every worker"
        time.sleep(0.5)
    assert healthy_urls(gw["address"]) == everyone
