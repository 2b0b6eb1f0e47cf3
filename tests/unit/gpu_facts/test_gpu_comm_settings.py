"""gpu_comm_settings: the one derivation of the NCCL environment and the communication profile (the SGLang flags of
that profile are sglang_server's: tests/unit/sglang_server/test_launch_spec.py)."""

from __future__ import annotations

import copy
import json

import pytest
from gpu_facts_helpers import DEVICE, gff

SEED_ENV = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_LEVEL": "PHB",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1",
    "NCCL_MIN_NCHANNELS": "8",
}


def _pcie(facts_in, link, status="OK"):
    facts = copy.deepcopy(facts_in)
    facts["topology"].update(
        {"link_types": [link], "nvlink_all": False, "nvlink_any": False, "worst_link": link, "worst_pcie_link": link}
    )
    facts["p2p"].update({"statuses": [status], "all_ok": status == "OK", "any_ok": status == "OK"})
    return facts


def test_seed_machine_gets_exactly_the_seed_set(rtx):
    result = gff.gpu_comm_settings(rtx, {}, 1)
    assert result["nccl_env"] == SEED_ENV
    assert "sglang_flags" not in result
    assert result["profile"] == "no-p2p"
    assert set(result["sources"].values()) == {"facts"}
    assert set(result["sources"]) == set(SEED_ENV)
    assert "NCCL_SHM_DISABLE" not in result["nccl_env"]
    assert result["errors"] == [] and result["warnings"] == []
    assert any("NCCL_SHM_DISABLE is never set" in r for r in result["reasons"])
    assert any(r.startswith("NCCL_ALLOC_P2P_NET_LL_BUFFERS=1") for r in result["reasons"])


def test_h200_nvlink_leaves_nccl_alone(h200):
    result = gff.gpu_comm_settings(h200, {}, 1)
    assert result["nccl_env"] == {} and "sglang_flags" not in result
    assert result["profile"] == "nvlink-p2p" and result["sources"] == {}
    assert result["inputs"]["link_types"] == ["NV18"]


def test_h200_derivation_matches_what_ran_on_the_device(h200):
    recorded = json.loads((DEVICE / "derived-settings.json").read_text())["gpu_facts_comm"]
    result = gff.gpu_comm_settings(h200, {}, 1)
    for key in ("nccl_env", "sources", "profile", "errors"):
        assert result[key] == recorded[key]
    # the device run recorded the SGLang flags of that profile too (none with NVLink); sglang_server derives them now
    assert recorded["sglang_flags"] == {}


@pytest.mark.parametrize("link", ["PIX", "PXB", "PHB", "NODE"])
def test_pcie_with_p2p_sets_the_level_of_the_farthest_pair(rtx, link):
    result = gff.gpu_comm_settings(_pcie(rtx, link), {}, 1)
    assert result["nccl_env"] == {"NCCL_P2P_LEVEL": link}
    assert result["profile"] == "pcie-p2p"


def test_pcie_across_sockets_keeps_the_default_and_warns(rtx):
    result = gff.gpu_comm_settings(_pcie(rtx, "SYS"), {}, 1)
    assert result["nccl_env"] == {} and result["profile"] == "pcie-p2p-sys"
    assert "measure_nccl" in result["warnings"][0]


@pytest.mark.parametrize("status", ["CNS", "NS", "GNS", "TNS", "DR", "U"])
def test_any_not_ok_status_is_no_p2p(rtx, status):
    result = gff.gpu_comm_settings(_pcie(rtx, "PHB", status), {}, 1)
    assert result["nccl_env"] == SEED_ENV and result["profile"] == "no-p2p"


def test_multi_node_keeps_infiniband(rtx):
    result = gff.gpu_comm_settings(rtx, {}, 2)
    assert "NCCL_IB_DISABLE" not in result["nccl_env"]
    assert result["nccl_env"]["NCCL_P2P_LEVEL"] == "PHB"
    assert result["inputs"]["nnodes"] == 2


def test_inventory_overrides_set_change_and_remove_with_provenance(rtx):
    overrides = {
        "nccl_env": {"NCCL_MIN_NCHANNELS": 16, "NCCL_ALLOC_P2P_NET_LL_BUFFERS": None, "NCCL_DEBUG": "WARN"},
    }
    result = gff.gpu_comm_settings(rtx, overrides, 1)
    assert result["nccl_env"] == {
        "NCCL_P2P_LEVEL": "PHB",
        "NCCL_IB_DISABLE": "1",
        "NCCL_MIN_NCHANNELS": "16",
        "NCCL_DEBUG": "WARN",
    }
    assert result["sources"] == {
        "NCCL_P2P_LEVEL": "facts",
        "NCCL_IB_DISABLE": "facts",
        "NCCL_MIN_NCHANNELS": "inventory",
        "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "inventory",
        "NCCL_DEBUG": "inventory",
    }
    assert result["removed"] == ["NCCL_ALLOC_P2P_NET_LL_BUFFERS"]


def test_booleans_become_nccl_strings(h200):
    result = gff.gpu_comm_settings(h200, {"nccl_env": {"NCCL_P2P_DISABLE": True, "NCCL_SHM_DISABLE": False}}, 1)
    assert result["nccl_env"] == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"}


@pytest.mark.parametrize("value", ["1", 1, True, "yes"])
def test_shm_disable_on_a_no_p2p_host_is_refused(rtx, value):
    result = gff.gpu_comm_settings(rtx, {"nccl_env": {"NCCL_SHM_DISABLE": value}}, 1)
    assert len(result["errors"]) == 1
    assert "gpu_facts_nccl_env_overrides.NCCL_SHM_DISABLE" in result["errors"][0]
    assert "remove NCCL_SHM_DISABLE" in result["errors"][0]


def test_shm_disable_zero_is_fine_and_on_nvlink_only_warns(rtx, h200):
    assert gff.gpu_comm_settings(rtx, {"nccl_env": {"NCCL_SHM_DISABLE": "0"}}, 1)["errors"] == []
    result = gff.gpu_comm_settings(h200, {"nccl_env": {"NCCL_SHM_DISABLE": "1"}}, 1)
    assert result["errors"] == [] and "NCCL_SHM_DISABLE" in result["warnings"][0]


def test_p2p_disable_where_p2p_works_warns(h200):
    result = gff.gpu_comm_settings(h200, {"nccl_env": {"NCCL_P2P_DISABLE": "1"}}, 1)
    assert "10x slower" in result["warnings"][0]


def test_sglang_flag_overrides_are_refused_here_naming_their_new_place(rtx):
    with pytest.raises(gff.GpuFactsFilterError, match="sglang_server_comm_flags_overrides"):
        gff.gpu_comm_settings(rtx, {"sglang_flags": {"disable-custom-all-reduce": None}}, 1)


def test_partial_p2p_and_missing_rows_warn(rtx):
    facts = copy.deepcopy(rtx)
    facts["p2p"].update({"any_ok": True, "missing_gpus": ["GPU7"]})
    result = gff.gpu_comm_settings(facts, {}, 1)
    assert result["profile"] == "no-p2p"
    assert any("some GPU pairs" in w for w in result["warnings"])
    assert any("GPU7" in w for w in result["warnings"])


def test_mig_mixed_and_nvml_disagreement_warn(h200):
    facts = copy.deepcopy(h200)
    facts.update({"mig_enabled": True, "mixed_models": True, "models": ["A", "B"]})
    facts["p2p"].update({"nvml_agrees": False, "nvml_disagreements": ["GPU0-GPU1: nvidia-smi OK, nvml NS"]})
    warnings = gff.gpu_comm_settings(facts, {}, 1)["warnings"]
    assert len(warnings) == 3


def test_single_gpu(h200):
    facts = copy.deepcopy(h200)
    facts["gpu_count"] = 1
    result = gff.gpu_comm_settings(facts, {}, 1)
    assert result["profile"] == "single-gpu" and result["nccl_env"] == {}


def test_no_driver_is_an_error():
    result = gff.gpu_comm_settings({"driver_loaded": False, "gpu_count": 0}, {}, 1)
    assert result["profile"] == "no-driver" and result["errors"]


@pytest.mark.parametrize(
    ("facts", "overrides", "nnodes", "message"),
    [
        ({}, {}, 1, "ansible_facts.gpu_facts"),
        ({"gpu_count": 2}, {"env": {}}, 1, "unknown override sections"),
        ({"gpu_count": 2}, [], 1, "must be a dict"),
        ({"gpu_count": 2}, {"nccl_env": []}, 1, "overrides.nccl_env must be a dict"),
        ({"gpu_count": 2}, {}, "two", "nnodes must be an integer"),
        ({"gpu_count": 2}, {}, 0, "nnodes must be >= 1"),
    ],
)
def test_bad_input_raises(facts, overrides, nnodes, message):
    with pytest.raises(gff.GpuFactsFilterError, match=message):
        gff.gpu_comm_settings(facts, overrides, nnodes)


def test_filter_plugin_exposes_both_filters_and_wraps_errors():
    filters = gff.FilterModule().filters()
    assert set(filters) == {"gpu_comm_settings", "gpu_preflight_problems"}
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="gpu_comm_settings: expected ansible_facts.gpu_facts"):
        filters["gpu_comm_settings"]({}, {}, 1)
