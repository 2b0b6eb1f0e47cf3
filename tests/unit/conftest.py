"""What every unit test may use: the collection's modules importable by their file name (plugins/modules), as
Ansible runs them, the simulator's test helpers (a real sglang_sim server on loopback), the gpu_facts helpers
(tests/unit/gpu_facts/gpu_facts_helpers.py) and ``run_module``.

``run_module(module, args)`` runs a module's main() in-process and returns ``(result, failed)``: the JSON the
module printed (exit_json or fail_json) and whether it failed (tests/support/module_runner.py).

``sleeper()`` starts a Python process that sleeps 120 s (a live PID of this user, killed at the end) and returns
its Popen.

``bench_python`` is the controller's benchmark client's Python (built by `make bench-client`, part of `make setup`):
sglang's bench_serving and the fleet report's plotting.

``rtx`` and ``h200`` are the GPU facts of the two machines the gpu_facts and sglang_server checks are tested
against: the seed machine's 8x RTX PRO 6000 (sm_120, no P2P) from the lab simulator's profile, and the real
2x H200 (NVLink) from its capture.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import module_runner  # tests/support (on sys.path through tests/conftest.py)
import pytest

REPO = Path(__file__).resolve().parents[2]
# module_utils are imported as Ansible does (ansible_collections.gpufleet.fleet.plugins.module_utils.*).
for path in (REPO / "plugins" / "modules", *(REPO / "tests" / "unit" / name for name in ("sglang_sim", "gpu_facts"))):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture
def run_module(capsys):
    return lambda name, args: module_runner.run_module(name, args, capsys)


@pytest.fixture(scope="module")
def rtx():
    from gpu_facts_helpers import facts_for

    return facts_for("rtx-pro-6000x8-vm")


@pytest.fixture(scope="module")
def h200():
    from gpu_facts_helpers import device_facts

    return device_facts()


@pytest.fixture
def sleeper():
    procs = []

    def start():
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture(scope="session")
def bench_python() -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench_client.py"), "build"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"tools/bench_client.py build failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]
