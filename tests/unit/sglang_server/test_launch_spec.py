"""The launch spec meets the host's GPU facts (sglang_server's filters sglang_comm_flags and sglang_launch_problems,
run by tasks/launch_spec.yml in the role's validation): the communication flags of gpu_facts' profile, tp x pp (x dp)
against the GPUs of a node, backends and quantization against the architecture. The facts are the real ones: the
seed machine's 8x RTX PRO 6000 (sm_120, no P2P) from the lab simulator's profile and the real 2x H200 capture (the
fixtures rtx and h200, tests/unit/conftest.py). Every problem names host, fact, variable and fix."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter import sglang_launch as sl
from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as sgf
from gpu_facts_helpers import gff, only_problem  # tests/unit/gpu_facts (on sys.path: tests/unit/conftest.py)

HOST = "gpu-07"


def check(facts, flags):
    """The check as tasks/launch_spec.yml wires it: the layout read by the flags entry point from the same flags."""
    return sl.sglang_launch_problems(facts, {"host": HOST, "flags": flags, "parallel": sgf.sglang_parallel(flags)})


def only(problems, kind="errors"):
    return only_problem(problems, HOST, kind)


# ---- communication flags of the host's profile -------------------------------------------------------------------


def test_the_seed_machine_without_p2p_gets_custom_all_reduce_off(rtx):
    comm = gff.gpu_comm_settings(rtx, {}, 1)
    out = sl.sglang_comm_flags(comm)
    assert out["flags"] == {"disable-custom-all-reduce": True}
    assert out["sources"] == {"disable-custom-all-reduce": "facts"}
    assert out["warnings"] == [] and any("CUDA IPC" in r for r in out["reasons"])


def test_nvlink_gets_no_communication_flag(h200):
    assert sl.sglang_comm_flags(gff.gpu_comm_settings(h200, {}, 1))["flags"] == {}


def test_overrides_set_and_remove_with_provenance_and_removing_the_guard_warns(rtx):
    comm = gff.gpu_comm_settings(rtx, {}, 1)
    out = sl.sglang_comm_flags(comm, {"enable-flashinfer-allreduce-fusion": True})
    assert out["flags"] == {"disable-custom-all-reduce": True, "enable-flashinfer-allreduce-fusion": True}
    assert out["sources"]["enable-flashinfer-allreduce-fusion"] == "inventory"
    out = sl.sglang_comm_flags(comm, {"disable-custom-all-reduce": None})
    assert out["flags"] == {} and out["removed"] == ["disable-custom-all-reduce"]
    assert any("custom all-reduce needs peer access" in w for w in out["warnings"])


def test_without_gpu_facts_the_derivation_says_which_role_to_run_first():
    with pytest.raises(AnsibleFilterError, match="run the gpu_facts role first"):
        sl.sglang_comm_flags({})
    with pytest.raises(AnsibleFilterError, match="run the gpu_facts role first"):
        sl.sglang_launch_problems({}, {})


# ---- the launch spec against the GPUs ----------------------------------------------------------------------------


def test_seed_machine_with_the_seed_launch_passes_with_backend_warnings(rtx):
    args = {
        "tp-size": 8,
        "mem-fraction-static": 0.92,
        "quantization": "modelopt_fp4",
        "nsa-decode-backend": "trtllm",
        "nsa-prefill-backend": "trtllm",
        "enable-flashinfer-allreduce-fusion": True,
        "kv-cache-dtype": "auto",
    }
    result = check(rtx, flags=args)
    assert result["errors"] == []
    texts = [w["text"] for w in result["warnings"]]
    assert sum("trtllm on sm_120 needs SGLang/FlashInfer builds with SM120 kernels" in t for t in texts) == 2
    assert any("SM90 or SM10X" in t for t in texts)
    assert result["summary"]["gpus_needed_per_node"] == 8


def test_tp16_on_one_8_gpu_host_is_refused(rtx):
    problem = only(check(rtx, flags={"tp-size": 16}))
    assert problem["check"] == "parallelism"
    assert "needs 16 GPUs per node but gpu-07 has 8" in problem["message"]
    assert problem["fact"] == "gpu_facts.gpu_count=8"
    assert "tp-size=16" in problem["variable"] and "nnodes=1" in problem["variable"]
    assert "span more nodes (2 hosts: sglang_server_multinode_group" in problem["fix"]


def test_tp16_over_two_nodes_fits_with_nnodes_only_in_the_flags(rtx):
    result = check(rtx, flags={"tp-size": 16, "nnodes": 2})
    assert result["errors"] == []
    assert result["summary"]["nnodes"] == 2 and result["summary"]["gpus_needed_per_node"] == 8


def test_tp_not_divisible_by_nnodes_is_refused(rtx):
    problem = only(check(rtx, flags={"tensor-parallel-size": 12, "nnodes": 8}))
    assert "tensor-parallel-size x pp-size = 12 GPUs is not divisible by nnodes=8" in problem["message"]


def test_pp_counts_and_idle_gpus_warn(rtx):
    result = check(rtx, flags={"tp-size": 2, "pp-size": 2})
    assert result["errors"] == []
    problem = only(result, "warnings")
    assert "4 of 8 GPUs per node: 4 would sit idle" in problem["message"]


def test_dp_without_dp_attention_multiplies(rtx):
    assert check(rtx, flags={"tp-size": 4, "dp-size": 2})["warnings"] == []
    assert "needs 16 GPUs" in only(check(rtx, flags={"tp-size": 8, "dp-size": 2}))["message"]
    assert check(rtx, flags={"tp-size": 8, "dp-size": 8, "enable-dp-attention": True})["errors"] == []


@pytest.mark.parametrize("value", ["eight", 0, -2])
def test_bad_tp_is_refused(rtx, value):
    problem = only(check(rtx, flags={"--tp-size": value}))
    assert f"tp-size={value!r} must be a positive integer" in problem["message"]


def test_string_values_are_read(rtx):
    assert check(rtx, flags={"tp-size": "8"})["errors"] == []


def test_bad_nnodes_is_refused(rtx):
    assert "nnodes='x' must be a positive integer" in only(check(rtx, flags={"tp-size": 8, "nnodes": "x"}))["message"]


def test_backend_plausibility(rtx, h200):
    warn = check(rtx, flags={"tp-size": 8, "nsa-decode-backend": "flashmla_kv", "kv-cache-dtype": "fp8_e4m3"})[
        "warnings"
    ]
    assert any("gave NaN output on sm_120" in w["message"] for w in warn)
    assert any("reported broken for GLM-5" in w["message"] for w in warn)
    warn = check(h200, flags={"tp-size": 2, "quantization": "modelopt_fp4", "dsa-prefill-backend": "trtllm"})[
        "warnings"
    ]
    assert any("NVFP4" in w["message"] for w in warn)
    assert any("built for Blackwell" in w["message"] for w in warn)
