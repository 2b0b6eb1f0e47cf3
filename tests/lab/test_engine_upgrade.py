"""An engine upgrade is a rollout (docs/engine-lanes.md), on ONE lab: 2 server hosts (the RTX PRO 6000 x8 capture,
driver 570.172.08) + 1 gateway running the Shepherd Model Gateway, the simulated engine on the servers emulating the
sglang of their lane (lab-sim: 0.5.9, CUDA 12.8; lab-sim-cu130: 0.5.23, CUDA 13.0; lab equipment), the lab's CUDA
mirror and test hub serving the full pipeline's CUDA toolkit and model.

In order, on the same lab (one bring-up):
(a) playbooks/upgrade_plan.yml -e upgrade_plan_to=lab-sim-cu130 shows the seed GLM-5 flags' diff (nsa -> dsa) and
    changes nothing;
(d) bad input is refused before any change, naming the variable: an unknown lane (ml_env_lock: nope), a driver below
    the lane's floor (570 for CUDA 13.0, which needs 580.65.06); then the hosts get a 580 driver (their gpusim
    profile: what a fleet does before it moves to CUDA 13) and a gated upgrade without a baseline for the canary's
    class is refused naming the lane it runs now (lab-sim: the new lane has no baseline yet);
(c) the upgrade (rollout_pipeline=full, ml_env_lock=lab-sim-cu130, the migrated flags) under client load through
    the router, with a canary that corrupts only non-English answers and tool-call JSON (the simulator's
    non-english-corruption: what FP4 kernels on sm_120 are reported to do) and the gate on, halts after the canary:
    the refusal names the item group whose test failed and its numbers, the canary serves the old lane again (its
    old release, engine 0.5.9-sim) and is back in the router, the second host is untouched, no client request
    failed;
(b) the same upgrade without the fault, under client load through the router: both servers upgraded (deploy reports:
    engine 0.5.23-sim, the new ml-env release, lane lab-sim-cu130), zero failed client requests.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time

import fleet_lab
import pytest
import yaml
from conftest import ROOT, ClientThreads
from fleet_lab import ROUTER_PORT, healthy_urls, seen, unit_state, unit_text
from lab_host import on

sys.path.insert(0, str(ROOT / "tests/support"))
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_flag_migration import (  # noqa: E402
    migrate_flags,
)

NAME = "t-upgrade"
WORK, SERVERS, CANARY, SECOND, GATEWAY, BASELINES, EXTRA_ENV = fleet_lab.canary_lab(NAME)
GROUP_VARS = ROOT / "inventory/lab/group_vars/gpufleet_lab"
SEED_GPU_CLASS = yaml.safe_load((GROUP_VARS / "sglang_server.yml").read_text())["sglang_server_args_gpu_class"]
MIGRATED = migrate_flags(SEED_GPU_CLASS, "0.5.9", "0.5.23")
NEW_DRIVER = "580.95.05"


def common_extra(**more) -> dict:
    return fleet_lab.canary_rollout_extra(WORK, **more)


play = fleet_lab.runner(WORK, EXTRA_ENV, timeout=900)


def upgrade(**more) -> dict:
    """The move to the CUDA 13 lane as the plan says: the lock and the migrated flags (the CUDA toolkit follows the
    lane in the lab inventory), through the full pipeline (a lock change is a new ml-env release)."""
    return common_extra(
        rollout_pipeline="full", ml_env_lock="lab-sim-cu130", sglang_server_args_gpu_class=MIGRATED["flags"], **more
    )


def server_info(host: dict) -> dict:
    return json.loads(on(host, "curl -s http://127.0.0.1:8000/get_server_info"))


def report(host: str) -> dict:
    return json.loads((WORK / "reports/deploy" / f"{host}.json").read_text())


class Load(ClientThreads):
    """Continuous chat completions through the router (streaming long ones and short plain ones)."""

    def __init__(self, address: str, workers: int = 6):
        self.address = address
        self.ok = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        super().__init__(workers)

    def _one(self, index: int, n: int) -> None:
        stream = index % 2 == 0
        body = fleet_lab.load_request(index, n, "engine upgrades", stream, 300 if stream else 16)
        conn = http.client.HTTPConnection(self.address, ROUTER_PORT, timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode(errors="replace")
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:200]}")
        if stream and not data.rstrip().endswith("data: [DONE]"):
            raise RuntimeError(f"stream cut: {data[-200:]}")

    def _run(self, index: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self._one(index, n)
                with self.lock:
                    self.ok += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with self.lock:
                    self.failures.append(f"{type(e).__name__}: {e}")


@pytest.fixture(scope="module")
def fleet():
    # a former lab of this name left its hosts' facts in the controller's fact cache (ansible.cfg): model_weights_path
    # from a full-pipeline run would point the fresh hosts' server at a model they do not have
    facts = [*(ROOT / ".cache/facts").glob(f"*{NAME}-*")]
    stale = [*BASELINES.glob("*.json"), *WORK.glob("reports/*/*.json"), *facts]
    extra = common_extra(sglang_server_serial=2)
    yield from fleet_lab.fleet_up(NAME, WORK, play, extra, 2, 1, stale=stale, equipment=True)


def test_a_the_plan_shows_the_seed_flags_on_the_cuda_13_lane_and_changes_nothing(fleet):
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    proc = play("playbooks/upgrade_plan.yml", extra={"upgrade_plan_to": "lab-sim-cu130"})
    out = seen(proc)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "lane lab-sim (sglang 0.5.9, CUDA 12.8) -> lab-sim-cu130 (sglang 0.5.23, CUDA 13.0)" in out
    assert "- --nsa-decode-backend trtllm" in out and "+ --dsa-decode-backend trtllm # NSA is called DSA" in out
    assert "changed=0" in out and "changed=1" not in out
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before
    for h in SERVERS:
        assert server_info(fleet[h])["version"] == "0.5.9-sim"


@pytest.mark.parametrize(
    ("extra", "words"),
    [({"ml_env_lock": "nope"},
      ["ROLLOUT REFUSED before any change: ", "ml_env_lock 'nope' names no lock folder under ",
       "set ml_env_lock to one of ", "lab-sim-cu130"]),
     ({},
      ["ROLLOUT REFUSED before any change: ", "cuda_toolkit_version 13.0 (lane lab-sim-cu130): NVIDIA driver "
       "570.172.08 is older than 580.65.06, the minimum for CUDA 13.0: upgrade the driver first"])],
    ids=["unknown-lane", "driver-below-the-lanes-floor"],
)  # fmt: skip
def test_d_bad_input_is_refused_before_any_change_naming_the_variable(fleet, extra, words):
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    proc = play("playbooks/rollout.yml", extra={**upgrade(), **extra})
    out = seen(proc)
    assert proc.returncode != 0
    for word in words:
        assert word in out, proc.stdout[-3000:]
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)


def test_d_the_hosts_get_a_580_driver_then_a_gate_without_baseline_names_the_lane_they_run(fleet):
    for h in SERVERS:  # the driver upgrade a fleet does before CUDA 13 (the simulated driver: the gpusim profile)
        on(fleet[h], f"sed -i 's/\"driver_version\": \"570.172.08\"/\"driver_version\": \"{NEW_DRIVER}\"/' "
                     "/etc/gpusim/profile/profile.json")  # fmt: skip
        assert f"Driver Version: {NEW_DRIVER}" in on(fleet[h], "nvidia-smi")
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    proc = play("playbooks/rollout.yml", extra=upgrade(rollout_quality_gate_enabled=True))
    out = seen(proc)
    assert proc.returncode != 0
    assert f"ROLLOUT REFUSED before any change: quality gate (rollout_quality_gate_enabled): {CANARY}" in out
    # the canary runs lane lab-sim now: that lane's baseline judges the upgrade (lab-sim-cu130 has none yet)
    assert "model 'glm-5', lane 'lab-sim'): no quality baseline at " in out, proc.stdout[-3000:]
    assert {h: unit_state(fleet[h]) for h in SERVERS} == before


def test_c_a_canary_that_corrupts_non_english_answers_is_rolled_back_to_the_old_lane_under_load(fleet):
    proc = play("playbooks/rollout.yml", extra=common_extra(rollout_quality_gate_write_baseline=True))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [p.name for p in BASELINES.glob("*.json")] == [next(BASELINES.glob("*--glm-5--lab-sim.json")).name]
    env = yaml.safe_load((GROUP_VARS / "sglang_server.yml").read_text())["sglang_server_environment"]
    fault_env = {**env, "SGLANG_SIM_FAULT": "non-english-corruption"}
    before = {h: unit_state(fleet[h]) for h in SERVERS}
    canary_unit = unit_text(fleet[CANARY])
    old_release = report(CANARY)["versions"]["ml_env_release_id"]
    with fleet_lab.host_environment(WORK, CANARY, fault_env), Load(fleet[GATEWAY]["address"]) as load:
        proc = play("playbooks/rollout.yml", extra=upgrade(rollout_quality_gate_enabled=True), timeout=1200)
    out = seen(proc)
    assert proc.returncode != 0
    assert f"ROLLOUT STOPPED at batch 1: {CANARY} failed" in out, proc.stdout[-4000:]
    rollout = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert rollout["hosts"] == {CANARY: "quality_rolled_back", SECOND: "untouched"}
    verdict = rollout["quality_gate"][CANARY]
    assert verdict["ok"] is False and verdict["rolled_back"] is True and verdict["baseline_score"] == 1.0
    # the English prose and the numbers were fine: the test of the group that broke says so, with its numbers
    group = verdict["failed_group"]
    assert group in ("multilingual", "tool_json"), verdict["reason"]
    decided = verdict["decision"][group]
    message = rollout["messages"][CANARY]
    assert message.startswith(f"QUALITY GATE REFUSED {CANARY} (")
    assert (
        f"the sequential test for a 25-point drop in group {group} failed it: {decided['regressions_then']} "
        f"regressions in {decided['decided_after']} items the baseline answered right" in message
    )
    assert verdict["decision"]["arithmetic"]["regressions"] == 0 and verdict["decision"]["facts"]["regressions"] == 0
    assert "a replacement character" in message or "a script mix-up" in message or "not a JSON object" in message
    assert load.failures == [], load.failures[:5]
    assert load.ok > 10
    # the canary serves the old lane again: its unit as before the run, its old release, engine 0.5.9-sim
    assert unit_text(fleet[CANARY]) == canary_unit and "SGLANG_SIM_ENGINE_VERSION=0.5.9" in canary_unit
    assert unit_state(fleet[CANARY])["start"] != before[CANARY]["start"]
    assert server_info(fleet[CANARY])["version"] == "0.5.9-sim"
    deploy = report(CANARY)
    assert deploy["result"] == "rolled_back"
    assert (deploy["versions"]["engine"], deploy["versions"]["ml_env_release_id"], deploy["versions"]["lane"]) == (
        "0.5.9-sim",
        old_release,
        "lab-sim",
    )
    assert unit_state(fleet[SECOND]) == before[SECOND]
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)


def test_b_the_upgrade_under_load_reaches_both_servers_without_a_failed_request(fleet):
    old = {h: report(h)["versions"]["ml_env_release_id"] for h in SERVERS}
    with Load(fleet[GATEWAY]["address"]) as load:
        time.sleep(2)
        proc = play("playbooks/rollout.yml", extra=upgrade(rollout_quality_gate_enabled=True), timeout=1200)
        time.sleep(2)
    out = seen(proc)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"QUALITY GATE PASSED {CANARY}: passed the sequential test after " in out
    rollout = json.loads((WORK / "reports/rollout/last.json").read_text())
    assert rollout["result"] == "ok" and rollout["hosts"] == {CANARY: "updated", SECOND: "updated"}
    for h in SERVERS:
        versions = report(h)["versions"]
        assert versions["engine"] == "0.5.23-sim" and versions["lane"] == "lab-sim-cu130"
        assert versions["ml_env_release_id"] != old[h] and versions["ml_env_release"].startswith("/opt/ml-env/")
        assert server_info(fleet[h])["version"] == "0.5.23-sim"
        unit = unit_text(fleet[h])
        assert "--dsa-decode-backend trtllm" in unit and "--nsa-decode-backend" not in unit
        # the lane's CUDA, installed by the full pipeline (the lab mirror's 13.0 wheels), and the emulated engine
        assert "CUDA_HOME=/usr/local/cuda-13.0" in unit and "SGLANG_SIM_ENGINE_VERSION=0.5.23" in unit
        assert "release 13.0" in on(fleet[h], "/usr/local/cuda-13.0/bin/nvcc --version")
    assert load.failures == [], load.failures[:5]
    assert load.ok > 20
    assert healthy_urls(fleet[GATEWAY]["address"]) == sorted(f"http://{fleet[h]['address']}:8000" for h in SERVERS)
