"""gpusim-hold (lab/gpusim/gpusim_hold.py): "another program holds the GPUs" on a lab host.

Run as a subprocess against the simulated nvidia-smi with a private registry; what the simulator then
prints is read back with the role's own reader (sglang_server_holders.gpu_state) and compared with the
real captures of a held H200 (tests/unit/fixtures/h200-device/gpu-holder/).
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SIM = REPO / "lab" / "gpusim" / "nvidia_smi.py"
HOLD = REPO / "lab" / "gpusim" / "gpusim_hold.py"
PROFILES = REPO / "lab" / "gpusim" / "profiles"
CAPTURE = REPO / "tests" / "unit" / "fixtures" / "h200-device" / "gpu-holder"

from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_holders as server_holders  # noqa: E402


@pytest.fixture
def lab(tmp_path):
    state = tmp_path / "state"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {SIM} "$@"\n')
    smi.chmod(0o755)
    env = dict(os.environ, GPUSIM_PROFILE_DIR=str(PROFILES / "h200x2-vm"), GPUSIM_STATE_DIR=str(state))
    started = []

    def smi_run(argv, timeout=60):
        proc = subprocess.run([str(smi), *argv[1:]], capture_output=True, text=True, env=env, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr

    def hold(*args):
        proc = subprocess.Popen(
            [sys.executable, str(HOLD), "--nvidia-smi", str(smi), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield {"run": smi_run, "hold": hold, "state": state}
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def holding(proc):
    line = proc.stdout.readline()
    assert line.startswith("gpusim-hold: holding"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return line


def test_a_holder_is_listed_like_a_real_one_and_named_by_the_role(lab):
    proc = lab["hold"]("--gpus", "0,1", "--mib", "21090")
    line = holding(proc)
    assert f"as pid {proc.pid}" in line and "this is not a CUDA program" in line
    rc, apps, _ = lab["run"](
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv"]
    )
    assert rc == 0
    rows = apps.splitlines()
    # same header and row shape as the real capture (pid, name, "N MiB", uuid), one row per GPU
    assert rows[0] == "pid, process_name, used_gpu_memory [MiB], gpu_uuid"
    assert [r.split(", ")[:3] for r in rows[1:]] == [[str(proc.pid), sys.executable, "21090 MiB"]] * 2
    real = (CAPTURE / "held-query-apps-module.csv").read_text().strip().split(", ")
    assert real[1] == "/opt/torch/.venv/bin/python3"  # the real tool also shows argv[0], a full path

    gs = server_holders.gpu_state(runner=lab["run"])
    assert {i: g["memory_used_mib"] for i, g in gs["gpus"].items()} == {0: 21090, 1: 21090}
    ours, foreign = server_holders.classify_gpu_processes(gs["processes"], "sglang-server.service")
    assert ours == []
    text = server_holders.describe_processes(foreign)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert text.startswith(f"pid {proc.pid} ({sys.executable}, user {me}, command `{sys.executable} {HOLD} ")
    assert "--gpus 0,1 --mib 21090`, GPUs 0,1, 42180 MiB, unit " in text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_memory_follows_the_holders_death(lab, sig):
    proc = lab["hold"]("--gpus", "1", "--mib", "4096")
    holding(proc)
    assert server_holders.gpu_state(runner=lab["run"])["gpus"][1]["memory_used_mib"] == 4096
    proc.send_signal(sig)
    assert proc.wait(timeout=10) == -sig  # dies of the signal, as a script without a handler does
    gs = server_holders.gpu_state(runner=lab["run"])
    assert gs["processes"] == [] and gs["gpus"][1]["memory_used_mib"] == 0
    assert not list(lab["state"].glob("alloc-*.json"))  # SIGTERM: removed; SIGKILL: pruned by nvidia-smi


def test_no_memory_no_hold(lab):
    first = lab["hold"]("--gpus", "0", "--mib", "100000")
    holding(first)
    second = lab["hold"]("--gpus", "0", "--mib", "100000")
    assert second.wait(timeout=10) == 1
    err = second.stderr.read()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 97.66 GiB. GPU 0 has a total capacity" in err
    assert f"{(143771 - 615 - 100000) / 1024:.2f} GiB is free" in err
    assert [p["pid"] for p in server_holders.gpu_state(runner=lab["run"])["processes"]] == [first.pid]


def test_a_gpu_that_does_not_exist_is_refused(lab):
    proc = lab["hold"]("--gpus", "2", "--mib", "10")
    assert proc.wait(timeout=10) == 1
    assert "CUDA error: invalid device ordinal" in proc.stderr.read()
    assert not list(lab["state"].glob("alloc-*.json"))


def test_seconds_lets_go(lab):
    proc = lab["hold"]("--gpus", "0", "--mib", "10", "--seconds", "0.5")
    holding(proc)
    started = time.monotonic()
    assert proc.wait(timeout=10) == 0 and time.monotonic() - started < 5
    assert server_holders.gpu_state(runner=lab["run"])["processes"] == []
