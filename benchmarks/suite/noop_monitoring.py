"""No-op `deploy.yml` with the monitor included, on a lab that has one (a gateway host in fleet_monitors): the run
limited to one server and the monitor host(s), repeated; prints and saves the best wall time and what changed (must be
nothing). The bound: under 10 s on one host with the monitor included.

    python benchmarks/suite/noop_monitoring.py --inventory INVENTORY --server HOST [--repeats 3]
        [--output benchmarks/results/noop_monitoring.json]

The lab must be deployed already (`make deploy` for the default lab: inventory/lab/hosts.yml, server gpufleet-01).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(inventory: Path, limit: str) -> tuple[float, dict]:
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0")
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory), "deploy.yml", "-l", limit]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"deploy.yml failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}")
    changed = {m[0]: int(m[1]) for m in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.M)}
    return wall, changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, default=ROOT / "inventory/lab/hosts.yml")
    parser.add_argument("--server", default="gpufleet-01")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/noop_monitoring.json")
    args = parser.parse_args()
    inventory_text = args.inventory.read_text()
    monitors = re.findall(r"fleet_monitors:\s*\n\s*hosts:\s*\n((?:\s{6,}\S+:.*\n)+)", inventory_text)
    monitor_hosts = re.findall(r"^\s+(\S+):", monitors[0], re.M) if monitors else []
    if not monitor_hosts:
        raise SystemExit(f"{args.inventory} has no fleet_monitors host: nothing to measure")
    limit = ",".join([args.server, *monitor_hosts])
    runs = []
    for _ in range(args.repeats):
        wall, changed = run(args.inventory, limit)
        runs.append({"wall_s": round(wall, 2), "changed": changed})
        print(f"no-op deploy.yml -l {limit}: {wall:.2f} s, changed {changed}", flush=True)
    result = {
        "benchmark": "noop_monitoring",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip(),  # fmt: skip
        "limit": limit,
        "runs": runs,
        "best_wall_s": min(r["wall_s"] for r in runs),
        "changed_total": sum(sum(r["changed"].values()) for r in runs),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("limit", "best_wall_s", "changed_total")}))


if __name__ == "__main__":
    main()
