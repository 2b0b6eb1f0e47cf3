"""gpu_preflight_problems: every refusal names host, fact, variable and fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from gpu_facts_helpers import facts_for, gff, only_problem

HOST = "gpu-07"


@pytest.fixture(scope="module")
def old():
    return facts_for("old-driver")


ROOT = Path(__file__).resolve().parents[3]
ROLE_DATA = {
    "cuda_driver_floors": yaml.safe_load((ROOT / "roles/cuda_toolkit/vars/driver_floors.yml").read_text())[
        "cuda_toolkit_driver_floors"
    ],
    "arch_min_cuda": yaml.safe_load((ROOT / "roles/gpu_facts/defaults/main.yml").read_text())[
        "gpu_facts_arch_min_cuda"
    ],
    "arch_max_cuda": yaml.safe_load((ROOT / "roles/gpu_facts/defaults/main.yml").read_text())[
        "gpu_facts_arch_max_cuda"
    ],
}


def settings(**kw):
    base = {
        **ROLE_DATA,
        "host": HOST,
        "cuda_version": "12.8",
        "own_units": ["sglang-server.service"],
        "idle_memory_mib": 512,
        "disk_requirements": [],
        "comm": {},
    }
    base.update(kw)
    return base


def check(facts, **kw):
    """The preflight as playbooks/preflight.yml wires it (the launch spec's checks are sglang_server's:
    tests/unit/sglang_server/test_launch_spec.py)."""
    return gff.gpu_preflight_problems(facts, settings(**kw))


def only(problems, kind="errors"):
    return only_problem(problems, HOST, kind)


def test_old_driver_is_refused_for_cuda_12_8(old):
    problem = only(check(old))
    assert problem["check"] == "driver"
    assert "driver 550.127.05 is too old for CUDA 12.8 (needs >= 570.26)" in problem["message"]
    assert problem["fact"] == "gpu_facts.driver_version=550.127.05"
    assert problem["variable"] == "cuda_toolkit_version=12.8"


def test_driver_570_is_too_old_for_cuda_13(rtx, h200):
    problem = only(check(rtx, cuda_version="13.0"))
    assert "needs >= 580.65.06" in problem["message"]
    assert check(h200, cuda_version="13.0")["errors"] == []


def test_unknown_cuda_version_is_refused(h200):
    problem = only(check(h200, cuda_version="12.7"))
    assert "no known driver floor for CUDA 12.7" in problem["message"]
    assert "roles/cuda_toolkit/vars/driver_floors.yml" in problem["fix"]


def test_sm120_needs_cuda_12_8(rtx):
    problem = only(check(rtx, cuda_version="12.6"))
    assert problem["check"] == "arch" and "sm_120 needs CUDA >= 12.8" in problem["message"]


def test_volta_dropped_by_cuda_13(h200):
    facts = copy.deepcopy(h200)
    facts["archs"] = ["sm_70"]
    problem = only(check(facts, cuda_version="13.0"))
    assert "no longer supports sm_70" in problem["message"]


def leaked(h200):
    """After a leaking version stopped: a scheduler that is gone still holds GPU0, GPU1 holds memory of no process."""
    facts = copy.deepcopy(h200)
    facts["processes"] = [
        {"pid": 3101, "name": "sglang::scheduler_TP0", "used_memory_mib": 88000, "gpu_index": 0, "unit": None,
         "alive": False, "uid": None, "user": None, "cmdline": ""},
    ]  # fmt: skip
    facts["gpus"][0]["memory_used_mib"] = 88000
    facts["gpus"][1]["memory_used_mib"] = 70000
    return facts


def test_leaked_memory_is_refused_without_a_remedy(h200):
    result = check(leaked(h200))
    assert [p["check"] for p in result["errors"]] == ["gpus_busy", "gpus_busy"]
    gone, no_process = result["errors"]
    assert "pid 3101 sglang::scheduler_TP0 on GPU0 using 88000 MiB (process gone" in gone["message"]
    assert "GPU1 has 70000 MiB in use but no compute process is listed" in no_process["message"]
    assert "sglang_server_held_memory_gpu_reset=true" in no_process["fix"]


def test_leaked_memory_is_left_to_an_enabled_remedy_but_a_live_holder_is_not(h200):
    """The documented way out of held memory (enable the remedy, deploy again) must not be refused in preflight:
    the server stage frees it after its stop. A live foreign process is still refused."""
    remedy = "sglang_server_held_memory_gpu_reset=true"
    result = check(leaked(h200), leaked_memory_remedy=remedy)
    assert result["errors"] == []
    assert [p["check"] for p in result["warnings"]] == ["gpus_leaked", "gpus_busy"]
    assert all(f"Left to the server stage's remedy ({remedy})" in p["message"] for p in result["warnings"])
    facts = leaked(h200)
    facts["processes"].append(
        {"pid": 1939, "name": "python3", "used_memory_mib": 1000, "gpu_index": 1, "unit": "session-3.scope",
         "alive": True, "uid": 1001, "user": "intruder", "cmdline": "python3 train.py"}
    )  # fmt: skip
    problem = only(check(facts, leaked_memory_remedy=remedy))
    assert problem["check"] == "gpus_busy" and "pid 1939 python3, user intruder" in problem["message"]


def test_unknown_arch_warns(h200):
    facts = copy.deepcopy(h200)
    facts["archs"] = ["sm_999"]
    assert "not in the support table" in only(check(facts), "warnings")["message"]


def test_foreign_gpu_process_is_refused_and_ours_is_fine(h200):
    facts = copy.deepcopy(h200)
    facts["processes"] = [
        {
            "pid": 1939,
            "name": "python3",
            "used_memory_mib": 41478,
            "gpu_index": 0,
            "unit": "session-3.scope",
            "alive": True,
            "uid": 1001,
            "user": "intruder",
            "cmdline": "python3 train.py --epochs 3",
        },
        {
            "pid": 2001,
            "name": "sglang::scheduler",
            "used_memory_mib": 88000,
            "gpu_index": 1,
            "unit": "sglang-server.service",
        },
    ]
    facts["gpus"][0]["memory_used_mib"] = 41478
    facts["gpus"][1]["memory_used_mib"] = 88000
    result = check(facts)
    problem = only(result)
    assert problem["check"] == "gpus_busy"
    assert (
        "pid 1939 python3, user intruder, command `python3 train.py --epochs 3`, on GPU0 using 41478 MiB "
        "(unit session-3.scope)" in problem["message"]
    )
    assert "pid 1939: ask user intruder to end it or, as root, kill 1939" in problem["fix"]
    assert "2001" not in problem["message"]
    assert result["summary"]["own_processes"] == ["2001 sglang::scheduler (sglang-server.service)"]


def test_memory_in_use_without_a_process_is_refused(h200):
    facts = copy.deepcopy(h200)
    facts["gpus"][1]["memory_used_mib"] = 40000
    problem = only(check(facts))
    assert "GPU1 has 40000 MiB in use but no compute process is listed" in problem["message"]
    facts["gpus"][1]["memory_used_mib"] = 100
    assert check(facts)["errors"] == []


def test_disk_space(h200):
    facts = copy.deepcopy(h200)
    facts["disk"] = [{"path": "/srv/models", "checked_path": "/srv", "free_mib": 100 * 1024, "total_mib": 1}]
    req = [{"path": "/srv/models", "min_free_gib": 450, "purpose": "model weights"}]
    problem = only(check(facts, disk_requirements=req))
    assert "/srv/models (model weights) needs 450 GiB free, /srv has 100.0 GiB" in problem["message"]
    req[0]["min_free_gib"] = 50
    assert check(facts, disk_requirements=req)["errors"] == []
    missing = [{"path": "/opt/ml-env", "min_free_gib": 1}]
    assert "was not measured" in only(check(facts, disk_requirements=missing), "warnings")["message"]


def test_comm_errors_and_warnings_are_carried(rtx):
    comm = gff.gpu_comm_settings(rtx, {"nccl_env": {"NCCL_SHM_DISABLE": "1"}}, 1)
    problem = only(check(rtx, comm=comm))
    assert problem["check"] == "nccl_env" and "NCCL_SHM_DISABLE" in problem["message"]


def test_no_driver_stops_early():
    problem = only(check({"driver_loaded": False, "gpu_count": 0, "error": "rc 9"}))
    assert problem["check"] == "driver" and "rc 9" in problem["message"]
