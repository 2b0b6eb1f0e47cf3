"""Monitoring on the lab: playbooks/monitoring.yml puts Debian's node-exporter on every host (per-GPU metrics on the
servers' hosts) and Debian's Prometheus, Alertmanager and blackbox exporter on the gateway host (group
fleet_monitors); every target is up; a second run changes nothing; the lab's faults make their alerts FIRE in
Alertmanager's API within a stated bound and resolve after the repair; every dashboard panel's query returns series
from this real Prometheus.

Two simulated servers (mon-01, mon-02; mon-02's engine registers its GPU memory as leaking, the simulator's
leak-gpu-memory fault, which shows only once the engine dies) and one gateway (smg + the monitor). The faults come in
two rounds; within a round each is on its own host or layer, so the alerts do not hide one another.

Round 1, all at once:

* mon-01: ``kill -9`` of the engine's main process (systemd restarts it) -> GpufleetEngineRestarting;
* mon-01: the engine starts answering wrong after a healthy start (the simulator's runtime fault file,
  ``wrong-answer``) -> GpufleetGenerationProbeFailing; repair: the file emptied;
* mon-01: one uncorrected ECC error on GPU 0 (gpusim's ``ecc_uncorrected_volatile``, what nvidia-smi counts after a
  double-bit error) -> GpufleetGpuEccUncorrected; repair: the profile as it was (a GPU reset zeroes the volatile count);
* mon-02: ``kill -9`` of the engine: its leaked GPU memory stays held with no process -> GpufleetGpuForeignMemory, and
  the restart finds no room for its weights -> GpufleetEngineDown; repair: the engine stopped,
  ``nvidia-smi --gpu-reset``, the engine started;
* mon-02's worker removed from the router -> GpufleetRouterWorkerMissing; repair: playbooks/router.yml;
* the gateway's node exporter stopped -> GpufleetNodeExporterDown; repair: started (on the gateway: mon-02's GPU
  metrics come through its own node exporter, which must keep answering for the leak to be seen);
* the monitor's rendered thresholds file loses the lab class's TTFT threshold (a file out of step with the fleet)
  -> GpufleetThresholdMissing, whose ``for:`` is 5 minutes: waited for in round 2; repair: playbooks/monitoring.yml.

Round 2 (the gateway's own states one after the other, the GPU faults meanwhile):

* the gateway: ``kill -9`` of smg (systemd restarts it) -> GpufleetRouterRestarting; then smg stopped ->
  GpufleetRouterDown; repair: started (its launcher re-adds the recorded workers);
* mon-01: nvidia-smi fails (gpusim's ``failure``: the driver does not answer) -> GpufleetGpuCollectorFailing;
* mon-02: the GPU metrics timer stopped -> GpufleetGpuMetricsStale;
* the gateway: every worker removed from smg while clients keep calling it -> GpufleetRouterNoHealthyWorkers,
  GpufleetRouterWorkersBelowBudget (no router lists a healthy worker) and GpufleetRouterErrorRate (smg answers errors);
  repair: playbooks/router.yml, the clients go on; the rulebook service stopped before -> GpufleetAlertDeliveryFailing
  (Alertmanager cannot deliver those alerts to its receiver); repair: started.

Last, Alertmanager stopped -> GpufleetAlertmanagerDown, read from Prometheus' own API; repair: started.

Event-Driven Ansible: monitoring.yml puts the rulebook service on the monitor's host (group fleet_rulebooks, as the
lab's inventory has it: roles/fleet_rulebook) and names it in Alertmanager's receiver. The module's inventory turns
the restart and the quarantine off (fleet_remediation_{restart,quarantine}_enabled: false): the rounds' faults fire
their alerts, the service runs the playbook, and it acts on nothing (a turned-off report, no quarantine); the prune
stays on, and round 3's full disk is pruned by the service. Before the rounds, with the quarantine turned
on, the service quarantines mon-01 for an Xid 79 in its kernel log (GPU 0 fallen off the bus), from the alert, and the
release (one command, after the fault is cleared) puts it back; GpufleetHostQuarantined fires and resolves.

Round 3 (after the rest), the faults whose alerts take minutes: a slow engine (TTFT and ITL), a full disk that the
rulebook service prunes, a stuck scheduler with liveness stopped, a worker deleted through smg's own API (the record
drift): test_the_slow_faults_fire_their_alerts_and_a_full_disk_heals_itself. Last, Prometheus stopped: the monitor's
heartbeat (fleet_monitor_heartbeat_url, to a dead man's switch the module runs) falls silent within a minute.

GpufleetEngineRestarting, GpufleetRouterRestarting and GpufleetGpuEccUncorrected count over 15 minutes: they resolve
15 minutes after the fault, longer than a test waits (their resolution is proven by the promtool unit tests,
tests/unit/fleet_monitor). The rules no lab fault drives, and why: docs/observability.md, "Alerts".
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import simfleet
import yaml
from conftest import LAB_ENV, ROOT, lab, lab_json
from lab_host import chromium, gpusim_profile, health
from waiting import wait_until

NAME = "t-mon"
SERVERS = ("mon-01", "mon-02")
GATEWAY = f"{NAME}-router-01"
KEY = "mon-key-7c1e"
ROUTER_KEY = "mon-router-key-not-a-secret"  # the gateway's control-plane key (lab equipment)
FAULT_FILE = "/run/sglang-sim-faults"
ARTIFACTS = ROOT / "tests/lab/artifacts"
# the lab's monitor as `make deploy` has it (inventory/lab/group_vars): scrapes and rule evaluations every 5 s, a lab
# host's overlay root seen by node-exporter
GROUP_VARS = (
    simfleet.GROUP_VARS
    | {
        "sglang_server_api_key": KEY,
        "fleet_router_control_plane_api_key": ROUTER_KEY,
        "fleet_router_wheelhouse": str(ROOT / ".cache/smg/wheelhouse"),
        "sglang_server_environment": simfleet.GROUP_VARS["sglang_server_environment"]
        | {"SGLANG_SIM_FAULT_FILE": FAULT_FILE},
    }
    | yaml.safe_load((ROOT / "inventory/lab/group_vars/gpufleet_lab/fleet_monitor.yml").read_text())
)
THRESHOLDS = "/etc/prometheus/rules/gpufleet-thresholds.yml"  # rendered by fleet_monitor from the inventory
# the rounds' faults must not be repaired behind the test's back: the restart and the quarantine are off (the prune,
# which no fault before round 3's full disk calls, stays on as a user has it)
REMEDIATIONS_OFF = dict.fromkeys(("fleet_remediation_restart_enabled", "fleet_remediation_quarantine_enabled"), False)
RULEBOOK_REPORTS = "/var/lib/gpufleet-rulebook/reports/remediation"  # the service's (fleet_rulebook_data_dir)
# How long each alert may take to fire after its fault: its `for:` (and what it must see first) + 45 s: scrapes and
# evaluations every 5 s, the GPU metrics timer, Alertmanager's group_wait of 10 s, a machine shared with other work.
# The alerts without a `for:` (counts over 15 minutes) fire at the first evaluation that sees the count move: 60 s.
BOUND_FIRE_S = {
    "GpufleetEngineRestarting": 60,
    "GpufleetEngineDown": 60 + 45,
    "GpufleetGenerationProbeFailing": 60 + 45,
    "GpufleetGpuForeignMemory": 60 + 45,
    "GpufleetGpuEccUncorrected": 60,
    "GpufleetGpuHot": 120 + 45,
    "GpufleetGpuThrottled": 120 + 45,
    "GpufleetGpuPcieDegraded": 120 + 45,
    "GpufleetGpuRowRemapFailed": 60,
    "GpufleetGpuRowRemapPending": 60,
    "GpufleetGpuXidErrors": 60,
    "GpufleetGpuFatalXid": 60,
    "GpufleetRouterWorkerMissing": 60 + 45,
    "GpufleetNodeExporterDown": 60 + 45,
    "GpufleetThresholdMissing": 300 + 45,
    "GpufleetRouterRestarting": 60,
    "GpufleetRouterDown": 30 + 45,
    "GpufleetGpuCollectorFailing": 60 + 45,
    "GpufleetGpuMetricsStale": 60 + 60 + 45,  # the last run must be 60 s old first
    "GpufleetRouterNoHealthyWorkers": 30 + 45,
    "GpufleetRouterWorkersBelowBudget": 30 + 45,
    "GpufleetRouterErrorRate": 60 + 10 + 45,  # the 2m rate needs two scrapes that saw errors first
    "GpufleetAlertDeliveryFailing": 60 + 45,  # Alertmanager's group_wait (10 s), its failed attempt, a scrape
    "GpufleetAlertmanagerDown": 60 + 45,  # read from Prometheus' API (Alertmanager's is gone)
    # round 3: p99 over 5m above the threshold once the first slow answers are in (a slow step: 6 s), then for: 2m
    "GpufleetEngineTTFTHigh": 120 + 60 + 45,
    "GpufleetEngineITLHigh": 120 + 60 + 45,
    "GpufleetDiskAlmostFull": 120 + 45,
    "GpufleetLivenessNotRunning": 120 + 60 + 45,  # its last round 120 s old, then for: 1m
    "GpufleetEngineNotGenerating": 120 + 60 + 45 + 15,  # no token in 2m, for: 1m; the hang starts at the next request
    "GpufleetRouterRecordDrift": 180 + 45,
}
# ... and to resolve after its repair: the next scrapes and evaluation, 90 s; the error rate is over 2 minutes, so
# the errors leave it 2 minutes after the last one.
BOUND_RESOLVE_S = {
    "GpufleetRouterErrorRate": 120 + 60,
    # the slow answers leave the 5m window (the last ones end up to 12 s after the repair)
    "GpufleetEngineTTFTHigh": 300 + 15 + 90,
    "GpufleetEngineITLHigh": 300 + 15 + 90,
    # from the alert: Alertmanager's group_wait, the rulebook service's playbook run (the prune), the next scrapes
    "GpufleetDiskAlmostFull": 10 + 180 + 90,
    # liveness started again: three failed probes (10 s each, 5 s apart), the incident bundle (py-spy dumps of a hung
    # engine's processes, at most 20 s), the restart and the engine's start, the next scrapes
    "GpufleetEngineNotGenerating": 3 * 15 + 30 + 30 + 90,
}
BOUND_RESOLVE_DEFAULT_S = 90


class DeadMansSwitch(http.server.ThreadingHTTPServer):
    """Stands in for the dead man's switch a user points fleet_monitor_heartbeat_url at (healthchecks.io, Dead Man's
    Snitch): keeps the time (monotonic) of each heartbeat Alertmanager posts and answers 200. It listens on the
    controller's address on the lab's network (the lab hosts' default route), outside the monitor as a real one is."""

    def __init__(self, address: str):
        self.beats: list[float] = []
        switch = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if [a["labels"].get("alertname") for a in body.get("alerts", [])] == ["GpufleetWatchdog"]:
                    switch.beats.append(time.monotonic())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__((address, 0), Handler)
        self.url = f"http://{address}:{self.server_address[1]}/ping/gpufleet-lab"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def last(self) -> float:
        return self.beats[-1] if self.beats else 0.0


def on(host: dict, script: str, check: bool = True) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", "--name", NAME, "exec", host["name"], "--", "bash", "-c", script],
        capture_output=True, text=True, env=LAB_ENV, check=False, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    if check:
        assert proc.returncode == 0, f"{script} on {host['name']}: rc {proc.returncode}\n{out}"
    return out


def playbook(fleet: dict, name: str, *args: str, timeout: int = 1200) -> tuple[int, str]:
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(fleet["work"] / ".facts"))
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(fleet["inventory"]), name, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def get_json(url: str, headers: dict | None = None) -> dict | list:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("mon")
    inventory = work / "inv" / "hosts.yml"
    for wheelhouse in ("router-wheelhouse", "rulebook-wheelhouse"):  # smg's, and the rulebook service's
        subprocess.run(["make", "-s", wheelhouse], cwd=ROOT, check=True, timeout=300)
    result = lab_json("--name", NAME, "up", "--hosts", "2", "--host-names", ",".join(SERVERS), "--routers", "1",
                      "--monitors", "1", "--profile", "rtx-pro-6000x8-vm", "--inventory", str(inventory))  # fmt: skip
    hosts = {h["name"]: h for h in result["hosts"]}
    # the monitor's heartbeat to a dead man's switch, as a user sets it (fleet_monitor_heartbeat_url)
    controller = on(hosts[GATEWAY], "ip -4 route show default").split()[2]
    switch = DeadMansSwitch(controller)
    (inventory.parent / "group_vars").mkdir()
    # the reports in the lab's work folder (a user's land in reports/<fleet>/; the rulebook service's in its own), and
    # the restart and the quarantine turned off (the rulebook test turns the quarantine on for itself)
    group_vars = GROUP_VARS | {"fleet_reports_dir": str(work / "reports"), "fleet_monitor_heartbeat_url": switch.url,
                               **REMEDIATIONS_OFF}  # fmt: skip
    (inventory.parent / "group_vars/all.yml").write_text(json.dumps(group_vars, indent=1))
    (inventory.parent / "host_vars").mkdir()
    # mon-02's engine registers its GPU memory as leaking: it stays held if the engine dies (the simulator's fault)
    env02 = group_vars["sglang_server_environment"] | {"SGLANG_SIM_FAULT": "leak-gpu-memory"}
    (inventory.parent / "host_vars/mon-02.yml").write_text(json.dumps({"sglang_server_environment": env02}))
    for name in SERVERS:
        simfleet.install(NAME, name, LAB_ENV)
    fleet = {"inventory": inventory, "hosts": hosts, "work": work, "switch": switch}
    for name in ("playbooks/deploy_server.yml", "playbooks/router.yml", "playbooks/monitoring.yml"):
        rc, out = playbook(fleet, name)
        (work / f"{os.path.basename(name)}.log").write_text(out)
        assert rc == 0, f"{name}: {out[-6000:]}"
    fleet["first_monitoring_run"] = out
    yield fleet
    switch.shutdown()
    if os.environ.get("GPUFLEET_KEEP_LAB") != "1":  # kept for a look after a failure (the lab tool's `down` later)
        lab("--name", NAME, "down", check=False)


def prometheus(fleet) -> str:
    return f"http://{fleet['hosts'][GATEWAY]['address']}:9090"


def alertmanager(fleet) -> str:
    return f"http://{fleet['hosts'][GATEWAY]['address']}:9093"


def query(fleet, expr: str) -> list:
    url = f"{prometheus(fleet)}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = get_json(url)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def since(start: float) -> float:
    """Seconds from ``start`` (monotonic), at least 0.1 (a wait's truthy value)."""
    return max(0.1, round(time.monotonic() - start, 1))


def prometheus_alerts(fleet, state: str = "") -> set[tuple[str, str]]:
    """(alertname, instance) of the alerts Prometheus' own API holds (pending and firing, or only ``state``)."""
    alerts = get_json(f"{prometheus(fleet)}/api/v1/alerts")["data"]["alerts"]
    return {(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in alerts if state in ("", a["state"])}


def firing(fleet) -> set[tuple[str, str]]:
    """(alertname, instance) of the alerts Alertmanager holds as active (firing, not silenced)."""
    alerts = get_json(f"{alertmanager(fleet)}/api/v2/alerts?active=true&silenced=false&inhibited=false")
    return {(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in alerts}


def test_every_target_is_up(fleet):
    deadline = time.monotonic() + 90
    while True:
        targets = get_json(f"{prometheus(fleet)}/api/v1/targets?state=active")["data"]["activeTargets"]
        seen = sorted((t["labels"]["job"], t["labels"]["instance"], t["health"]) for t in targets)
        if (len(seen) >= 11 and all(h == "up" for *_, h in seen)) or time.monotonic() > deadline:
            break
        time.sleep(3)
    jobs = {}
    for job, instance, state in seen:
        jobs.setdefault(job, []).append((instance, state))
    assert sorted(jobs) == ["alertmanager", "generation_probe", "node", "prometheus", "sglang", "smg"], seen
    assert sorted(i for i, _ in jobs["sglang"]) == list(SERVERS), seen
    # one target per server and question (the questions take turns: fleet_monitor_probe_questions, three)
    assert sorted(i for i, _ in jobs["generation_probe"]) == sorted(list(SERVERS) * 3), seen
    assert sorted(i for i, _ in jobs["node"]) == sorted([*SERVERS, GATEWAY]), seen
    assert all(h == "up" for *_, h in seen), seen
    # the probe answered with the known answer, the GPUs are read, the engines report their 0.5.9 metrics
    answered = query(fleet, 'probe_success{job="generation_probe"} == 1')
    assert sorted((r["metric"]["instance"], r["metric"]["question"]) for r in answered) == sorted(
        (h, q) for h in SERVERS for q in ("What is the capital of France? Answer in one word.",
                                          "What is the capital of Japan? Reply with the city name only.",
                                          "What is 37 + 48? Reply with the number only."))  # fmt: skip
    gpus = query(fleet, 'gpufleet_gpu_memory_engine_bytes{job="node"} > 0')
    assert {r["metric"]["instance"] for r in gpus} == set(SERVERS), gpus
    assert query(fleet, 'sglang:num_running_reqs{job="sglang"}')
    # where to look, said by the run
    assert f"Prometheus http://{fleet['hosts'][GATEWAY]['address']}:9090" in " ".join(
        fleet["first_monitoring_run"].split()
    )


def http_code(host: dict, url: str) -> str:
    """The HTTP status a curl from the host gets, or 000 when the connection is refused or reset."""
    return on(host, f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 {url}", check=False).strip()[-3:]


def test_metrics_reach_only_who_should(fleet):
    """SGLang 0.5.9 serves /metrics without the API key on its API port; the host firewall (fleet_firewall) lets the
    monitor, the gateway and the controller reach that port and node-exporter's, and refuses another host of the
    fleet at once; the gateway's API stays open. The generation API still asks for the key; node-exporter and
    Prometheus listen on the hosts' own addresses, not on every interface."""
    address = fleet["hosts"]["mon-01"]["address"]
    with urllib.request.urlopen(f"http://{address}:8000/metrics", timeout=10) as resp:  # the controller
        assert resp.status == 200 and b"sglang:num_running_reqs" in resp.read()
    gw, other = fleet["hosts"][GATEWAY], fleet["hosts"]["mon-02"]
    assert http_code(gw, f"http://{address}:8000/metrics") == "200"  # the monitor (and gateway)
    assert http_code(gw, f"http://{address}:9100/metrics") == "200"
    assert http_code(other, f"http://{address}:8000/metrics") == "000"  # another server: reset
    assert http_code(other, f"http://{address}:9100/metrics") == "000"
    assert http_code(other, f"http://{gw['address']}:29000/metrics") == "000"  # smg's metrics: the monitor's
    assert http_code(other, f"http://{gw['address']}:30000/liveness") == "200"  # the gateway's API: open
    assert http_code(fleet["hosts"]["mon-01"], f"http://{address}:8000/metrics") == "200"  # the host itself
    assert "table inet gpufleet" in on(fleet["hosts"]["mon-01"], "nft list tables")
    listening = on(fleet["hosts"][GATEWAY], "ss -Hltn")
    assert f"{fleet['hosts'][GATEWAY]['address']}:9090" in listening and "0.0.0.0:9090" not in listening
    assert "127.0.0.1:9115" in listening  # the blackbox exporter: Prometheus' own helper only
    assert "*:9100" not in on(fleet["hosts"]["mon-01"], "ss -Hltn")
    # the probe's key is in a file only Prometheus' group reads, never in a unit, argv or the scrape config
    config = on(fleet["hosts"][GATEWAY], "cat /etc/prometheus/prometheus.yml /etc/prometheus/blackbox.yml")
    assert KEY not in config and KEY not in on(fleet["hosts"][GATEWAY], "ps -eo args")
    assert on(fleet["hosts"][GATEWAY], "stat -c '%a %U %G' /etc/prometheus/gpufleet-probe.key").strip() == (
        "640 root prometheus"
    )


def test_a_second_run_changes_nothing(fleet):
    rc, out = playbook(fleet, "playbooks/monitoring.yml")
    assert rc == 0, out[-4000:]
    recap = [line for line in out.splitlines() if " : ok=" in line]
    assert recap and all("changed=0" in line for line in recap), recap


def group_vars(fleet, **changes) -> None:
    """The module's inventory (group_vars/all.yml) with ``changes``; monitoring.yml copies it to the rulebook
    service."""
    path = fleet["inventory"].parent / "group_vars/all.yml"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes, indent=1))


def json_file(host: dict, path: str, what: str, bound_s: float, details) -> dict:
    """The JSON file at ``path`` on ``host`` once it is there (a shell pattern: the one file it names)."""
    return json.loads(wait_until(what, lambda: on(host, f"cat {path} 2>/dev/null || true").strip(), bound_s, details))


def test_the_rulebook_service_quarantines_a_host_from_its_gpu_alert_and_one_command_releases_it(fleet):
    """Event-Driven Ansible end to end, as deployed: the rulebook service (roles/fleet_rulebook: ansible-rulebook with
    Java 17 under systemd on the monitor's host, its own SSH key, a copy of the inventory) is Alertmanager's receiver.
    With the quarantine turned on in the inventory (monitoring.yml again: the copy), an Xid 79 (GPU 0 fallen off the
    bus) planted in mon-01's kernel log (lab/gpusim/gpusim_kmsg.py) fires GpufleetGpuFatalXid; Alertmanager posts it;
    the service's rule runs playbooks/remediate.yml for mon-01: out of the gateway, its quarantine record and metric,
    the report in the service's folder; GpufleetHostQuarantined fires. The fault cleared (the kernel log of that boot
    gone, as a reboot leaves it), the release (a person's command, from the controller) puts it back and the
    quarantine's alert resolves; the quarantine is turned off again."""
    h1, gw = fleet["hosts"]["mon-01"], fleet["hosts"][GATEWAY]
    assert on(gw, "systemctl is-active gpufleet-rulebook.service").strip() == "active"
    assert 'url: "http://127.0.0.1:5000/alerts"' in on(gw, "cat /etc/prometheus/alertmanager.yml")
    # its key is its own (made on the gateway host), authorized on mon-01; the service runs unprivileged
    assert on(gw, "stat -c '%U %a' /var/lib/gpufleet-rulebook/.ssh/id_ed25519").strip() == "gpufleet-rulebook 600"
    public = on(gw, "cat /var/lib/gpufleet-rulebook/.ssh/id_ed25519.pub").split()[1]
    assert public in on(h1, "cat /root/.ssh/authorized_keys")
    owner = on(gw, "ps -o user= -p $(systemctl show -p MainPID --value gpufleet-rulebook)").strip()
    assert owner == "gpufleet-rulebook"
    record = "/var/lib/gpufleet/quarantine.json"
    group_vars(fleet, fleet_remediation_quarantine_enabled=True)
    try:
        rc, out = playbook(fleet, "playbooks/monitoring.yml")
        assert rc == 0, out[-4000:]
        planted = time.monotonic()
        assert "NVRM: Xid (PCI:0000:01:00): 79, " in on(h1, "gpusim-kmsg --xid 79 --gpu 0")
        assert "GPU has fallen off the bus." in on(h1, "journalctl -k -b -o cat --no-pager")
        xid, quarantined = ("GpufleetGpuFatalXid", "mon-01"), ("GpufleetHostQuarantined", "mon-01")
        fired = wait_for(fleet, {xid: ""}, True, BOUND_FIRE_S, {xid: planted})

        # then Alertmanager's group_wait, the service's run (the drain of mon-01's own requests)
        def journal() -> str:
            return on(gw, "journalctl -u gpufleet-rulebook --no-pager | tail -60")

        quarantine = json_file(h1, record, "mon-01's quarantine record", 180, journal)
        quarantined_after = round(time.monotonic() - planted, 1)
        assert quarantine["alert"] == "GpufleetGpuFatalXid", quarantine
        assert quarantine["reason"] == "Xid 79 on GPU 0 of mon-01", quarantine  # the alert's summary
        assert "Xid 79 (fallen off the bus) needs the VM powered off and on" in quarantine["remedy"], quarantine
        wait_for_router(fleet, 1)  # mon-02 only
        assert [w["url"] for w in router_workers(fleet) if w.get("is_healthy")] == [
            f"http://{fleet['hosts']['mon-02']['address']}:8000"
        ]
        fired |= wait_for(fleet, {quarantined: ""}, True, {"GpufleetHostQuarantined": 60 + 45}, {quarantined: planted})
        report = json_file(gw, f"{RULEBOOK_REPORTS}/*-mon-01-quarantine.json", "the service's report", 60, journal)
        assert report["result"] == "quarantined" and report["alert"] == "GpufleetGpuFatalXid"
        # the person: the VM powered off and on (this boot's kernel log gone with it), then one command
        on(h1, "gpusim-kmsg --clear")
        rc, out = playbook(fleet, "playbooks/remediate.yml", "-l", "mon-01", "-e", "fleet_remediation_action=release")
        assert rc == 0, out[-4000:]
        assert "RELEASED mon-01: it serves and is back in every gateway; quarantine lifted." in " ".join(out.split())
        wait_for_router(fleet, 2)
        released = time.monotonic()
        wait_for(
            fleet,
            {quarantined: "", xid: ""},
            False,
            BOUND_RESOLVE_DEFAULT_S,
            {quarantined: released, xid: released},
        )
        # a quiet fleet again for the fault rounds (mon-01's absence from the gateway fired GpufleetRouterWorkerMissing)
        quiet = {("GpufleetWatchdog", GATEWAY)}
        wait_until("a quiet fleet again", lambda: {a for a in firing(fleet) if a[0].startswith("Gpufleet")} == quiet,
                   BOUND_RESOLVE_DEFAULT_S + 60, lambda: str(firing(fleet)))  # fmt: skip
    finally:
        on(h1, "gpusim-kmsg --clear")
        group_vars(fleet, **REMEDIATIONS_OFF)
        rc, out = playbook(fleet, "playbooks/monitoring.yml")  # the copy with the quarantine off again
        assert rc == 0, out[-4000:]
        # a fresh start for the fault rounds: this quarantine holds the rule's 30-minute throttle for mon-01, which
        # would keep the rounds' GPU alerts on mon-01 from reaching the playbook at all
        on(gw, "systemctl restart gpufleet-rulebook.service")
        answers = "curl -s -o /dev/null -w '%{http_code}' -m 5 -X POST -d '{}' http://127.0.0.1:5000/alerts"
        wait_until("the rulebook service answers again", lambda: on(gw, answers, check=False).endswith("400"), 120)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    measured = {"GpufleetGpuFatalXid fired_after_s": fired[xid], "quarantined_after_s": quarantined_after,
                "GpufleetHostQuarantined fired_after_s": fired[quarantined]}  # fmt: skip
    (ARTIFACTS / "monitoring-quarantine.json").write_text(json.dumps(measured, indent=1))
    print("quarantine:", json.dumps(measured))


def wait_for(fleet, wanted: dict, present: bool, bound_s: dict | float, since: dict | None = None) -> dict:
    """Seconds from each key's start (``since``, monotonic times; default: now) until each (alertname, instance) of
    ``wanted`` is active in Alertmanager (present) or gone; fails once one passes its bound (per alert name)."""
    called, seen = time.monotonic(), {}
    since = {key: (since or {}).get(key, called) for key in wanted}

    def bound(key):
        if isinstance(bound_s, dict):
            return bound_s.get(key[0], BOUND_RESOLVE_DEFAULT_S) if not present else bound_s[key[0]]
        return bound_s

    while len(seen) < len(wanted):
        now, t = firing(fleet), time.monotonic()
        for key in wanted:
            if key not in seen and ((key in now) == present):
                seen[key] = round(t - since[key], 1)
        late = [k for k in wanted if k not in seen and t - since[k] > bound(k)]
        assert not late, f"{'not firing' if present else 'still firing'} within the bound: {late}; active: {now}"
        time.sleep(2)
    return seen


def router_workers(fleet) -> list[dict]:
    out = on(fleet["hosts"][GATEWAY],
             f"curl -s -m 5 -H 'Authorization: Bearer {ROUTER_KEY}' http://127.0.0.1:30000/workers")  # fmt: skip
    return json.loads(out)["workers"]


def remove_worker(fleet, worker: dict) -> None:
    on(fleet["hosts"][GATEWAY], f"curl -sf -m 10 -X DELETE -H 'Authorization: Bearer {ROUTER_KEY}' "
                                f"http://127.0.0.1:30000/workers/{worker['id']}")  # fmt: skip


def wait_for_router(fleet, healthy: int, bound_s: float = 60) -> None:
    """Until smg answers on the gateway and lists ``healthy`` healthy workers (after a start: its health checks)."""
    deadline, workers = time.monotonic() + bound_s, None
    while time.monotonic() < deadline:
        try:
            workers = router_workers(fleet)
        except (AssertionError, ValueError, KeyError):  # not answering yet
            workers = None
        if workers is not None and sum(1 for w in workers if w.get("is_healthy")) == healthy:
            return
        time.sleep(1)
    raise AssertionError(f"smg does not list {healthy} healthy worker(s) within {bound_s} s: {workers}")


class Clients(threading.Thread):
    """Clients: ``threads`` of them, each a short chat completion (streamed with ``stream``), then ``pause_s``, again
    until done; every answer's HTTP status kept with its time (0: no answer). The fault rounds' clients of the gateway
    (one, every 2 s: 0.5 requests/s, over the error-rate alert's floor of 0.05); round 3's of one engine itself (three,
    streamed, back to back)."""

    def __init__(self, url: str, threads: int = 1, pause_s: float = 2, stream: bool = False, max_tokens: int = 8):
        super().__init__(daemon=True)
        self.url, self.threads, self.pause_s = url, threads, pause_s
        self.body = json.dumps({"model": "glm-5", "messages": [{"role": "user", "content": "Say hello."}],
                                "max_tokens": max_tokens, "stream": stream,
                                "chat_template_kwargs": {"enable_thinking": False}}).encode()  # fmt: skip
        self.answers: list[tuple[float, int]] = []
        self.done = threading.Event()

    def one(self) -> None:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(urllib.request.Request(self.url, self.body, headers), timeout=60) as resp:
                    resp.read()
                    status = resp.status
            except urllib.error.HTTPError as err:
                status = err.code
            except OSError:
                status = 0
            self.answers.append((time.monotonic(), status))
            self.done.wait(self.pause_s or (1 if status == 0 else 0))

    def run(self):
        threads = [threading.Thread(target=self.one, daemon=True) for _ in range(self.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


class Faults:
    """The faults a test plants ({(alertname, instance): what}), when each was planted and when repaired (monotonic),
    and the measured times of each alert: fired after its fault, resolved after its repair."""

    def __init__(self):
        self.faults, self.planted, self.repaired_at = {}, {}, {}

    def plant(self, keys: dict) -> None:
        self.faults.update(keys)
        self.planted.update(dict.fromkeys(keys, time.monotonic()))

    def repaired(self, *keys) -> None:
        self.repaired_at.update(dict.fromkeys(keys, time.monotonic()))

    def measured(self, fired: dict, resolved: dict) -> dict:
        return {f"{a} {i}".strip(): {"fault": what, "fired_after_s": fired[(a, i)],
                                     "resolved_after_repair_s": resolved.get((a, i))}
                for (a, i), what in self.faults.items()}  # fmt: skip


def test_each_fault_fires_its_alert_and_the_repair_resolves_it(fleet):
    h1, h2, gw = fleet["hosts"]["mon-01"], fleet["hosts"]["mon-02"], fleet["hosts"][GATEWAY]
    # a quiet fleet first, but for the heartbeat of the monitor (on the gateway host), which always fires
    now = firing(fleet)
    assert {a for a in now if a[0].startswith("Gpufleet")} == {("GpufleetWatchdog", GATEWAY)}, now
    log, fired, resolved = Faults(), {}, {}
    faults, planted, repaired_at, plant, repaired = log.faults, log.planted, log.repaired_at, log.plant, log.repaired

    # round 1: the faults
    restarting, probe, ecc = (("GpufleetEngineRestarting", "mon-01"), ("GpufleetGenerationProbeFailing", "mon-01"),
                              ("GpufleetGpuEccUncorrected", "mon-01"))  # fmt: skip
    foreign, down = ("GpufleetGpuForeignMemory", "mon-02"), ("GpufleetEngineDown", "mon-02")
    hot, throttled, pcie = (("GpufleetGpuHot", "mon-01"), ("GpufleetGpuThrottled", "mon-01"),
                            ("GpufleetGpuPcieDegraded", "mon-01"))  # fmt: skip
    remap_failed, remap_pending = ("GpufleetGpuRowRemapFailed", "mon-01"), ("GpufleetGpuRowRemapPending", "mon-01")
    xid, fatal_xid = ("GpufleetGpuXidErrors", "mon-01"), ("GpufleetGpuFatalXid", "mon-01")
    missing, node = ("GpufleetRouterWorkerMissing", GATEWAY), ("GpufleetNodeExporterDown", GATEWAY)
    thresholds = ("GpufleetThresholdMissing", "")
    # mon-01's kernel log readable first (its first line, lab/gpusim/gpusim_kmsg.py), as a real host's is: its Xid count
    # is 0 before the Xid line below (the rulebook test's Xid had no such line: its count began at 1, so
    # GpufleetGpuXidErrors, a rise over 15m, did not fire there)
    on(h1, "gpusim-kmsg --boot")
    wait_until("mon-01's Xid count of 0 in Prometheus",
               lambda: query(fleet, 'gpufleet_gpu_xid_errors_total{instance="mon-01"} == 0'), 60)  # fmt: skip
    on(gw, f"sed -i '/record: gpufleet:ttft_p99_threshold_seconds/,+2d' {THRESHOLDS}; "
           "systemctl reload prometheus.service")  # fmt: skip
    assert "gpufleet:ttft_p99_threshold_seconds" not in on(gw, f"cat {THRESHOLDS}")
    plant({thresholds: "the monitor's thresholds file without the lab class's TTFT threshold"})
    on(h1, "kill -9 $(systemctl show -p MainPID --value sglang-server.service)")
    on(h1, f"echo wrong-answer > {FAULT_FILE}")
    # mon-01's GPUs also: GPU 1 at 95 C, GPU 2 in hardware thermal slowdown (nvml.h 0x8 | 0x40), GPU 3 with a row
    # remapping pending and one failed, GPU 4 busy on a link trained at x8 of x16 (lab/gpusim/README.md: profile keys)
    gpusim_profile(h1, "g = p['gpus']; g[0]['ecc_uncorrected_volatile'] = 1; g[1]['temperature_c'] = 95; "
                       "g[2]['clocks_event_reasons'] = 0x48; g[3]['q'] = {'Remapped Rows / Pending': 'Yes', "
                       "'Remapped Rows / Remapping Failure Occurred': 'Yes'}; "
                       "g[4]['q'] = {'PCI / GPU Link Info / Link Width / Current': '8x'}; "
                       "g[4]['utilization_gpu'] = 97")  # fmt: skip
    assert "NVRM: Xid (PCI:0000:06:00): 79, " in on(h1, "gpusim-kmsg --xid 79 --gpu 5")  # GPU 5 fell off the bus
    on(h2, "kill -9 $(systemctl show -p MainPID --value sglang-server.service)")
    remove_worker(fleet, next(w for w in router_workers(fleet) if h2["address"] in w["url"]))
    on(gw, "systemctl stop prometheus-node-exporter.service")
    round1 = {
        restarting: "kill -9 of mon-01's engine",
        probe: "mon-01 answers wrong",
        ecc: "an uncorrected ECC error on mon-01's GPU 0",
        hot: "mon-01's GPU 1 at 95 C",
        throttled: "mon-01's GPU 2 in hardware thermal slowdown",
        remap_failed: "a failed row remapping on mon-01's GPU 3",
        remap_pending: "a row remapping pending on mon-01's GPU 3",
        pcie: "mon-01's GPU 4 busy on a PCIe link at x8 of x16",
        xid: "an Xid line in mon-01's kernel log",
        fatal_xid: "an Xid 79 (fallen off the bus) for mon-01's GPU 5",
        foreign: "mon-02's engine killed, its leaked GPU memory held",
        down: "mon-02's engine killed, no GPU memory left for its restart",
        missing: "mon-02 removed from the router",
        node: "the gateway's node exporter stopped",
    }
    plant(round1)
    fired |= wait_for(fleet, round1, True, BOUND_FIRE_S, planted)
    # the remediations are turned off: the rulebook service ran the quarantine for mon-01's GPU alerts and it acted on
    # nothing (its turned-off report, no record, mon-01 still a worker of the gateway)
    turned_off = wait_until(
        "the service's turned-off report for mon-01",
        lambda: on(gw, f"ls {RULEBOOK_REPORTS} 2>/dev/null | grep -- '-mon-01-quarantine-turned-off.json$' || true"),
        120,
        lambda: on(gw, "journalctl -u gpufleet-rulebook --no-pager | tail -40"),
    )
    assert turned_off and on(h1, "ls /var/lib/gpufleet/quarantine.json 2>/dev/null || true").strip() == ""
    assert h1["address"] in " ".join(w["url"] for w in router_workers(fleet))
    # round 1: the repairs
    on(h1, f": > {FAULT_FILE}")
    gpusim_profile(h1, None)
    on(h1, "gpusim-kmsg --clear && gpusim-kmsg --boot")  # the VM powered off and on: a new boot's kernel log
    on(gw, "systemctl start prometheus-node-exporter.service")
    repaired(probe, node, hot, throttled, remap_failed, remap_pending, pcie, fatal_xid)
    # (GpufleetGpuXidErrors, like the ECC and restart counts, stays 15 minutes after its line: the rule's window)
    gpu_health = dict.fromkeys((hot, throttled, remap_failed, remap_pending, pcie, fatal_xid), "")
    resolved |= wait_for(fleet, {probe: "", node: "", **gpu_health}, False, BOUND_RESOLVE_S, repaired_at)
    on(h2, "systemctl stop sglang-server.service; nvidia-smi --gpu-reset -i 0,1,2,3,4,5,6,7 >/dev/null; "
           "systemctl reset-failed sglang-server.service; systemctl start sglang-server.service")  # fmt: skip
    deadline = time.monotonic() + 120
    while health(h2["address"]) != 200 and time.monotonic() < deadline:
        time.sleep(1)
    repaired(foreign, down)
    rc, out = playbook(fleet, "playbooks/router.yml")
    assert rc == 0, out[-4000:]
    repaired(missing)
    resolved |= wait_for(fleet, {foreign: "", down: "", missing: ""}, False, BOUND_RESOLVE_S, repaired_at)

    # round 2: smg killed (systemd restarts it), then stopped; the GPU faults meanwhile
    router_restarting, router_down = ("GpufleetRouterRestarting", GATEWAY), ("GpufleetRouterDown", GATEWAY)
    collector, stale = ("GpufleetGpuCollectorFailing", "mon-01"), ("GpufleetGpuMetricsStale", "mon-02")
    restarts = int(on(gw, "systemctl show -p NRestarts --value smg-router.service").strip())
    on(gw, "kill -9 $(systemctl show -p MainPID --value smg-router.service)")
    plant({router_restarting: "kill -9 of smg"})
    gpusim_profile(h1, "p['failure'] = {'rc': 9}")  # nvidia-smi: couldn't communicate with the NVIDIA driver
    on(h2, "systemctl stop gpufleet-gpu-metrics.timer")
    plant({collector: "nvidia-smi fails on mon-01 (the driver does not answer)",
           stale: "mon-02's GPU metrics timer stopped"})  # fmt: skip
    wait_for_router(fleet, healthy=2)
    assert int(on(gw, "systemctl show -p NRestarts --value smg-router.service").strip()) > restarts
    # seen before smg is stopped: a stop and a manual start are not restarts, and may reset systemd's count
    fired |= wait_for(fleet, {router_restarting: ""}, True, BOUND_FIRE_S, planted)
    on(gw, "systemctl stop smg-router.service")
    plant({router_down: "smg stopped"})
    fired |= wait_for(fleet, {router_down: ""}, True, BOUND_FIRE_S, planted)
    on(gw, "systemctl start smg-router.service")
    repaired(router_down)
    wait_for_router(fleet, healthy=2)
    # smg down also left no router with a healthy worker (the worker-count alerts without an instance): all gone
    # before the gateway's next fault raises them again
    every_router = {("GpufleetRouterWorkersBelowBudget", ""): "", ("GpufleetRouterWorkerMissing", ""): ""}
    resolved |= wait_for(fleet, {router_down: "", **every_router}, False, BOUND_RESOLVE_S, repaired_at)

    # round 2: every worker removed from smg while clients call the gateway; the rulebook service (Alertmanager's
    # receiver) stopped first, so the notifications of the alerts that follow fail
    no_healthy, errors = ("GpufleetRouterNoHealthyWorkers", GATEWAY), ("GpufleetRouterErrorRate", GATEWAY)
    delivery = ("GpufleetAlertDeliveryFailing", GATEWAY)
    budget, missing_all = every_router
    on(gw, "systemctl stop gpufleet-rulebook.service")
    for worker in router_workers(fleet):
        remove_worker(fleet, worker)
    clients = Clients(f"http://{gw['address']}:30000/v1/chat/completions")
    clients.start()
    try:
        removed = "every worker removed from smg"
        plant({no_healthy: removed, budget: removed, missing_all: removed, errors: "clients of a gateway, no worker",
               delivery: "the rulebook service, Alertmanager's receiver, stopped"})  # fmt: skip
        round2 = (no_healthy, budget, missing_all, errors, collector, stale, thresholds, delivery)
        fired |= wait_for(fleet, {k: faults[k] for k in round2}, True, BOUND_FIRE_S, planted)
        # round 2: the repairs (the clients go on); the failed deliveries stay in the alert's 10m window (its
        # resolution: the promtool tests)
        on(gw, "systemctl start gpufleet-rulebook.service")
        gpusim_profile(h1, None)
        on(h2, "systemctl start gpufleet-gpu-metrics.timer")
        repaired(collector, stale)
        resolved |= wait_for(fleet, {collector: "", stale: ""}, False, BOUND_RESOLVE_S, repaired_at)
        router_yml = time.monotonic()
        rc, out = playbook(fleet, "playbooks/router.yml")
        assert rc == 0, out[-4000:]
        repaired(no_healthy, budget, missing_all, errors)
        resolved |= wait_for(fleet, {no_healthy: "", budget: "", missing_all: ""}, False, BOUND_RESOLVE_S, repaired_at)
        rc, out = playbook(fleet, "playbooks/monitoring.yml")  # renders the thresholds file again
        assert rc == 0, out[-4000:]
        repaired(thresholds)
        resolved |= wait_for(fleet, {errors: "", thresholds: ""}, False, BOUND_RESOLVE_S, repaired_at)
    finally:
        clients.done.set()
        clients.join(timeout=60)
        on(gw, "systemctl start gpufleet-rulebook.service")
    # the clients got errors from the gateway without workers, then answers
    during = [s for t, s in clients.answers if t < router_yml]
    after = [s for t, s in clients.answers if t > repaired_at[errors]]
    assert during and all(s >= 400 for s in during), clients.answers
    assert after and all(s == 200 for s in after), clients.answers

    # last: Alertmanager itself stopped. Its own API is gone, so Prometheus' says (the alert fires there; nothing can
    # deliver it: the heartbeat's receiver notices its absence); repair: started, and Prometheus sees it up again
    am_down = ("GpufleetAlertmanagerDown", GATEWAY)
    on(gw, "systemctl stop prometheus-alertmanager.service")
    plant({am_down: "Alertmanager stopped"})
    try:
        fired[am_down] = wait_until(
            "GpufleetAlertmanagerDown firing in Prometheus",
            lambda: am_down in prometheus_alerts(fleet, "firing") and since(planted[am_down]),
            BOUND_FIRE_S["GpufleetAlertmanagerDown"],
            lambda: str(prometheus_alerts(fleet, "firing")),
        )
    finally:
        on(gw, "systemctl start prometheus-alertmanager.service")
    repaired(am_down)
    # the dead man's switch heard nothing meanwhile (its heartbeats stop with Alertmanager), and hears it again at once
    # (a new group: group_wait 0s, once Prometheus sends the Watchdog again within its 15 s resend delay)
    switch = fleet["switch"]
    assert not [b for b in switch.beats if planted[am_down] + 1 < b < repaired_at[am_down]], switch.beats[-5:]
    wait_until("the heartbeat after Alertmanager's start", lambda: switch.last() > repaired_at[am_down], 60)
    resolved[am_down] = wait_until(
        "GpufleetAlertmanagerDown resolved in Prometheus",
        lambda: am_down not in prometheus_alerts(fleet) and since(repaired_at[am_down]),
        BOUND_RESOLVE_DEFAULT_S,
        lambda: str(prometheus_alerts(fleet)),
    )

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    measured = log.measured(fired, resolved)
    measured["clients"] = {"statuses_before_repair": sorted(set(during)), "requests": len(clients.answers)}
    (ARTIFACTS / "monitoring-faults.json").write_text(json.dumps(measured, indent=1))
    print("alerts:", json.dumps(measured))
    # the dashboards' queries on the repaired fleet (GpufleetEngineRestarting still fires: the firing-alerts panels)
    check_dashboard_queries(fleet)


def test_the_fleet_report_opens_with_now_from_prometheus(fleet):
    """The fleet report's "Now" section, read from the monitor's Prometheus HTTP API: tokens/s, TTFT and GPU memory
    per server and the alerts firing (the kill -9 of the fault test keeps GpufleetEngineRestarting firing for 15
    minutes), seen in headless Chromium."""
    reports = fleet["work"] / "reports"
    python = subprocess.run([sys.executable, "tools/bench_client.py", "build"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip().splitlines()[-1]  # fmt: skip
    proc = subprocess.run(
        [python, "roles/serving_bench/files/fleet_report.py", str(reports), "templates/fleet-report.html.j2",
         "--deploy-dir", str(reports / "deploy"), "--fleet", "t-mon", "--prometheus", prometheus(fleet)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    dom = chromium(reports / "fleet-report.html", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert '<h2 id="now">Now</h2>' in page and f"From Prometheus <code>{prometheus(fleet)}</code>" in page
    for host in SERVERS:
        row = page[page.index(f'data-now-host="{host}"') :].split("</tr>")[0]
        used, total = (float(x) for x in re.findall(r"([\d.]+) / ([\d.]+)</td>\s*$", row)[0])
        assert 0 < used <= total, row  # the engine's GPU memory, from the GPU metrics
    assert 'data-alert="GpufleetEngineRestarting"' in page
    assert "# gpufleet fleet report: t-mon" in (reports / "fleet-report.md").read_text()


def check_dashboard_queries(fleet) -> None:
    """Every panel query of every dashboard (tools/dashboards.py --queries) returns series from the lab's Prometheus:
    a metric name that drifted (SGLang's own dashboard broke over `sglang:` vs `sglang_`) returns none."""
    # traffic through the gateway first: the router's request metrics exist from its first request, and SGLang
    # observes inter-token latency on streamed answers only
    for stream in (False, True, True):
        body = json.dumps(
            {"model": "glm-5", "messages": [{"role": "user", "content": "dashboards"}], "max_tokens": 16,
             "stream": stream}
        ).encode()  # fmt: skip
        req = urllib.request.Request(f"http://{fleet['hosts'][GATEWAY]['address']}:30000/v1/chat/completions",
                                     data=body, headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {KEY}"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200 and resp.read()
    time.sleep(12)  # two scrapes
    lines = subprocess.run([sys.executable, "tools/dashboards.py", "--queries"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()  # fmt: skip
    empty = []
    for line in lines:
        q = json.loads(line)
        if not query(fleet, q["expr"]):
            empty.append(f"{q['dashboard']} / {q['panel']}: {q['expr']}")
    assert lines and not empty, "panels with no series:\n" + "\n".join(empty)


def test_a_deploy_whose_engine_resolves_against_the_policy_is_rolled_back(fleet):
    """SGLang resolves kv-cache-dtype auto to fp8_e4m3 for GLM-5's sparse attention on compute capability >= 10 (the
    lab's RTX PRO 6000 is 12.0). A GPU class policy that needs bfloat16 fails the new start's health check, naming the
    field, and the last good version serves again; the deploy report records what the engine resolved."""
    h1 = fleet["hosts"]["mon-01"]
    policy = {"NVIDIA RTX PRO 6000 Blackwell Server Edition x8": {"kv_cache_dtype": "bfloat16"}}
    extra = {"sglang_server_resolved_policy": policy, "sglang_server_args_host": {"kv-cache-dtype": "auto"}}
    before = on(h1, "sha256sum /etc/systemd/system/sglang-server.service")
    rc, out = playbook(fleet, "playbooks/deploy_server.yml", "-l", "mon-01", "-e", json.dumps(extra))
    flat = " ".join(out.split())
    assert rc != 0, flat[-3000:]
    assert "the engine resolved kv_cache_dtype='fp8_e4m3' where sglang_server_resolved_policy needs 'bfloat16'" in flat
    report = json.loads((fleet["work"] / "reports/deploy/mon-01.json").read_text())
    assert report["result"] == "rolled_back", (report["result"], flat[-6000:])
    assert report["resolved_policy"] == {"kv_cache_dtype": "bfloat16"}
    assert on(h1, "sha256sum /etc/systemd/system/sglang-server.service") == before  # the last good unit
    assert health(h1["address"]) == 200


def stream_until_hung(host: dict, started: threading.Event) -> None:
    """A long streamed generation on the host's engine; ``started`` is set once 60 tokens came (past the scheduler's
    decode log at 40 steps, which sets num_running_reqs). It ends when the engine does."""
    body = json.dumps({"text": "Tell a long story.", "stream": True,
                       "sampling_params": {"max_new_tokens": 20000, "ignore_eos": True}}).encode()  # fmt: skip
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    req = urllib.request.Request(f"http://{host['address']}:8000/generate", body, headers)
    chunks = 0
    try:
        with urllib.request.urlopen(req, timeout=900) as resp:
            for line in resp:
                chunks += line.startswith(b"data:")
                if chunks >= 60:
                    started.set()
    except OSError:
        pass


def test_the_slow_faults_fire_their_alerts_and_a_full_disk_heals_itself(fleet):
    """Round 3, the faults whose alerts take minutes, all at once, each on its own host or layer:

    * mon-02: every forward step 6 s longer (the simulator's runtime fault ``slow-step=6``: a GPU held at low clocks)
      under three streaming clients of its own -> GpufleetEngineTTFTHigh and GpufleetEngineITLHigh (p99 over 5m above
      the class's 5 s and 0.2 s, for 2m); the engine still finishes requests, so liveness leaves it alone (busy, not
      hung); repair: the fault file emptied, the clients stopped; they resolve once the slow answers leave the 5m
      window;
    * mon-01: ``/srv/models`` on a 64 MiB file system of its own (a loop device: a lab host's root is the controller's
      own disk) holding the model and an unused revision of another model, two days old, that leaves 5% free ->
      GpufleetDiskAlmostFull; the rulebook service runs the prune (on, as a user has it): the old revision goes, the
      model stays, and the alert resolves with no person;
    * mon-01 also: a long stream running, the liveness service stopped (-> GpufleetLivenessNotRunning), then its
      scheduler stuck (``hang-after-ready``) -> GpufleetEngineNotGenerating; repair: the fault file emptied and
      liveness started again, which restarts the hung engine (on mon-01: mon-02's engine leaks its GPU memory when
      killed, the module's fault for GpufleetGpuForeignMemory);
    * the gateway: mon-01 deleted through smg's own API -> GpufleetRouterRecordDrift (``not_in_router``) and
      GpufleetRouterWorkerMissing; repair: playbooks/router.yml once mon-01 answers again.
    """
    h1, h2, gw = fleet["hosts"]["mon-01"], fleet["hosts"]["mon-02"], fleet["hosts"][GATEWAY]
    ttft, itl, disk = (("GpufleetEngineTTFTHigh", "mon-02"), ("GpufleetEngineITLHigh", "mon-02"),
                       ("GpufleetDiskAlmostFull", "mon-01"))  # fmt: skip
    liveness, stuck = ("GpufleetLivenessNotRunning", "mon-01"), ("GpufleetEngineNotGenerating", "mon-01")
    drift, missing = ("GpufleetRouterRecordDrift", GATEWAY), ("GpufleetRouterWorkerMissing", GATEWAY)
    log = Faults()
    planted, repaired_at, plant, repaired = log.planted, log.repaired_at, log.plant, log.repaired

    image, device = fleet["work"] / "mon-01-models.img", ""
    engine = f"http://{h2['address']}:8000/v1/chat/completions"
    clients, stream_started = Clients(engine, threads=3, pause_s=0, stream=True, max_tokens=2), threading.Event()
    try:
        # mon-01's model folder on a small file system: the model copied in, then an old revision that fills it
        subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        device = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True,
                                check=True).stdout.strip()  # fmt: skip
        rdev = os.stat(device).st_rdev
        on(h1, f"mknod /dev/gpufleet-models b {os.major(rdev)} {os.minor(rdev)} && mkdir -p /run/gpufleet-models && "
               "mount /dev/gpufleet-models /run/gpufleet-models && cp -a /srv/models/. /run/gpufleet-models/ && "
               "umount /run/gpufleet-models && mount /dev/gpufleet-models /srv/models")  # fmt: skip
        old = "/srv/models/glm-4-old/rev-2025-06"
        on(h1, f"mkdir -p {old} && size=$(df --output=size -B1 /srv/models | tail -1) && "
               f"avail=$(df --output=avail -B1 /srv/models | tail -1) && "
               f"fallocate -l $((avail - size / 20)) {old}/model-00001-of-00001.safetensors && "
               f"touch -d '2 days ago' {old}/model-00001-of-00001.safetensors {old} /srv/models/glm-4-old")  # fmt: skip
        plant({disk: "mon-01's /srv/models 95% full (an unused revision of another model)"})
        # mon-01: a stream running, liveness stopped, the scheduler stuck; the gateway: mon-01 deleted through its API
        threading.Thread(target=stream_until_hung, args=(h1, stream_started), daemon=True).start()
        assert stream_started.wait(60), "mon-01's stream did not start"
        on(h1, "systemctl stop sglang-server-liveness.service")
        plant({liveness: "mon-01's liveness service stopped"})
        on(h1, f"echo hang-after-ready > {FAULT_FILE}")
        plant({stuck: "mon-01's scheduler stuck with a stream running"})
        remove_worker(fleet, next(w for w in router_workers(fleet) if h1["address"] in w["url"]))
        plant({drift: "mon-01 deleted through smg's own API", missing: "mon-01 deleted through smg's own API"})
        # mon-02: every step 6 s longer under three streaming clients
        on(h2, f"echo slow-step=6 > {FAULT_FILE}")
        clients.start()
        slow = "mon-02's steps 6 s longer, three streaming clients"
        plant({ttft: slow, itl: slow})

        fired = wait_for(fleet, {ttft: "", itl: "", disk: ""}, True, BOUND_FIRE_S, planted)
        on(h2, f": > {FAULT_FILE}")
        clients.done.set()
        repaired(ttft, itl)
        # the full disk: the rulebook service's prune, no person
        report = json_file(gw, f"{RULEBOOK_REPORTS}/*-mon-01-prune.json", "the service's prune report", 240,
                           lambda: on(gw, "journalctl -u gpufleet-rulebook --no-pager | tail -60"))  # fmt: skip
        assert report["result"] == "pruned" and report["alert"] == "GpufleetDiskAlmostFull", report
        assert [r["path"] for r in report["prune"]["removed"]] == [old], report
        assert on(h1, "ls /srv/models/glm-5-sim | wc -l").strip() != "0"  # the model in use stays
        resolved = wait_for(fleet, {disk: ""}, False, BOUND_RESOLVE_S, {disk: planted[disk] + fired[disk]})

        fired |= wait_for(fleet, {liveness: "", stuck: "", drift: "", missing: ""}, True, BOUND_FIRE_S, planted)
        invocation = "systemctl show -p InvocationID --value sglang-server.service"
        hung_run = on(h1, invocation).strip()
        on(h1, f": > {FAULT_FILE}; systemctl start sglang-server-liveness.service")
        repaired(liveness, stuck)
        journals = "journalctl -u sglang-server-liveness -u sglang-server --no-pager | tail -40"
        wait_until("liveness restarts mon-01's hung engine and it answers",
                   lambda: health(h1["address"]) == 200 and on(h1, invocation).strip() != hung_run,
                   BOUND_RESOLVE_S["GpufleetEngineNotGenerating"], lambda: on(h1, journals))  # fmt: skip
        rc, out = playbook(fleet, "playbooks/router.yml")
        assert rc == 0, out[-4000:]
        repaired(drift, missing)
        resolved |= wait_for(fleet, {liveness: "", stuck: "", drift: "", missing: ""}, False, BOUND_RESOLVE_S,
                             repaired_at)  # fmt: skip
        resolved |= wait_for(fleet, {ttft: "", itl: ""}, False, BOUND_RESOLVE_S, repaired_at)
    finally:
        clients.done.set()
        on(h2, f": > {FAULT_FILE}", check=False)
        on(h1, f": > {FAULT_FILE}; systemctl start sglang-server-liveness.service", check=False)
        on(h1, "umount -l /srv/models; rm -f /dev/gpufleet-models", check=False)
        if device:
            subprocess.run(["losetup", "-d", device], check=False)
        image.unlink(missing_ok=True)
    assert clients.answers and all(s == 200 for _, s in clients.answers), clients.answers  # slow, never failed
    measured = log.measured(fired, resolved)
    # the full disk had no repair by hand: its resolution counts from the alert (the service's prune in between)
    measured[" ".join(disk)]["resolved_after_firing_s"] = measured[" ".join(disk)].pop("resolved_after_repair_s")
    measured["prune"] = {"removed": report["prune"]["removed"], "free_ratio_after": report["prune"]["free_ratio_after"]}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "monitoring-slow-faults.json").write_text(json.dumps(measured, indent=1))
    print("slow alerts:", json.dumps(measured))


def test_a_stopped_prometheus_is_noticed_by_the_heartbeats_silence(fleet):
    """Prometheus stopped raises no alert of its own: the dead man's switch notices that the heartbeat stopped. Each
    send of GpufleetWatchdog to Alertmanager is valid for 4 x fleet_monitor_alert_resend_delay (15 s; Prometheus 2.42
    rules/alerting.go:524-534), so the last heartbeat comes at most 60 s after the stop, then none: a switch that
    expects one every fleet_monitor_heartbeat_interval (1m) pages at most 2 minutes after the stop plus its grace.
    Started again, the heartbeat is back at the first evaluation (the route's group_wait: 0s). Last in the module:
    nothing else is watched meanwhile."""
    switch, gw = fleet["switch"], fleet["hosts"][GATEWAY]
    # a minute apart while the monitor works (the module has run for many minutes by now)
    recent = [b for b in switch.beats if b > time.monotonic() - 600]
    gaps = [round(b - a, 1) for a, b in zip(recent, recent[1:], strict=False)]
    assert len(recent) >= 5 and all(50 <= g <= 75 for g in gaps), gaps
    stopped = time.monotonic()
    on(gw, "systemctl stop prometheus.service")
    try:
        # silent for more than the interval and a half: the switch's "late" (its grace here: 30 s)
        wait_until("the heartbeats stop", lambda: time.monotonic() - switch.last() > 90, 60 + 90 + 30,
                   lambda: str([round(b - stopped, 1) for b in switch.beats if b > stopped - 120]))  # fmt: skip
        last_after = round(switch.last() - stopped, 1)
        assert last_after <= 60 + 5, last_after  # the Watchdog's last send, valid for 60 s
        assert ("GpufleetWatchdog", GATEWAY) not in firing(fleet)  # resolved in Alertmanager: nothing to send
    finally:
        on(gw, "systemctl start prometheus.service")
    started = time.monotonic()
    wait_until("the heartbeat again", lambda: switch.last() > started, 60)
    measured = {"last_heartbeat_after_stop_s": last_after, "silence_seen_after_stop_s": round(started - stopped, 1),
                "heartbeat_again_after_start_s": round(switch.last() - started, 1),
                "heartbeat_gaps_s": gaps}  # fmt: skip
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "monitoring-heartbeat.json").write_text(json.dumps(measured, indent=1))
    print("heartbeat:", json.dumps(measured))
