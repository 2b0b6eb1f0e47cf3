"""What every unit test may use: the collection's modules importable by their file name (plugins/modules), as
Ansible runs them, the simulator's test helpers (a real sglang_sim server on loopback) and ``run_module``.

``run_module(module, args)`` runs a module's main() in-process and returns ``(result, failed)``: the JSON the
module printed (exit_json or fail_json) and whether it failed (tests/support/module_runner.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import module_runner  # tests/support (on sys.path through tests/conftest.py)
import pytest

REPO = Path(__file__).resolve().parents[2]
# module_utils are imported as Ansible does (ansible_collections.gpufleet.fleet.plugins.module_utils.*).
for path in (REPO / "plugins" / "modules", REPO / "tests" / "unit" / "sglang_sim"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture
def run_module(capsys):
    return lambda name, args: module_runner.run_module(name, args, capsys)
