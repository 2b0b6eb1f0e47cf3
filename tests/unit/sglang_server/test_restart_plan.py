"""sglang_restart_plan: hosts without restart never wait in line; a multi-node server restarts whole in one batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "filter"))

from sglang_restart_plan import RestartPlanError, sglang_restart_plan  # noqa: E402


def host(name, restart, nodes=None):
    return {"name": name, "restart": restart, "nodes": nodes or [name]}


def test_only_restarting_hosts_are_planned_one_at_a_time():
    plan = sglang_restart_plan([host("a", False), host("b", True), host("c", False), host("d", True)], 1)
    assert plan["order"] == ["b", "d"]
    assert plan["batches"] == [1, 1]


def test_multinode_server_is_one_batch_even_with_serial_one():
    mn = ["m1", "m0"]  # node order, not play order
    hosts = [host("a", True), host("m0", True, mn), host("m1", True, mn), host("b", True)]
    plan = sglang_restart_plan(hosts, 1)
    assert plan["order"] == ["a", "m1", "m0", "b"]
    assert plan["batches"] == [1, 2, 1]
    assert sglang_restart_plan(hosts, 3)["batches"] == [3, 1]
    assert sglang_restart_plan(hosts, "50%")["batches"] == [1, 2, 1]


def test_nothing_to_restart_is_an_empty_plan():
    assert sglang_restart_plan([host("a", False)], 1) == {"order": [], "batches": [], "units": []}


def test_refuses_half_a_multinode_server_and_bad_serial():
    with pytest.raises(RestartPlanError, match="m1 would not restart"):
        sglang_restart_plan([host("m0", True, ["m0", "m1"]), host("m1", False, ["m0", "m1"])], 1)
    with pytest.raises(RestartPlanError, match="sglang_server_serial"):
        sglang_restart_plan([host("a", True)], 0)
