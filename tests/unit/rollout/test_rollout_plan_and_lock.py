"""The rollout's batch plan (Ansible's own serial arithmetic), its disruption budget and its run lock module."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from ansible.executor.playbook_executor import PlaybookExecutor
from ansible_collections.gpufleet.fleet.plugins.filter import fleet_router, rollout
from module_runner import run_module  # tests/support


class _Play:
    def __init__(self, serial):
        self.serial, self.hosts, self.order = serial, "all", None


class _Inventory:
    def __init__(self, hosts):
        self.hosts = hosts

    def get_hosts(self, pattern, order=None):
        return list(self.hosts)


@pytest.mark.parametrize(
    ("count", "serial"),
    [
        (4, [1, "25%", "100%"]),
        (8, [1, "25%", "100%"]),
        (2, [1, "25%", "100%"]),
        (4, [2, 1]),
        (5, [1, "50%"]),
        (3, ["100%"]),
        (7, [3]),
        (1, [1, "25%", "100%"]),
    ],  # fmt: skip
)
def test_batches_are_the_ones_ansible_makes(count, serial):
    hosts = [f"h{i}" for i in range(count)]
    executor = PlaybookExecutor.__new__(PlaybookExecutor)
    executor._inventory = _Inventory(hosts)
    assert rollout.rollout_batches(hosts, serial) == executor._get_serialized_batches(_Play(serial))


MODELS = {"a1": "glm", "a2": "glm", "a3": "glm", "a4": "glm", "b1": "qwen"}


def test_a_plan_within_the_budget_passes():
    batches = rollout.rollout_batches(["a1", "a2", "a3", "a4"], [1, "25%", "100%"])
    assert rollout.rollout_capacity_problems(batches, {k: MODELS[k] for k in MODELS if k[0] == "a"},
                                             ["a1", "a2", "a3", "a4"], "50%") == []  # fmt: skip


def test_the_last_healthy_worker_is_never_taken_out():
    problems = rollout.rollout_capacity_problems([["a1", "a2", "a3", "a4", "b1"]], MODELS, list(MODELS), 5)
    assert len(problems) == 2
    assert "last healthy worker of model 'glm'" in problems[0]
    assert "last healthy worker of model 'qwen'" in problems[1]


def test_a_worker_already_out_counts_against_the_budget():
    # a3 is not healthy in the router now: a batch of two more would leave 3 of 4 out (budget 50% = 2).
    problems = rollout.rollout_capacity_problems([["a1"], ["a2", "a4"]], MODELS, ["a1", "a2", "a4", "b1"], "50%")
    assert problems == [
        "batch 2 (a2, a4) would have 3 workers of model 'glm' out of the router (a2, a3, a4), more than "
        "rollout_max_unavailable=50% (2 of 4)"
    ]


def test_worker_urls_leave_out_hosts_that_serve_no_http():
    hostvars = {"s1": {"ansible_host": "10.0.0.1"}, "s2": {"fleet_router_register": False}, "s3": {}}
    assert fleet_router.fleet_worker_urls(["s1", "s2", "s3"], hostvars, 8000) == {
        "s1": "http://10.0.0.1:8000",
        "s3": "http://s3:8000",
    }


def test_worker_urls_leave_out_a_quarantined_host_but_the_monitor_watches_it():
    hostvars = {"s1": {"fleet_remediation_quarantine": {"since": "2026-12-07T09:00:00Z"}}, "s2": {},
                "s3": {"fleet_remediation_quarantine": {}}}  # fmt: skip
    assert fleet_router.fleet_worker_urls(["s1", "s2", "s3"], hostvars, 8000) == {
        "s2": "http://s2:8000",
        "s3": "http://s3:8000",
    }
    assert list(fleet_router.fleet_worker_urls(["s1", "s2", "s3"], hostvars, 8000, registered_only=False)) == [
        "s1",
        "s2",
        "s3",
    ]
    assert fleet_router.fleet_quarantined(["s1", "s2", "s3"], hostvars) == {"s1": {"since": "2026-12-07T09:00:00Z"}}


# The example production fleet's multi-node server: h200-03 (rank 0) and h200-04 (group glm5_h200_tp16).
MN_GROUPS = {"glm5_h200_tp16": ["h200-03", "h200-04"], "h200": ["h200-01", "h200-02", "h200-03", "h200-04"]}
MN_HOSTVARS = {
    "h200-01": {"ansible_host": "10.0.0.21"},
    "h200-02": {"ansible_host": "10.0.0.22"},
    "h200-03": {"ansible_host": "10.0.0.23", "sglang_server_multinode_group": "glm5_h200_tp16"},
    "h200-04": {"ansible_host": "10.0.0.24", "sglang_server_multinode_group": "glm5_h200_tp16"},
}


def test_only_rank_0_of_a_multinode_server_is_a_router_worker():
    urls = fleet_router.fleet_worker_urls(list(MN_HOSTVARS), MN_HOSTVARS, 8000, MN_GROUPS)
    assert urls == {
        "h200-01": "http://10.0.0.21:8000",
        "h200-02": "http://10.0.0.22:8000",
        "h200-03": "http://10.0.0.23:8000",  # rank 0 of the two-node server; h200-04 (rank 1) serves no HTTP
    }
    assert fleet_router.multinode_nodes("h200-04", "glm5_h200_tp16", MN_GROUPS) == ["h200-03", "h200-04"]
    assert fleet_router.multinode_nodes("h200-01", None, MN_GROUPS) == ["h200-01"]


def test_a_rollout_over_a_multinode_server_is_refused_naming_the_way_to_restart_it():
    (problem,) = rollout.rollout_multinode_problems(list(MN_HOSTVARS), MN_HOSTVARS, MN_GROUPS)
    assert problem.startswith(
        "h200-03, h200-04 are one multi-node server (sglang_server_multinode_group=glm5_h200_tp16)"
    )
    assert "playbooks/deploy_server.yml" in problem and "-l '!glm5_h200_tp16'" in problem
    assert rollout.rollout_multinode_problems(["h200-01", "h200-02"], MN_HOSTVARS, MN_GROUPS) == []


def test_only_the_hosts_that_must_restart_take_part_in_the_batches():
    """The decide play ran the server stage with deferred restarts on every host: deferred -> a batch, unchanged ->
    proven in place (never out of the router), a failure there or no result at all -> the rollout is refused."""
    hostvars = {
        "s1": {"sglang_server_result": "deferred"},
        "s2": {"sglang_server_result": "unchanged"},
        "s3": {"sglang_server_result": "deferred"},
        "s4": {"sglang_server_result": "unchanged"},
    }
    decided = rollout.rollout_decisions(["s1", "s2", "s3", "s4"], hostvars, "server", list(hostvars))
    assert decided == {"restart": ["s1", "s3"], "unchanged": ["s2", "s4"], "refused": {}}
    assert rollout.rollout_batches(decided["restart"], [1, "25%", "100%"]) == [["s1"], ["s3"]]
    # a no-op rollout: nothing to restart, no batch at all
    noop = {h: {"sglang_server_result": "unchanged"} for h in hostvars}
    assert rollout.rollout_decisions(list(noop), noop, "server", list(noop))["restart"] == []
    assert rollout.rollout_batches([], [1, "25%", "100%"]) == []


def test_a_host_that_failed_or_gave_no_decision_refuses_the_rollout():
    hostvars = {
        "s1": {"sglang_server_result": "deferred"},
        "s2": {"sglang_server_result": "failed", "rollout_plan_refusal": "SGLANG SERVER DEPLOY FAILED on s2: bad flag"},
        "s3": {},  # unreachable during the decide play: it never got a result
    }
    decided = rollout.rollout_decisions(["s1", "s2", "s3"], hostvars, "server", ["s1", "s2", "s3"])
    assert decided["restart"] == ["s1"]
    assert decided["refused"] == {
        "s2": "SGLANG SERVER DEPLOY FAILED on s2: bad flag",
        "s3": "no decision from the server stage (result none: unreachable?)",
    }


def test_hosts_the_converged_check_proved_in_place_skip_the_server_stage_and_stay_unchanged():
    """The converged check ran on every host; the server stage ran only on the hosts it did not prove (staged). A
    proven host is unchanged without a server-stage result; one the check gave no answer for refuses the rollout."""
    hostvars = {
        "s1": {"sglang_server_converged": {"converged": True}},
        "s2": {"sglang_server_converged": {"converged": False}, "sglang_server_result": "deferred"},
        "s3": {"sglang_server_converged": {"converged": True}},
        "s4": {},  # unreachable during the converged check
    }
    decided = rollout.rollout_decisions(["s1", "s2", "s3", "s4"], hostvars, "server", ["s2"])
    assert decided == {
        "restart": ["s2"],
        "unchanged": ["s1", "s3"],
        "refused": {"s4": "no answer from the converged check (unreachable?)"},
    }
    # every host proven in place: nothing to restart, nothing refused
    proven = {h: {"sglang_server_converged": {"converged": True}} for h in ("s1", "s2")}
    assert rollout.rollout_decisions(["s1", "s2"], proven, "server", []) == {
        "restart": [], "unchanged": ["s1", "s2"], "refused": {},
    }  # fmt: skip


def test_a_full_pipeline_rollout_takes_every_host_through_its_batch():
    """The earlier stages (CUDA toolkit, ml-env, weights) run in the batches and can change what the server runs."""
    hostvars = {"s1": {}, "s2": {"sglang_server_result": "unchanged"}}
    assert rollout.rollout_decisions(["s1", "s2"], hostvars, "full", []) == {
        "restart": ["s1", "s2"], "unchanged": [], "refused": {},
    }  # fmt: skip


def test_a_rollout_setting_set_differently_on_one_host_is_refused_naming_it():
    hostvars = {f"gpu-0{i}": {"rollout_drain_timeout_s": 120, "rollout_serial": [1, "25%"]} for i in range(1, 4)}
    hostvars["gpu-03"]["rollout_drain_timeout_s"] = 600
    names = ["rollout_serial", "rollout_drain_timeout_s"]
    problems = rollout.rollout_setting_differences(list(hostvars), hostvars, names)
    assert problems == [
        "rollout_drain_timeout_s differs between hosts (gpu-01: 120; gpu-03: 600): it is a setting of the whole "
        "rollout; set it once (group_vars of every server, or -e)"
    ]
    hostvars["gpu-03"]["rollout_drain_timeout_s"] = 120
    assert rollout.rollout_setting_differences(list(hostvars), hostvars, ["rollout_drain_timeout_s"]) == []
    del hostvars["gpu-01"]["rollout_serial"]  # not set on the first host: it gets the role's default
    assert rollout.rollout_setting_differences(list(hostvars), hostvars, ["rollout_serial"]) == [
        "rollout_serial differs between hosts (gpu-01: the role default; gpu-02, gpu-03: [1, '25%']): it is a setting "
        "of the whole rollout; set it once (group_vars of every server, or -e)"
    ]


def test_extra_smg_flags():
    argv = fleet_router.smg_extra_argv({"request-timeout-secs": 600, "log-json": True, "x": False, "n": ["a", "b"]})
    assert argv == ["--request-timeout-secs", "600", "--log-json", "--n", "a", "b"]


@pytest.fixture
def lock(capsys):
    return lambda args: run_module("ansible_collections.gpufleet.fleet.plugins.modules.fleet_lock", args, capsys)


def test_a_held_lock_refuses_another_run_with_its_owner_and_age(lock, tmp_path):
    path = str(tmp_path / "locks/rollout-fleet.lock")
    owner = {"user": "alice", "controller": "awx-1"}
    result, failed = lock({"path": path, "state": "acquired", "run_id": "run-1", "owner": owner})
    assert not failed and result["changed"]
    again, failed = lock({"path": path, "state": "acquired", "run_id": "run-1", "owner": owner})
    assert not failed and not again["changed"]  # idempotent for its own run
    other, failed = lock({"path": path, "state": "acquired", "run_id": "run-2", "owner": {"user": "bob"}})
    assert failed
    assert "held by run run-1 (controller=awx-1, user=alice)" in other["msg"]
    assert "Another rollout is running" in other["msg"]
    # Released only by its own run.
    kept, _ = lock({"path": path, "state": "released", "run_id": "run-2"})
    assert not kept["changed"] and Path(path).exists()
    gone, _ = lock({"path": path, "state": "released", "run_id": "run-1"})
    assert gone["changed"] and not Path(path).exists()


def test_a_stale_lock_is_reported_and_broken_only_when_asked(lock, tmp_path):
    path = tmp_path / "rollout-host.lock"
    path.write_text(json.dumps({"run_id": "old", "owner": {"user": "carol"}, "acquired_at": time.time() - 7300}))
    result, failed = lock({"path": str(path), "state": "acquired", "run_id": "new", "stale_after_s": 3600})
    assert failed and "STALE" in result["msg"] and "age 7300 s" in result["msg"]
    assert "rollout_lock_break=true" in result["msg"]
    result, failed = lock({"path": str(path), "state": "acquired", "run_id": "new", "break_lock": True})
    assert not failed and result["broken"]["run_id"] == "old" and result["broken"]["stale"] is True
    assert json.loads(path.read_text())["run_id"] == "new"


def test_free_checks_without_writing(lock, tmp_path):
    path = tmp_path / "rollout-fleet.lock"
    result, failed = lock({"path": str(path), "state": "free", "run_id": "a"})
    assert not failed and not result["changed"] and not path.exists()
    lock({"path": str(path), "state": "acquired", "run_id": "a", "owner": {"user": "alice"}})
    result, failed = lock({"path": str(path), "state": "free", "run_id": "b"})
    assert failed and "held by run a (user=alice)" in result["msg"]
    assert json.loads(path.read_text())["run_id"] == "a"


def test_a_batchs_engine_time_is_its_stop_and_its_start_to_ready():
    """The rollout report splits the engine's own time from the rollout's: SGLang's stop (its drain, looked at every
    5 s by 0.5.9's sigterm_watchdog) and its start to ready. Timings of a lab host's deploy report in a rollout batch
    (2026-12-04, d1b23e9); a host that did not restart has none."""
    timings = {"deploy_down_to_healthy_s": 14.992, "deploy_engine_start_to_ready_s": 6.11,
               "deploy_release_wait_s": 0.228, "deploy_smoke_s": 1.504, "deploy_start_to_ready_s": 6.11,
               "deploy_stop_s": 4.665, "total_s": 21.994, "validate_s": 1.932}  # fmt: skip
    assert rollout.rollout_engine_time(timings) == 10.775
    assert rollout.rollout_engine_time({"validate_s": 1.9, "total_s": 3.0}) == 0
    assert rollout.rollout_engine_time(None) == 0


def test_the_router_account_is_read_from_the_routers_list_not_from_the_plan():
    """Every host of the run is in or out by the router's list at the end; an out host says why by its state, and
    one the run rolled back is in when its /health brought it back."""
    urls = {h: f"http://10.0.0.{i}:8000" for i, h in enumerate(["a", "b", "c", "d"], start=1)}
    # the router's list as rollout_gateway_view reads it: d is draining (listed, not healthy), b not listed
    gateway = {"item": "gw-1", "workers": [
        {"url": "http://10.0.0.1:8000/", "is_healthy": True},
        {"url": "http://10.0.0.3:8000", "is_healthy": True},
        {"url": "http://10.0.0.4:8000", "is_healthy": False, "status": "draining"},
    ]}  # fmt: skip
    states = {"a": "updated", "b": "failed", "c": "rolled_back", "d": "untouched"}
    account = rollout.rollout_router_account(states, urls, rollout.rollout_gateway_view([gateway])["healthy"])
    assert account["in"] == ["a", "c"]
    assert account["out"] == {
        "b": "failed: its restart failed and it was not proven healthy again",
        "d": "untouched: it was out of the router before this run reached it",
    }


def test_several_gateways_are_one_router_for_the_rollout():
    """A fleet_router_workers task looped over the gateways: a worker is in only when every gateway lists it healthy
    (a client may reach any of them), added back only when added back everywhere; the drain comes from the gateway
    that drained; each gateway's InvocationID is kept; a skipped item counts for nothing."""
    results = [
        {"item": "gw-1", "router_invocation": "i1", "in_router_urls": ["http://a:8000", "http://b:8000"],
         "workers": [{"url": "http://a:8000/", "is_healthy": True}, {"url": "http://b:8000", "is_healthy": True}],
         "drain": {}, "left_out": {}},
        {"item": "gw-2", "router_invocation": "i2", "in_router_urls": ["http://a:8000"],
         "workers": [{"url": "http://a:8000", "is_healthy": True}, {"url": "http://b:8000", "is_healthy": False}],
         "drain": {"http://a:8000": {"in_flight_at_removal": 2}}, "left_out": {"http://c:8000": 503},
         "router_unavailable_s": 1.5},
        {"item": "gw-3", "skipped": True},
    ]  # fmt: skip
    view = rollout.rollout_gateway_view(results)
    assert view["healthy"] == ["http://a:8000"] and view["in_router_urls"] == ["http://a:8000"]
    assert view["by_gateway"] == {"gw-1": ["http://a:8000", "http://b:8000"], "gw-2": ["http://a:8000"]}
    assert view["drain"] == {"http://a:8000": {"in_flight_at_removal": 2}}
    assert view["left_out"] == {"http://c:8000": 503}
    assert view["invocations"] == {"gw-1": "i1", "gw-2": "i2"} and view["unavailable_s"] == 1.5
    empty = rollout.rollout_gateway_view([])
    assert empty["healthy"] == [] and empty["by_gateway"] == {} and empty["unavailable_s"] == 0.0


def test_a_gateway_down_or_unreachable_is_named_and_its_workers_count_as_out():
    """What the plan refuses by name and the end of a run reports (router_unread): a gateway whose router does not
    answer (the module failed) or whose host cannot be reached; a worker is in the router only where every gateway
    lists it, so none is while one cannot be read."""
    up = {"item": "gw-1", "workers": [{"url": "http://a:8000", "is_healthy": True}]}
    results = [
        up,
        {"item": "gw-2", "failed": True, "msg": "router API at http://127.0.0.1:30000 not usable: refused"},
        {"item": "gw-3", "unreachable": True, "msg": "Failed to connect to the host via ssh"},
    ]
    view = rollout.rollout_gateway_view(results)
    assert view["failed"] == {
        "gw-2": "router API at http://127.0.0.1:30000 not usable: refused",
        "gw-3": "Failed to connect to the host via ssh",
    }
    assert view["failed_text"] == (
        "gw-2: router API at http://127.0.0.1:30000 not usable: refused; gw-3: Failed to connect to the host via ssh"
    )
    assert view["healthy"] == [] and view["by_gateway"]["gw-1"] == ["http://a:8000"]
    quiet = rollout.rollout_gateway_view([up])
    assert quiet["failed"] == {} and quiet["failed_text"] == ""
