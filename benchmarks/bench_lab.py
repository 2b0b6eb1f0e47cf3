"""Benchmark of the lab itself: bring-up time of 2 and 8 hosts from a cached base, and `make test`.

Prints a table and saves JSON to benchmarks/results/lab.json.

  make bench-lab                     # both
  python benchmarks/bench_lab.py --skip-make-test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_results import save_result

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "lab"))


def lab(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", *args], env=ENV, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"gpufleet_lab {' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout) if "--json" in args else {}


def bring_up(hosts: int, repeats: int) -> dict:
    name = f"bench-{hosts}"
    lab("--name", name, "up", "--hosts", "1", "--json")  # make sure the base is built and cached
    lab("--name", name, "down")
    samples = []
    for _ in range(repeats):
        started = time.monotonic()
        lab("--name", name, "up", "--hosts", str(hosts), "--json")
        samples.append(time.monotonic() - started)
        started = time.monotonic()
        lab("--name", name, "down")
        down = time.monotonic() - started
    return {
        "hosts": hosts,
        "up_seconds": [round(s, 2) for s in samples],
        "up_best": round(min(samples), 2),
        "down_seconds_last": round(down, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-make-test", action="store_true")
    args = parser.parse_args()
    result = {
        "benchmark": "lab",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "command": "make bench-lab",
        "bring_up": [bring_up(2, args.repeats), bring_up(8, args.repeats)],
    }
    if not args.skip_make_test:
        started = time.monotonic()
        rc = subprocess.run(
            ["make", "test"], cwd=ROOT, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ).returncode
        result["make_test"] = {"seconds": round(time.monotonic() - started, 1), "exit_code": rc}
    for row in result["bring_up"]:
        print(
            f"lab up, {row['hosts']} hosts from the cached base: best {row['up_best']} s "
            f"(runs: {row['up_seconds']}), down {row['down_seconds_last']} s"
        )
    if "make_test" in result:
        print(f"make test: {result['make_test']['seconds']} s (exit {result['make_test']['exit_code']})")
    save_result(result, ROOT / "benchmarks" / "results" / "lab.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
