"""Load the cuda_toolkit role's Python (filter plugin, module) and the lab mirror tooling by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "cuda_toolkit"
LAB = REPO / "lab"
if str(LAB) not in sys.path:
    sys.path.insert(0, str(LAB))


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


filters = load("cuda_toolkit_filters", REPO / "plugins" / "filter" / "cuda_toolkit.py")
wheels_module = load("cuda_toolkit_wheels_module", REPO / "plugins" / "modules" / "cuda_toolkit_wheels.py")
