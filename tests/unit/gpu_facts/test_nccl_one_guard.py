"""One guard for the NCCL variables, whichever variable they come through.

playbooks/preflight.yml (the first stage of deploy.yml) on the simulated 8x RTX PRO 6000 VM (P2P "NS"):
NCCL_SHM_DISABLE=1 would leave NCCL only sockets. Through gpu_facts_nccl_env_overrides, the documented
path, the derivation's guard refuses it; through sglang_server_environment it was accepted silently (the
unit got it, the report did not show it): now it is refused before anything, naming the variable and the
one path. The derived route keeps SHM (never NCCL_SHM_DISABLE).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_nnodes_one_source import failures, last_msg, run_readers  # noqa: E402

ONE_NODE = {"tp-size": 8}


def test_derived_route_keeps_shm(tmp_path):
    rc, doc = run_readers(tmp_path, host_flags=ONE_NODE)
    assert rc == 0, failures(doc)
    env = last_msg(doc)["nccl_env"]
    assert "NCCL_SHM_DISABLE" not in env and env["NCCL_IB_DISABLE"] == "1"


def test_override_route_is_refused_by_the_guard(tmp_path):
    rc, doc = run_readers(tmp_path, {"gpu_facts_nccl_env_overrides": {"NCCL_SHM_DISABLE": "1"}}, ONE_NODE)
    assert rc != 0
    (msg,) = [m for m in failures(doc) if "NCCL_SHM_DISABLE" in m]
    assert "gpu_facts_nccl_env_overrides.NCCL_SHM_DISABLE=1 on a host without P2P" in msg


def test_server_environment_route_is_refused_naming_the_variable_and_the_one_path(tmp_path):
    rc, doc = run_readers(tmp_path, {"sglang_server_environment": {"NCCL_SHM_DISABLE": "1"}}, ONE_NODE)
    assert rc != 0
    (msg,) = [m for m in failures(doc) if "NCCL_SHM_DISABLE" in m]
    assert "sglang_server_environment sets NCCL_SHM_DISABLE" in msg
    assert "move NCCL_SHM_DISABLE from sglang_server_environment to gpu_facts_nccl_env_overrides" in msg
    # refused in the preflight play (reads only: the GPU facts come first, gpu_facts needs no flag), by the first task
    # of the flags entry point: the layers are never merged, no later play runs
    names = [t["task"]["name"].split(" : ")[-1] for t in doc["plays"][0]["tasks"]]
    assert "Refuse NCCL variables outside the one NCCL path (gpu_facts_nccl_env_overrides)" in names
    assert "Merge the flag layers" not in names and len(doc["plays"]) == 1
