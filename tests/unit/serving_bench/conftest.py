"""Import the serving_bench module (plugins/modules) as Ansible would; module_utils and filters: the collection."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "serving_bench"
FIXTURES = REPO / "tests" / "unit" / "fixtures" / "bench-serving"


@pytest.fixture
def tokenizer_dir(tmp_path) -> Path:
    """The lab test hub's tokenizer files (what the role fetches from a lab host's model directory)."""
    sys.path.insert(0, str(REPO / "lab"))
    from testhub import model

    files = model.files_for(1)
    d = tmp_path / "tokenizer"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (d / name).write_bytes(files[name])
    return d


@pytest.fixture
def make_sim_bench(tmp_path):
    """A simulated engine on loopback 200 tok/s for one request alone (knee 32)."""
    from sglang_sim_helpers import Sim

    sims = []

    def factory(args=None, env=None):
        base = tmp_path / f"sim{len(sims)}"
        base.mkdir(parents=True)
        sim = Sim(base, args, {"SGLANG_SIM_TOKENS_PER_S": "200", **(env or {})}, 2)
        sims.append(sim)
        sim.start()
        sim.wait_ready(timeout=20)
        return sim

    yield factory
    for sim in sims:
        sim.stop()
