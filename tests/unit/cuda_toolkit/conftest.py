"""Make lab/ (the lab CUDA mirror tooling) and this directory importable for the cuda_toolkit tests."""

import sys
from pathlib import Path

for path in (Path(__file__).resolve().parents[3] / "lab", Path(__file__).resolve().parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
