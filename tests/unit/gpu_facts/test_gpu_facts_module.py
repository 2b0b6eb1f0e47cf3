"""The gpu_facts module as Ansible runs it (AnsiballZ, the collection module_utils), with simulated nvidia-smi."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gpu_facts_helpers import PROFILES, REPO, SIM

ANSIBLE = REPO / ".venv" / "bin" / "ansible"
pytestmark = pytest.mark.skipif(not ANSIBLE.exists(), reason="needs the project's venv (make venv)")


@pytest.fixture
def smi(tmp_path):
    def make(profile):
        wrapper = tmp_path / f"smi-{profile}"
        wrapper.write_text(
            f"#!/bin/sh\nGPUSIM_PROFILE_DIR={PROFILES / profile} GPUSIM_STATE_DIR={tmp_path / 'state'} "
            f'exec {sys.executable} {SIM} "$@"\n'
        )
        wrapper.chmod(0o755)
        return str(wrapper)

    return make


def run_module(args, tmp_path, check=False):
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = false\n")
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
        ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
    )
    tree = tmp_path / "tree"
    cmd = [
        str(ANSIBLE),
        "-i",
        "localhost,",
        "-c",
        "local",
        "localhost",
        "-m",
        "gpufleet.fleet.gpu_facts",
        "-a",
        args,
        "-t",
        str(tree),
    ]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, cwd=tmp_path)
    return proc, json.loads((tree / "localhost").read_text())


def test_seed_profile_in_check_mode(smi, tmp_path):
    proc, result = run_module(
        json.dumps({"nvidia_smi": smi("rtx-pro-6000x8-vm"), "disk_paths": ["/nonexistent/x"]}), tmp_path, check=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = result["ansible_facts"]["gpu_facts"]
    assert result["changed"] is False
    assert facts["gpu_count"] == 8 and facts["archs"] == ["sm_120"] and facts["p2p"]["statuses"] == ["NS"]
    assert facts["disk"][0]["checked_path"] == "/"
    assert "raw" not in result


def test_h200_profile_with_raw(smi, tmp_path):
    proc, result = run_module(json.dumps({"nvidia_smi": smi("h200x2-vm"), "include_raw": True}), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["ansible_facts"]["gpu_facts"]["topology"]["link_types"] == ["NV18"]
    assert "\x1b[4m" in result["raw"]["topo_m"]


def test_no_driver_fails_with_command_and_output(smi, tmp_path):
    proc, result = run_module(json.dumps({"nvidia_smi": smi("none")}), tmp_path)
    assert proc.returncode != 0
    assert result["rc"] == 9
    assert "NVIDIA driver not loaded" in result["msg"] and "--query-gpu=" in result["msg"]
    assert "couldn't communicate with the NVIDIA driver" in result["stdout"]


def test_no_driver_tolerated_when_asked(smi, tmp_path):
    proc, result = run_module(json.dumps({"nvidia_smi": smi("none"), "fail_on_missing_driver": False}), tmp_path)
    assert proc.returncode == 0
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["driver_loaded"] is False and "driver not loaded" in facts["error"]


def test_missing_binary(tmp_path):
    proc, result = run_module(json.dumps({"nvidia_smi": "/nonexistent/nvidia-smi"}), tmp_path)
    assert proc.returncode != 0 and "nvidia-smi not found" in result["msg"]
