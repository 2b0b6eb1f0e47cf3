"""The sglang_server tests' folders and a real simulated server (``make_sim``); the modules' import path and
``run_module`` are every unit test's (tests/unit/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "sglang_server"
FIXTURES = REPO / "tests" / "unit" / "fixtures"
LAB_CAPTURES = FIXTURES / "sglang-server-lab"


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
