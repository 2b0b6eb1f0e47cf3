"""Fixtures for the sglang-sim tests (helpers live in sglang_sim_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_sim_helpers import Sim  # noqa: E402


@pytest.fixture
def make_sim(tmp_path):
    sims: list[Sim] = []

    def factory(args=None, env=None, n_gpus=2, start=True, subdir=None) -> Sim:
        base = tmp_path / (subdir or f"sim{len(sims)}")
        base.mkdir(parents=True, exist_ok=True)
        sim = Sim(base, args, env, n_gpus)
        sims.append(sim)
        if start:
            sim.start()
        return sim

    yield factory
    for sim in sims:
        sim.stop()
