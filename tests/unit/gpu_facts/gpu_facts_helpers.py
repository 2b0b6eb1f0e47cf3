"""Shared helpers for the gpu_facts unit tests: command runners over real captures and the lab simulator.

* ``device_raw()``: the exact outputs of the module's commands on a real 2x H200 machine
  (tests/unit/fixtures/h200-device/module-result.json, ``raw``).
* ``replay_runner(outputs)``: a ``run(argv)`` that answers the module's commands from a dict.
* ``sim_runner(profile)``: a ``run(argv)`` that runs the lab's simulated nvidia-smi with a profile.
* ``facts_for(profile)`` / ``device_facts()``: collected facts, ready for the filters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "unit" / "fixtures"
DEVICE = FIXTURES / "h200-device"
H200X2 = FIXTURES / "h200x2-vm"  # the 2x H200 VM's captures while busy, its NCCL measurement
SIM = REPO / "lab" / "gpusim" / "nvidia_smi.py"
PROFILES = REPO / "lab" / "gpusim" / "profiles"
H200X2_CAPTURES = PROFILES / "h200x2-vm" / "captures"  # its idle captures: one copy, the simulator replays them
BENCH = str(REPO / "roles" / "gpu_facts" / "files")  # the NCCL benchmark script the role runs
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import allreduce_bw as ab  # noqa: E402,F401  (re-exported for the tests)
from ansible_collections.gpufleet.fleet.plugins.filter import gpu_facts_filters as gff  # noqa: E402,F401

# sglang_server owns the flags and their parallel layout (sglang_parallel); the preflight tests feed its
# output to gpu_facts exactly as playbooks/vars/fleet.yml does.
from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as sgf  # noqa: E402,F401
from ansible_collections.gpufleet.fleet.plugins.module_utils import gpu_facts_collect as gfc  # noqa: E402

KVM = {("systemd-detect-virt", "--vm"): (0, "kvm\n", ""), ("systemd-detect-virt", "--container"): (1, "none\n", "")}


def no_files(_path):
    return None


def device_result():
    return json.loads((DEVICE / "module-result.json").read_text())


def device_raw():
    return device_result()["raw"]


def replay_runner(outputs, virt=None, calls=None):
    """``outputs``: key of gpu_facts_collect.commands() -> stdout, or -> (rc, stdout, stderr)."""
    by_argv = {tuple(argv): key for key, argv in gfc.commands().items()}
    virt = KVM if virt is None else virt

    def run(argv):
        if calls is not None:
            calls.append(list(argv))
        if tuple(argv) in virt:
            return virt[tuple(argv)]
        if argv[0] == "systemd-detect-virt":
            return 127, "", "not found"
        key = by_argv.get(tuple(argv))
        if key is None or key not in outputs:
            raise AssertionError(f"unexpected command {argv}")
        value = outputs[key]
        return value if isinstance(value, tuple) else (0, value, "")

    return run


def sim_runner(profile, state_dir="/nonexistent-gpusim-state", virt=None):
    env = dict(os.environ, GPUSIM_PROFILE_DIR=str(PROFILES / profile), GPUSIM_STATE_DIR=state_dir)
    virt = KVM if virt is None else virt

    def run(argv):
        if tuple(argv) in virt:
            return virt[tuple(argv)]
        if argv[0] != "nvidia-smi":
            return 127, "", "not found"
        proc = subprocess.run(
            [sys.executable, str(SIM), *argv[1:]], capture_output=True, text=True, env=env, check=False
        )
        return proc.returncode, proc.stdout, proc.stderr

    return run


def facts_for(profile, **kwargs):
    facts, _raw = gfc.collect(sim_runner(profile), use_nvml=False, read_text=no_files, **kwargs)
    return facts


def device_facts():
    facts, _raw = gfc.collect(replay_runner(device_raw()), use_nvml=False, read_text=no_files)
    return facts


def only_problem(problems, host, kind="errors"):
    """The one problem of ``kind`` (gpu_preflight_problems' or sglang_launch_problems' output), with every field a
    refusal must name filled in, for ``host``."""
    assert len(problems[kind]) == 1, problems[kind]
    problem = problems[kind][0]
    for key in ("host", "check", "message", "fact", "variable", "fix", "text"):
        assert problem[key], key
    assert problem["host"] == host and problem["text"].startswith(f"{host}: ")
    return problem
