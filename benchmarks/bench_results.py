"""Saving a benchmark's result (bench_lab.py, ml_env/bench_env_build.py): JSON under benchmarks/results/."""

from __future__ import annotations

import json
from pathlib import Path


def save_result(result: dict, out: Path) -> None:
    """`result` as indented JSON in `out` (its folder made if missing), and a line that says where."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")
