"""playbooks/preflight.yml on lab hosts (gpu_facts' host checks, then sglang_server's launch spec against the facts):
refusals name host, fact, variable and fix; nothing changes first."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import ROOT, lab, lab_json

NAME = "t-preflight"
HOSTS = {"pf-rtx": "rtx-pro-6000x8-vm", "pf-old": "old-driver", "pf-none": "none"}
SMALL_DISK = {"gpu_facts_disk_requirements": [{"path": "/opt/ml-env", "min_free_gib": 1, "purpose": "ml-env"}]}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    path = tmp_path_factory.mktemp("inv") / "hosts.yml"
    lab_json(
        "--name", NAME, "up", "--hosts", str(len(HOSTS)), "--host-names", ",".join(HOSTS),
        "--profile", ",".join(HOSTS.values()), "--inventory", str(path),
    )  # fmt: skip
    yield path
    lab("--name", NAME, "down", check=False)


def playbook(inventory, host, extra=None, playbook="playbooks/preflight.yml", tmp_path=None):
    env = dict(
        os.environ,
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts") if tmp_path else os.environ.get("TMPDIR", "/tmp"),
    )
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory), playbook, "-l", host,
           "-e", json.dumps({**SMALL_DISK, **(extra or {})})]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=300)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_seed_machine_passes_and_gets_the_seed_set(inventory, tmp_path):
    rc, out = playbook(
        inventory, "pf-rtx", {"sglang_server_args_host": {"tp-size": 8}, "measure_nccl": "auto"}, tmp_path=tmp_path
    )
    assert rc == 0, out
    assert "NCCL_P2P_LEVEL: PHB" in out and "NCCL_MIN_NCHANNELS: '8'" in out
    # the communication flag of the no-P2P profile, derived by sglang_server from gpu_facts_comm.profile
    assert "profile: no-p2p" in out and "disable-custom-all-reduce: true" in out
    assert "disable-custom-all-reduce: facts" in out
    assert "NCCL measurement skipped on pf-rtx: /opt/ml-env/current/bin/python is missing" in out
    assert "changed=0" in out


def test_tp16_on_one_8_gpu_host_is_refused(inventory, tmp_path):
    rc, out = playbook(inventory, "pf-rtx", {"sglang_server_args_host": {"tp-size": 16}}, tmp_path=tmp_path)
    assert rc != 0
    assert "LAUNCH SPEC REFUSED on pf-rtx" in out
    assert "tp x pp = 16 over 1 node(s) needs 16 GPUs per node but pf-rtx has 8" in out
    assert (
        "fact: gpu_facts.gpu_count=8" in out
        and "variable: sglang_server_args_*: tp-size=16, pp-size=1, nnodes=1" in out
    )
    assert "fix: lower tp-size/pp-size to at most 8 GPUs in total" in out


def test_multi_node_tp_not_divisible_by_nnodes_is_refused(inventory, tmp_path):
    extra = {"sglang_server_args_host": {"tp-size": 16, "nnodes": 3}}
    rc, out = playbook(inventory, "pf-rtx", extra, tmp_path=tmp_path)
    assert rc != 0
    assert "tp-size x pp-size = 16 GPUs is not divisible by nnodes=3" in out


def test_two_node_layout_written_in_the_flags_is_refused_by_the_multinode_rule(inventory, tmp_path):
    # `-e '{"sglang_server_args_host":{"tp-size":16,"nnodes":2}}'` was refused "over 1 node(s)"
    # by gpu_facts. The node count has one source, the inventory's multi-node group: gpu_facts derives for the one
    # node the inventory has, the launch spec (tp 16 over the flags' 2 nodes) passes, and what refuses it is the
    # multi-node rule: nnodes comes from sglang_server_multinode_group, never written by hand.
    extra = {"sglang_server_args_host": {"tp-size": 16, "nnodes": 2}}
    rc, out = playbook(inventory, "pf-rtx", extra, tmp_path=tmp_path)
    assert rc != 0
    # the preflight checks ran and passed (an ok assert prints no message; PREFLIGHT FAILED would name a refusal)
    assert "TASK [gpu_facts : Refuse the host when a preflight check fails]" in out
    assert "over 1 node(s)" not in out and "PREFLIGHT FAILED" not in out and "LAUNCH SPEC REFUSED" not in out
    assert "NCCL_P2P_LEVEL: PHB" in out and "NCCL_IB_DISABLE: '1'" in out  # one node in the inventory
    assert "nnodes=2 in the flags but the server has 1 node(s)" in out


def test_old_driver_is_refused_for_cuda_12_8(inventory, tmp_path):
    rc, out = playbook(inventory, "pf-old", {"sglang_server_args_host": {"tp-size": 8}}, tmp_path=tmp_path)
    assert rc != 0
    assert "driver 550.127.05 is too old for CUDA 12.8 (needs >= 570.26)" in out
    assert "fact: gpu_facts.driver_version=550.127.05" in out and "variable: cuda_toolkit_version=12.8" in out


def test_host_without_driver_fails_naming_the_command(inventory, tmp_path):
    rc, out = playbook(inventory, "pf-none", tmp_path=tmp_path)
    assert rc != 0
    assert "NVIDIA driver not loaded" in out and "nvidia-smi --query-gpu=" in out and "exited 9" in out


def test_required_measurement_without_torch_is_refused(inventory, tmp_path):
    rc, out = playbook(
        inventory, "pf-rtx", {"sglang_server_args_host": {"tp-size": 8}}, "playbooks/measure_nccl.yml", tmp_path
    )
    assert rc != 0
    assert "NCCL measurement requested" in out and "/opt/ml-env/current/bin/python is missing" in out


def test_deploy_starts_with_the_preflight(inventory, tmp_path):
    rc, out = playbook(inventory, "pf-rtx", {"sglang_server_args_host": {"tp-size": 16}}, "deploy.yml", tmp_path)
    assert rc != 0 and "LAUNCH SPEC REFUSED on pf-rtx" in out
