"""Fixtures of the pvesim rule tests: a fresh simulated cluster per test (both schema releases where it matters)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from pvesim_cluster import OPS_TOKEN, ROOT_TOKEN, Client, sim_of  # noqa: E402


@pytest.fixture(params=["8.4.1", "9.1.2"])
def sim(request):
    return sim_of(request.param)


@pytest.fixture
def root(sim):
    return Client(sim)


@pytest.fixture
def root_token(sim):
    return Client(sim, ROOT_TOKEN)


@pytest.fixture
def ops_token(sim):
    return Client(sim, OPS_TOKEN)
