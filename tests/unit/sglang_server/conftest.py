"""Import the sglang_server modules and module_utils as Ansible would, and run a module's main() in-process.

``run_module(module, args)`` returns ``(result, failed)``: the JSON the module printed (exit_json or
fail_json) and whether it failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import module_runner  # tests/support (on sys.path through tests/conftest.py)
import pytest

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "sglang_server"
FIXTURES = REPO / "tests" / "unit" / "fixtures"
LAB_CAPTURES = FIXTURES / "sglang-server-lab"

# The modules are imported by their file name from plugins/modules; they import module_utils as Ansible does
# (ansible_collections.gpufleet.fleet.plugins.module_utils.*, importable through tests/conftest.py).
MODULES = REPO / "plugins" / "modules"
if str(MODULES) not in sys.path:
    sys.path.insert(0, str(MODULES))
# The simulator's test helpers (a real sglang_sim server on loopback) for the modules that talk HTTP.
SIM_TESTS = REPO / "tests" / "unit" / "sglang_sim"
if str(SIM_TESTS) not in sys.path:
    sys.path.insert(0, str(SIM_TESTS))


@pytest.fixture
def run_module(capsys):
    return lambda name, args: module_runner.run_module(name, args, capsys)


@pytest.fixture
def make_sim(tmp_path):
    from sglang_sim_helpers import Sim

    sims = []

    def factory(args=None, env=None, n_gpus=2):
        base = tmp_path / f"sim{len(sims)}"
        base.mkdir(parents=True)
        sim = Sim(base, args, env, n_gpus)
        sims.append(sim)
        return sim.start()

    yield factory
    for sim in sims:
        sim.stop()
