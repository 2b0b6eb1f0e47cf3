"""The rollout's quality gate on the canary (docs/quality-gate.md), on ONE lab: 2 server hosts + 1 gateway running the
Shepherd Model Gateway, the simulated engine on the servers (its oracle answers the evaluation set; lab equipment).

In order, on the same lab (one bring-up):
1. a rollout with rollout_quality_gate_enabled and no baseline for the canary's GPU class, model and lane is refused
   before any change, naming the host, the key, the file and how to write it; nothing restarted, no lock left;
2. -e rollout_quality_gate_write_baseline=true scores both servers as they run and writes the baseline (score 1.0);
   nothing restarts;
3. a rollout of a flag change whose canary carries a planted kernel perturbation (SGLANG_SIM_FAULT=kernel-
   perturbation=0.01: every logit 1% off; every answer still right, which neither the smoke check nor the answers
   see) stops after the canary: the sequential test passes, the logprob comparison with the baseline fails, and the
   refusal says so with the divergence and its bound; the canary serves the old release again (the unit as before
   the run, a new start, back in the router), the second host is untouched; the rollout report and
   reports/<fleet>/quality/<canary>.json say so;
4. the same flag change without the fault (a second run of the gate on the trusted version) passes the gate (every
   test passed, no regression, the logprobs within the bound) and reaches both hosts.
"""

from __future__ import annotations

import json
import sys

import fleet_lab
import pytest
import yaml
from conftest import ROOT
from fleet_lab import healthy_urls, seen, unit_state, unit_text
from lab_host import on

sys.path.insert(0, str(ROOT / "tests/support"))

NAME = "t-quality"
WORK, SERVERS, CANARY, SECOND, GATEWAY, BASELINES, EXTRA_ENV = fleet_lab.canary_lab(NAME)
EVAL_SET = json.loads((ROOT / "roles/rollout/files/quality_eval/gpufleet-eval-v2.json").read_text())
CHANGE = {"chunked-prefill-size": 8192}


def common_extra(**more) -> dict:
    return fleet_lab.canary_rollout_extra(WORK, **more)


play = fleet_lab.runner(WORK, EXTRA_ENV)


def gated(**more) -> dict:
    return common_extra(rollout_quality_gate_enabled=True, sglang_server_args_host=CHANGE, **more)


def lock_files(hosts: dict) -> dict:
    return {name: on(h, "ls /var/lib/gpufleet/locks 2>/dev/null || true").split() for name, h in hosts.items()}


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def fleet():
    stale = [*BASELINES.glob("*.json")]
    yield from fleet_lab.fleet_up(NAME, WORK, play, common_extra(sglang_server_serial=2), 2, 1, stale=stale)


def test_a_gated_rollout_without_a_baseline_is_refused_before_any_change(fleet):
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    proc = play("playbooks/rollout.yml", extra=gated())
    out = seen(proc)
    assert proc.returncode != 0
    refused = f"ROLLOUT REFUSED before any change: quality gate (rollout_quality_gate_enabled): {CANARY} (GPU class '"
    assert refused in out, proc.stdout[-3000:]
    assert f"model 'glm-5', lane 'lab-sim'): no quality baseline at {BASELINES}/" in out
    assert (
        f"ansible-playbook playbooks/rollout.yml -l {CANARY} -e rollout_quality_gate_write_baseline=true "
        f"(into rollout_quality_gate_baseline_dir={BASELINES})" in out
    )
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before
    assert all(not files for files in lock_files(fleet).values())


def test_a_baseline_run_scores_the_servers_as_they_run_and_restarts_nothing(fleet):
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    proc = play("playbooks/rollout.yml", extra=common_extra(rollout_quality_gate_write_baseline=True))
    assert proc.returncode == 0, proc.stdout[-3000:]
    (baseline_file,) = BASELINES.glob("*.json")
    assert baseline_file.name.endswith("--glm-5--lab-sim.json")
    baseline = json.loads(baseline_file.read_text())
    assert baseline["schema"] == "gpufleet.quality_baseline/v1"
    assert (baseline["model"], baseline["lane"], baseline["host"]) == ("glm-5", "lab-sim", CANARY)
    assert baseline["score"] == 1.0 and baseline["total"] == len(EVAL_SET["items"])
    assert baseline["hosts"] == {CANARY: 1.0, SECOND: 1.0}
    written = f"QUALITY BASELINE written (nothing restarted): {baseline_file}: score 1.000 (400/400) from {CANARY}"
    assert written in seen(proc)
    for h in SERVERS:
        assert json.loads((WORK / f"reports/quality/{h}.json").read_text())["baseline_run"] is True
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before
    assert "ROLLOUT" not in proc.stdout  # no batch, no rollout report: the run ended after the baselines


def test_a_kernel_perturbation_on_the_canary_fails_the_logprob_comparison_and_rolls_it_back(fleet):
    gw = fleet[GATEWAY]
    env = yaml.safe_load((ROOT / "inventory/lab/group_vars/gpufleet_lab/sglang_server.yml").read_text())
    fault_env = {**env["sglang_server_environment"], "SGLANG_SIM_FAULT": "kernel-perturbation=0.01"}
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    canary_unit = unit_text(fleet[CANARY])
    with fleet_lab.host_environment(WORK, CANARY, fault_env):
        proc = play("playbooks/rollout.yml", extra=gated())
    out = seen(proc)
    assert proc.returncode != 0
    assert f"ROLLOUT STOPPED at batch 1: {CANARY} failed" in out, proc.stdout[-4000:]
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "stopped" and report["stopped_at_batch"] == 1
    assert report["hosts"] == {CANARY: "quality_rolled_back", SECOND: "untouched"}
    verdict = report["quality_gate"][CANARY]
    assert verdict["ok"] is False and verdict["rolled_back"] is True
    assert verdict["seed"] == f"{report['run_id']}-{CANARY}"  # the draw can be repeated
    # every answer right: the sequential test passed; the log-probabilities are what moved
    assert verdict["score"] == 1.0 and verdict["failed_group"] is None and verdict["worst"] == []
    assert verdict["decision"]["all"]["verdict"] == "pass"
    logprob = verdict["logprob"]
    assert logprob["ok"] is False and logprob["divergence"] > logprob["max_divergence"] == 0.02
    message = report["messages"][CANARY]
    assert message.startswith(f"QUALITY GATE REFUSED {CANARY} (")
    assert " items: 0 regressions in items the baseline answered right (by group: arithmetic 0/" in message
    assert (
        f"logprobs against the baseline: divergence {logprob['divergence']} over {logprob['compared']} token "
        f"log-probabilities of 8 prompts (at most 0.02): FAILED (the engine computes differently from its baseline)"
        in message
    )
    assert "==> ROLLED BACK to release " in message and flat(message) in out
    # The canary serves the old release again: the unit it had before the run (no fault, no new flag), started anew
    # (the gate's rollback), proven, and back in the router; the second host was never touched.
    assert unit_text(fleet[CANARY]) == canary_unit
    assert "SGLANG_SIM_FAULT" not in canary_unit and "--chunked-prefill-size" not in canary_unit
    assert unit_state(fleet[CANARY])["start"] != before[CANARY]["start"]
    assert unit_state(fleet[SECOND]) == before[SECOND]
    assert healthy_urls(gw["address"]) == sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
    assert report["router"] == {"in": sorted(SERVERS), "out": {}}
    saved = json.loads((WORK / "reports/quality" / f"{CANARY}.json").read_text())
    assert saved["ok"] is False and saved["rolled_back"] is True and saved["logprob"] == logprob
    deploy = json.loads((WORK / "reports/deploy" / f"{CANARY}.json").read_text())
    assert deploy["result"] == "rolled_back" and deploy["rollback"]["performed"] is True
    assert all(not files for files in lock_files(fleet).values())


def test_the_same_change_without_the_fault_passes_the_gate_and_reaches_every_host(fleet):
    proc = play("playbooks/rollout.yml", extra=gated())
    out = seen(proc)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"QUALITY GATE PASSED {CANARY}: passed the sequential test after " in out
    assert " items: 0 regressions in items the baseline answered right (by group: arithmetic 0/" in out
    assert " token log-probabilities of 8 prompts (at most 0.02): passed" in out
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert report["result"] == "ok" and report["hosts"] == {CANARY: "updated", SECOND: "updated"}
    assert report["quality_gate"][CANARY]["ok"] is True and report["quality_gate"][CANARY]["score"] == 1.0
    assert report["quality_gate"][CANARY]["logprob"]["divergence"] < 0.02
    assert list(report["quality_gate"]) == [CANARY]  # the canary batch only
    for h in SERVERS:
        assert "--chunked-prefill-size 8192" in unit_text(fleet[h])
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
