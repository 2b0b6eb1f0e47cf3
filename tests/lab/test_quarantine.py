"""Quarantine of a server host for a GPU fault (docs/runbook.md, "Quarantine"), on ONE lab: 3 server hosts + 1 gateway
running the Shepherd Model Gateway, the simulated engine on the servers, a load client through the gateway while the
host is quarantined and while it is released.

The playbook runs are the ones the collection's rulebook runs (extensions/eda/rulebooks/remediation.yml: the alert's
name and summary as fleet_remediation_alert and fleet_remediation_reason, limited to the alert's host) and the ones a
person runs; the rule's mapping of alerts to them is tested under the real ansible-rulebook in tests/unit/eda.

In order:
1. the quarantine turned off (fleet_remediation_quarantine_enabled: false): the run says so, nothing changes;
2. a failed row remapping planted on t-quar-02's GPU 3 (gpusim's profile, what nvidia-smi -q shows): the quarantine
   takes the host out of the gateway (and its record), drained, under the fleet and host locks, which it gives back;
   the record and the metric on the host say why and the remedy; no request fails;
3. router.yml (deploy.yml's router stage) does not register the quarantined server and says so;
4. a rollout of a flag change skips it and says so (ROLLOUT SKIPS, the report's `quarantined`), changes the others;
   a benchmark of it (bench.yml, which takes a server out and puts it back) is refused, naming the release;
5. the fault cleared, one command (remediate.yml -e fleet_remediation_action=release) restarts the server and puts it
   back into the gateway, the record and metric gone; no request fails; a second release changes nothing;
6. the restart action (GpufleetLivenessGaveUp's) on another host under load: out, restarted, back, no failed request;
   while a rollout holds the fleet lock the same action is refused and says so, puts nothing back, and the rollout
   ends OK with every server in the gateway;
7. ``kill -STOP`` of a third host's engine under load: liveness restarts it and it is back in the gateway with no
   person; only the requests it held fail;
8. a crash loop (every start fails for want of GPU memory, another user's program holding it): the unit stops at its
   start limit, out of routing, liveness leaves it alone, its last-known-good kept; the holder gone, the restart
   action brings it back.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import fleet_lab
import pytest
from conftest import ROOT
from fleet_lab import healthy_urls, seen, unit_state, unit_text
from gpufleet_testinfra import playbook_env
from lab_host import gpusim_profile, on
from test_rollout import Load
from waiting import wait_until

NAME = "t-quar"
WORK = ROOT / "tmp" / NAME
SERVERS = [f"{NAME}-0{i}" for i in (1, 2, 3)]
SICK = SERVERS[1]
GATEWAY = f"{NAME}-router-01"
EXTRA_ENV = {"MOLECULE_EPHEMERAL_DIRECTORY": str(WORK / "eph"), "GPUFLEET_ROOT": str(ROOT)}
ALERT = "GpufleetGpuRowRemapFailed"
REASON = f"Row remapping failed on GPU 3 of {SICK}:9100"  # the alert's summary, as the rulebook passes it
RECORD = "/var/lib/gpufleet/quarantine.json"  # fleet_remediation_quarantine_file's default
METRICS = "/var/lib/prometheus/node-exporter/gpufleet_quarantine.prom"
ROUTER_RECORD = "/var/lib/smg-router/workers.json"  # fleet_router_workers_file's default
LIVENESS_STATE = "/var/lib/gpufleet/sglang-server/liveness-state.json"  # roles/sglang_server's liveness
CHANGE = {"chunked-prefill-size": 8192}
# GPU 3's row remapper says a remapping failed (gpusim's nvidia-smi -q keys, lab/gpusim/README.md)
REMAP_FAILED = "p['gpus'][3]['q'] = {'Remapped Rows / Remapping Failure Occurred': 'Yes'}"

play = fleet_lab.runner(WORK, EXTRA_ENV)


def extra(**more) -> dict:
    """The reports of the lab's runs in its work folder (fleet_lab.report_dirs: a user's land in reports/<fleet>/)."""
    return {**fleet_lab.report_dirs(WORK), "fleet_remediation_report_dir": str(WORK / "reports/remediation"), **more}


def remediate(action: str, host: str = SICK, **more):
    """playbooks/remediate.yml as the rulebook runs it for the alert on ``host`` (or a person, for release)."""
    alert = {"fleet_remediation_alert": ALERT, "fleet_remediation_reason": REASON} if action == "quarantine" else {}
    return play("playbooks/remediate.yml", "-l", host, extra=extra(fleet_remediation_action=action, **alert, **more))


def url(fleet: dict, host: str) -> str:
    return f"http://{fleet[host]['address']}:8000"


def lock_files(fleet: dict) -> dict:
    return {h: on(fleet[h], "ls /var/lib/gpufleet/locks 2>/dev/null || true").split() for h in [*SERVERS, GATEWAY]}


def liveness(host: dict) -> dict:
    """The liveness service's state on the host (phase, last decision)."""
    return json.loads(on(host, f"cat {LIVENESS_STATE} 2>/dev/null || echo {{}}"))


@pytest.fixture(scope="module")
def fleet():
    stale = [*(WORK / "reports/remediation").glob("*.json")]  # an earlier run's reports
    yield from fleet_lab.fleet_up(NAME, WORK, play, extra(sglang_server_serial=3), servers=3, routers=1, stale=stale)


def test_the_quarantine_turned_off_changes_nothing(fleet):
    proc = remediate("quarantine", fleet_remediation_quarantine_enabled=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"REMEDIATION TURNED OFF on {SICK} ({ALERT}): fleet_remediation_quarantine_enabled is false" in seen(proc)
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(url(fleet, h) for h in SERVERS)
    assert on(fleet[SICK], f"ls {RECORD} 2>/dev/null || true") == ""


def test_a_gpu_fault_quarantines_the_host_out_of_the_gateway_with_no_failed_request(fleet):
    gw = fleet[GATEWAY]["address"]
    gpusim_profile(fleet[SICK], REMAP_FAILED)
    assert re.search(r"Remapping Failure Occurred\s*: Yes", on(fleet[SICK], "nvidia-smi -q -i 3"))
    before = unit_state(fleet[SICK])
    with Load(gw, workers=4, limit_s=240) as load:
        proc = remediate("quarantine")
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = seen(proc)
    assert f"QUARANTINED {SICK} ({REASON}): out of every gateway, rollouts skip it, liveness leaves it alone." in out
    assert "Remedy: replace the GPU: its memory has no spare row left." in out
    assert f"ansible-playbook playbooks/remediate.yml -l {SICK} -e fleet_remediation_action=release" in out
    assert load.failures == [] and sum(load.ok.values()) > 0, load.failures[:5]
    # out of the gateway and of its record (a gateway restart does not bring it back); the others serve
    assert healthy_urls(gw) == sorted(url(fleet, h) for h in SERVERS if h != SICK)
    assert url(fleet, SICK) not in json.loads(on(fleet[GATEWAY], f"cat {ROUTER_RECORD}"))["workers"]
    record = json.loads(on(fleet[SICK], f"cat {RECORD}"))
    assert (record["alert"], record["reason"]) == (ALERT, REASON)
    assert record["remedy"] == "replace the GPU: its memory has no spare row left" and record["since"]
    metric = on(fleet[SICK], f"cat {METRICS}")
    assert f'gpufleet_host_quarantined{{alert="{ALERT}",reason="Row remapping failed on GPU 3 of {SICK}:9100"}} 1' in (
        metric
    )
    # the server keeps running for a person to look at; the locks are given back
    assert (
        unit_state(fleet[SICK]) == before and on(fleet[SICK], "systemctl is-active sglang-server").strip() == "active"
    )
    assert all(not files for files in lock_files(fleet).values())
    # liveness leaves the quarantined server alone (its pause paths hold the record)
    wait_until(
        "liveness paused by the quarantine", lambda: liveness(fleet[SICK]).get("last") == f"paused: {RECORD}", 60
    )
    (report,) = [json.loads(p.read_text()) for p in (WORK / "reports/remediation").glob(f"*-{SICK}-quarantine.json")]
    assert report["result"] == "quarantined" and report["quarantine"]["reason"] == REASON
    # quarantining it again changes nothing and says why
    again = remediate("quarantine")
    assert again.returncode == 0 and f"{SICK} is quarantined since {record['since']}" in seen(again)
    assert "changed=0" in again.stdout.split("PLAY RECAP")[-1]


def test_the_router_stage_does_not_register_a_quarantined_server(fleet):
    proc = play("playbooks/router.yml", extra=extra())
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"NOT registered (quarantined: playbooks/remediate.yml -e fleet_remediation_action=release): {SICK}" in (
        seen(proc)
    )
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(url(fleet, h) for h in SERVERS if h != SICK)


def test_a_rollout_skips_the_quarantined_host_and_says_so(fleet):
    sick_unit = unit_text(fleet[SICK])
    proc = play("playbooks/rollout.yml", extra=extra(sglang_server_args_host=CHANGE, rollout_max_unavailable=1))
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = seen(proc)
    assert f"ROLLOUT SKIPS {SICK}: quarantined since " in out and f"({REASON}); it stays out of every gateway." in out
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "ok" and list(report["quarantined"]) == [SICK]
    assert SICK not in report["hosts"] and sorted(report["hosts"]) == [SERVERS[0], SERVERS[2]]
    assert unit_text(fleet[SICK]) == sick_unit
    for h in (SERVERS[0], SERVERS[2]):
        assert "--chunked-prefill-size 8192" in " ".join(unit_text(fleet[h]).split())
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(url(fleet, h) for h in SERVERS if h != SICK)


def test_a_benchmark_of_the_quarantined_host_is_refused_and_leaves_it_out(fleet):
    """bench.yml takes a server out of the gateways and puts it back after: a quarantined one is refused before any
    change, naming the release (before, its benchmark put it back into the gateway with the fault)."""
    sick_unit = unit_text(fleet[SICK])
    proc = play("playbooks/bench.yml", "-l", SICK, extra=extra())
    assert proc.returncode != 0
    out = seen(proc)
    assert f"bench.yml refused before any change on {SICK}: it is quarantined since " in out, proc.stdout[-3000:]
    release = f"ansible-playbook playbooks/remediate.yml -l {SICK} -e fleet_remediation_action=release"
    assert f"release it first: {release}" in out
    assert unit_text(fleet[SICK]) == sick_unit
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(url(fleet, h) for h in SERVERS if h != SICK)
    assert all(not files for files in lock_files(fleet).values())


def test_the_fault_cleared_one_command_releases_the_host(fleet):
    gw = fleet[GATEWAY]["address"]
    gpusim_profile(fleet[SICK], None)
    before = unit_state(fleet[SICK])
    with Load(gw, workers=4, limit_s=300) as load:
        proc = remediate("release")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"RELEASED {SICK}: it serves and is back in every gateway; quarantine lifted." in seen(proc)
    assert load.failures == [] and sum(load.ok.values()) > 0, load.failures[:5]
    assert healthy_urls(gw) == sorted(url(fleet, h) for h in SERVERS)
    assert url(fleet, SICK) in json.loads(on(fleet[GATEWAY], f"cat {ROUTER_RECORD}"))["workers"]
    assert unit_state(fleet[SICK])["start"] != before["start"]  # restarted through the safe restart
    assert on(fleet[SICK], f"ls {RECORD} {METRICS} 2>/dev/null || true") == ""
    wait_until("liveness sees a generation again", lambda: liveness(fleet[SICK]).get("phase") == "ok", 120)
    assert all(not files for files in lock_files(fleet).values())
    again = remediate("release")
    assert again.returncode == 0 and f"{SICK} is not quarantined" in seen(again)
    assert "changed=0" in again.stdout.split("PLAY RECAP")[-1]


def test_the_restart_action_runs_off_the_serving_path_and_is_refused_while_a_rollout_holds_the_lock(fleet):
    gw, host = fleet[GATEWAY]["address"], SERVERS[2]
    gave_up = {"fleet_remediation_alert": "GpufleetLivenessGaveUp"}
    before = unit_state(fleet[host])
    with Load(gw, workers=4, limit_s=300) as load:
        proc = remediate("restart", host, **gave_up)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert load.failures == [] and sum(load.ok.values()) > 0, load.failures[:5]
    assert unit_state(fleet[host])["start"] != before["start"]
    assert healthy_urls(gw) == sorted(url(fleet, h) for h in SERVERS)
    reports = sorted((WORK / "reports/remediation").glob(f"*-{host}-restart.json"))
    assert json.loads(reports[-1].read_text())["result"] == "ok"
    # a rollout of a change in the background: once it holds the fleet lock, the same remediation is refused
    vars_file = WORK / "rollout-during-remediation.json"
    vars_file.write_text(json.dumps(extra(sglang_server_args_host={"chunked-prefill-size": 4096})))
    rollout = subprocess.Popen(
        ["ansible-playbook", "-i", str(WORK / "hosts.yml"), "-e", f"@{vars_file}", "playbooks/rollout.yml"],
        cwd=ROOT, env=playbook_env(EXTRA_ENV), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until("the rollout's fleet lock", lambda: "rollout-fleet.lock" in lock_files(fleet)[GATEWAY], 300)
        refused = remediate("restart", host, **gave_up)
    finally:
        out, _ = rollout.communicate(timeout=900)
    assert refused.returncode != 0
    said = seen(refused)
    assert f"REMEDIATION FAILED on {host} (GpufleetLivenessGaveUp) at " in said
    assert "rollout.yml" in said, said[-2000:]  # the lock's owner: the rollout
    assert rollout.returncode == 0, out[-3000:]
    assert "ROLLOUT OK" in " ".join(out.split()), out[-3000:]
    assert healthy_urls(gw) == sorted(url(fleet, h) for h in SERVERS)
    assert all(not files for files in lock_files(fleet).values())


def test_a_frozen_engine_serves_again_with_no_person_and_only_its_own_requests_fail(fleet):
    """``kill -STOP`` of a server's engine (its main process: HTTP server and tokenizer manager, as in SGLang 0.5.9)
    under load through the gateway. smg's wedge check sends it no new request within seconds (docs/fleet-router.md,
    "A sick worker"); liveness keeps an incident bundle and restarts the unit; the server serves and is in the gateway
    again within the liveness budget with no person. The requests that fail are those the frozen engine held when it
    stopped or took before smg's check: each client thread has at most one in flight, so at most one per thread, and
    none after the restart."""
    gw, host = fleet[GATEWAY]["address"], SERVERS[0]
    before = unit_state(fleet[host])
    bundles = on(fleet[host], "ls /var/lib/gpufleet/incidents 2>/dev/null || true").split()
    # the budget: 3 failed probes (10 s each, 5 s apart), the bundle (its commands' limits: 20 s for each py-spy dump,
    # 30 s for the journal), the engine's start and the gateway's health checks (every 5 s, 2 successes); generous for
    # a loaded 2-core machine
    budget_s = 3 * 15 + 60 + 60
    with Load(gw, workers=4, limit_s=budget_s + 120) as load:
        wait_until("requests on every server", lambda: sum(load.ok.values()) >= 8, 60)
        frozen = time.monotonic()
        # the engine's main process: the launcher's child (the unit's MainPID is the launcher)
        on(
            fleet[host],
            "kill -STOP $(pgrep -P $(systemctl show -p MainPID --value sglang-server.service) "
            "-f sglang_sim.launch_server)",
        )
        wait_until("liveness restarts the frozen engine", lambda: unit_state(fleet[host])["start"] != before["start"],
                   budget_s, lambda: on(fleet[host], "journalctl -u sglang-server-liveness --no-pager | tail -30; "
                                        "cat /var/lib/gpufleet/sglang-server/liveness-state.json"))  # fmt: skip
        restarted = time.monotonic()
        wait_until("the server serves through the gateway again",
                   lambda: healthy_urls(gw) == sorted(url(fleet, h) for h in SERVERS), budget_s)  # fmt: skip
        back = time.monotonic()
        served = sum(load.ok.values())
        wait_until("requests after its return", lambda: sum(load.ok.values()) >= served + 8, 120)
    assert len(load.failures) <= load.workers, load.failures
    assert all(t <= restarted + 5 for t in load.failed_at), (load.failed_at, restarted, load.failures)
    new = [b for b in on(fleet[host], "ls /var/lib/gpufleet/incidents").split() if b not in bundles]
    assert len(new) == 1 and new[0].endswith("-sglang-server-liveness"), new
    assert "stacks.txt" in on(fleet[host], f"ls /var/lib/gpufleet/incidents/{new[0]}")
    measured = {"restarted_after_s": round(restarted - frozen, 1),
                "serving_in_gateway_after_s": round(back - frozen, 1),
                "failed_requests": len(load.failures), "ok_requests": sum(load.ok.values())}  # fmt: skip
    (WORK / "frozen-engine.json").write_text(json.dumps(measured, indent=1))
    print("frozen engine:", json.dumps(measured))


def test_a_server_whose_every_start_fails_stops_at_its_start_limit_out_of_the_gateway_its_release_kept(fleet):
    """A crash loop: another user's program takes the GPUs' memory (gpusim-hold, lab equipment) right after the engine
    dies (kill -9), so every start fails as SGLang's does without room (torch.OutOfMemoryError). systemd starts it again
    every sglang_server_restart_sec until the unit's start limit (sglang_server_start_limit_burst starts within
    sglang_server_start_limit_interval_s), then the unit stays failed: no flapping. Liveness leaves a unit that is not
    active alone (its restarts do not move). The gateway's health checks take the worker out of routing and the
    clients' requests go to the others: only those in flight at the kill may fail. The last-known-good release stays
    on the host. GpufleetEngineDown fires and stays firing meanwhile (tests/lab/test_monitoring.py fires it for the same
    fault). The holder gone, one command (the restart action) brings the server back into the gateway."""
    gw, host = fleet[GATEWAY]["address"], SERVERS[2]
    lkg = "/var/lib/gpufleet/sglang-server/last-good/manifest.json"  # sglang_server_state_dir's default
    manifest = json.loads(on(fleet[host], f"cat {lkg}"))
    restarts_before = liveness(fleet[host]).get("restarts_total", 0)
    # the unit's state and systemd's restart count (one property per call: systemctl show prints several in its own
    # order), and its journal
    result = ("echo $(systemctl show -p ActiveState --value sglang-server)"
              " $(systemctl show -p NRestarts --value sglang-server)")  # fmt: skip
    journal = "journalctl -u sglang-server --no-pager -n 400 -o cat"
    with Load(gw, workers=4, limit_s=600) as load:
        wait_until("requests on every server", lambda: sum(load.ok.values()) >= 8, 60)
        killed = time.monotonic()
        # the holder starts once the dead engine's memory is free (its processes die with it), within systemd's
        # restart delay (sglang_server_restart_sec: 5 s on the lab)
        on(fleet[host], "kill -9 $(systemctl show -p MainPID --value sglang-server.service); "
                        "for i in $(seq 40); do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits "
                        "| awk '$1 > 1000 {busy = 1} END {exit busy}' && break; sleep 0.1; done; "
                        "systemd-run --quiet --unit gpu-intruder --uid nobody "
                        "/usr/local/bin/gpusim-hold --gpus 0,1,2,3,4,5,6,7 --mib 90000")  # fmt: skip
        try:
            # the start limit, within burst x (restart_sec 5 s + a start to its OOM) on the lab's settings; systemd's
            # words when it stops the restarts (the unit keeps its last failure's result, here 'signal')
            limit = "Start request repeated too quickly."
            wait_until("the unit failed at its start limit",
                       lambda: on(fleet[host], result).split()[0] == "failed" and limit in on(fleet[host], journal),
                       180, lambda: on(fleet[host], f"{result}; {journal} | tail -20"))  # fmt: skip
            stopped_at = time.monotonic()
            first = on(fleet[host], result).split()
            assert "torch.OutOfMemoryError: CUDA out of memory" in on(fleet[host], journal)
            # out of routing, the others serve; it stays failed (no more starts) while liveness does nothing
            wait_until("the gateway routes around it",
                       lambda: healthy_urls(gw) == sorted(url(fleet, h) for h in SERVERS if h != host), 60)  # fmt: skip
            served = sum(load.ok.values())
            wait_until("requests to the others", lambda: sum(load.ok.values()) >= served + 8, 120)
            assert on(fleet[host], result).split() == first  # no start since the limit
            assert liveness(fleet[host]).get("restarts_total", 0) == restarts_before
            assert json.loads(on(fleet[host], f"cat {lkg}")) == manifest  # the last-known-good, untouched
            assert on(fleet[host], f"test -d {manifest['release']} && echo kept").strip() == "kept"
        finally:
            on(fleet[host], "systemctl stop gpu-intruder.service", check=False)
        # the person: the holder gone, one command
        proc = remediate("restart", host, fleet_remediation_alert="GpufleetEngineDown")
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert healthy_urls(gw) == sorted(url(fleet, h) for h in SERVERS)
    assert len(load.failures) <= load.workers and all(t <= killed + 30 for t in load.failed_at), load.failures
    measured = {"start_limit_after_s": round(stopped_at - killed, 1), "failed_requests": len(load.failures),
                "ok_requests": sum(load.ok.values())}  # fmt: skip
    (WORK / "crash-loop.json").write_text(json.dumps(measured, indent=1))
    print("crash loop:", json.dumps(measured))
