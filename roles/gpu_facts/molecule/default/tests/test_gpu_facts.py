"""gpu_facts on lab hosts: the seed machine gets the seed's NCCL set, the NVLink H200 VM none."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SEED_ENV = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_LEVEL": "PHB",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1",
    "NCCL_MIN_NCHANNELS": "8",
}


def result(name: str) -> dict:
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / f"gpu_facts-{name}.json"
    return json.loads(path.read_text())


@pytest.fixture
def rtx():
    return result("gf-rtx")


@pytest.fixture
def h200():
    return result("gf-h200")


def test_seed_machine_facts(rtx, host_by_name):
    facts = rtx["gpu_facts"]
    assert facts["gpu_count"] == 8
    assert facts["archs"] == ["sm_120"]
    assert facts["topology"]["link_types"] == ["PHB"]
    assert facts["p2p"]["statuses"] == ["NS"] and facts["p2p"]["all_ok"] is False
    # the lab host is a container on whatever the CI machine is; the VM type is systemd-detect-virt --vm's
    host = host_by_name("gf-rtx")
    vm = host.run("systemd-detect-virt --vm").stdout.strip()
    assert facts["virtualization"]["vm"] == vm
    assert facts["virtualization"]["container"] == "systemd-nspawn"
    if vm == "kvm":
        assert facts["virtualization"]["is_vm"] is True


def test_seed_machine_gets_the_seed_nccl_set(rtx):
    comm = rtx["gpu_facts_comm"]
    assert comm["nccl_env"] == SEED_ENV
    assert "sglang_flags" not in comm  # SGLang's flags are sglang_server's (its filter sglang_comm_flags)
    assert set(comm["sources"].values()) == {"facts"}
    assert comm["profile"] == "no-p2p"


def test_h200_nvlink_has_no_p2p_override(h200):
    facts = h200["gpu_facts"]
    assert facts["gpu_count"] == 2 and facts["archs"] == ["sm_90"]
    assert facts["topology"]["link_types"] == ["NV18"] and facts["p2p"]["all_ok"] is True
    comm = h200["gpu_facts_comm"]
    assert comm["nccl_env"] == {} and comm["profile"] == "nvlink-p2p"


def test_preflight_passes_on_both_hosts(rtx, h200):
    assert rtx["preflight_errors"] == [] and h200["preflight_errors"] == []


def test_measurement_skipped_without_torch(rtx):
    assert rtx["nccl_skip_reason"] == "/opt/ml-env/current/bin/python is missing"


def test_the_role_changed_nothing_on_the_host(host):
    assert not host.file("/opt/ml-env").exists
