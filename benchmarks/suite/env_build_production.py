"""Env build of the PRODUCTION lock (locks/sglang-cu128: sglang 0.5.9, torch 2.9.1 cu128, 169 packages, ~4.8 GiB
of wheels) from a local wheelhouse, uv vs pip, cold cache, in the same run (the lab lock has one package, so
benchmarks/results/ml_env.json times venv creation, not installation).

    python benchmarks/suite/env_build_production.py [--wheelhouse /var/cache/gpufleet-lab/wheelhouse-sglang-cu128]
        [--python python3.12] [--output benchmarks/results/env_build_production.json]

Uses the build functions of benchmarks/ml_env/bench_env_build.py (same commands: `uv venv` + `uv pip sync
--require-hashes --no-index --find-links`, `python -m venv` + `pip install --require-hashes --no-index
--find-links`), each with a fresh cache directory. The lock is for Python 3.12 (cp312 wheels).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "ml_env"))
from bench_env_build import pip_build, uv_build  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheelhouse", default="/var/cache/gpufleet-lab/wheelhouse-sglang-cu128")
    parser.add_argument("--python", default=shutil.which("python3.12") or "python3.12")
    parser.add_argument("--lock", default=str(ROOT / "locks" / "sglang-cu128" / "requirements.txt"))
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "env_build_production.json"))
    args = parser.parse_args(argv)
    wheelhouse = Path(args.wheelhouse)
    wheels = list(wheelhouse.glob("*.whl"))
    if not wheels:
        sys.exit(f"no wheels in {wheelhouse} (the production wheelhouse: `make real-engine` fills it)")
    out: dict = {
        "lock": "locks/sglang-cu128",
        "wheelhouse": str(wheelhouse),
        "wheels": len(wheels),
        "wheelhouse_gib": round(sum(w.stat().st_size for w in wheels) / 2**30, 2),
        "python": args.python,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "command": "python benchmarks/suite/env_build_production.py " + " ".join(argv or sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    lock = Path(args.lock)
    with tempfile.TemporaryDirectory(prefix="envbuild-", dir=str(ROOT / ".cache")) as tmp:
        work = Path(tmp)
        out["uv_cold"] = uv_build(work, lock, str(wheelhouse), work / "uv-cache", args.python)
        out["pip_cold"] = pip_build(work, lock, str(wheelhouse), work / "pip-cache", args.python)
    out["pip_over_uv"] = round(out["pip_cold"]["total_s"] / out["uv_cold"]["total_s"], 2)
    for k in ("uv_cold", "pip_cold"):
        out[k] = {n: round(v, 2) for n, v in out[k].items()}
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
