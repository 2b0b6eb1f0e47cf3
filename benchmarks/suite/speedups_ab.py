"""The opt-in private-API speed-ups (tools/ansible_speedups) against the default configuration (public APIs only),
interleaved on a lab kept by fleet_rollout.py (run it with --rollout-repeats 0, so the servers run what the inventory
says and their last deploy.yml left its converged record): first `--rounds` rounds of no-op deploy.yml, limited to
one server host and to every server host, for each side in turn (the order alternating per round); then `--rounds`
rounds of a real rollout of a flag change in batches of 1 and N-1 for each side in turn (its own overhead per batch:
wall minus the engines' stop and warm-up). The no-ops come first: after a rollout, deploy.yml would see the rolled
flag differ from the inventory and restart the servers back.

    python benchmarks/suite/fleet_rollout.py --hosts 8 --repeats 2 --rollout-repeats 0 --keep-lab
    python benchmarks/suite/speedups_ab.py [--rounds 2] [--output benchmarks/results/speedups_ab.json]
    python -m gpufleet_lab --name perf-fleet down

The opt-in side's environment is what `. tools/ansible_speedups/env.sh` exports (read from the script itself).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_rollout  # noqa: E402  (the lab, the playbook runner and the CPU sampler)
from interleaved import alternating, flag_changes, record, save  # noqa: E402

ENV_SH = ROOT / "tools" / "ansible_speedups" / "env.sh"


def speedups_env() -> dict[str, str]:
    """The variables env.sh sets or changes, as a shell that sources it sees them."""
    script = f'. "{ENV_SH}" && env -0'
    out = subprocess.run(["bash", "-c", script], env={"PATH": os.environ["PATH"]}, capture_output=True, check=True)
    after = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return {k: v for k, v in after.items() if k.startswith("ANSIBLE_")}


def noop_deploy(limit: str) -> dict:
    """One no-op deploy.yml limited to `limit`: wall time and the tasks it changed (must be none)."""
    wall, out = fleet_rollout.playbook("deploy.yml", "-l", limit)
    changed = {h: c["changed"] for h, c in fleet_rollout.recap(out).items() if c.get("changed")}
    return {"wall_s": round(wall, 2), "changed": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "speedups_ab.json"))
    args = parser.parse_args()
    sizes = fleet_rollout.kept_lab_batches()
    base = dict(fleet_rollout.PLAY_ENV)
    sides = (("default", base), ("opt-in", {**base, **speedups_env()}))
    out = {
        "command": "python benchmarks/suite/speedups_ab.py " + " ".join(sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": round(os.getloadavg()[0], 2)},
        "serial": sizes,
        "server_hosts": sum(sizes),
        "opt_in_env": sides[1][1],
        "noop": [],
        "rollouts": [],
    }
    try:
        for name, env in alternating(args.rounds, sides):
            fleet_rollout.PLAY_ENV = env
            one, every = noop_deploy(f"{fleet_rollout.LAB}-01"), noop_deploy("sglang_servers")
            out["noop"].append({"side": name, "one_host": one, "every_host": every})
            print(f"{name}: no-op deploy.yml {one['wall_s']} s, 1 host; {every['wall_s']} s, every host", flush=True)
        rollouts = flag_changes(sizes)
        for name, env in alternating(args.rounds, sides):
            fleet_rollout.PLAY_ENV = env
            record(out, {"side": name, **next(rollouts)})
    finally:
        fleet_rollout.PLAY_ENV = base
    for name, _ in sides:
        runs = [n for n in out["noop"] if n["side"] == name]
        walls = {key: [r[key]["wall_s"] for r in runs] for key in ("one_host", "every_host")}
        out[f"noop_{name}"] = {key: {"best": min(w), "median": statistics.median(w)} for key, w in walls.items()}
        print(name, "no-op deploy.yml best/median:", out[f"noop_{name}"], flush=True)
    rows = out["rollouts"]
    save(out, {name: ({}, [r for r in rows if r["side"] == name]) for name, _ in sides}, args.output)


if __name__ == "__main__":
    main()
