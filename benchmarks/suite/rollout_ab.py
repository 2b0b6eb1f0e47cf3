"""Interleaved A/B of a real rollout's own overhead per batch for two commits, on a lab kept by fleet_rollout.py.

    python benchmarks/suite/fleet_rollout.py --hosts 5 --repeats 1 --rollout-repeats 1 --keep-lab
    python benchmarks/suite/rollout_ab.py A_COMMIT B_COMMIT [--rounds 4] [--output benchmarks/results/rollout_ab.json]

This machine's speed moves by a quarter within an hour, so two benchmark runs of two commits minutes apart compare
the machine as much as the code. Here each round runs one rollout of a flag change (chunked-prefill-size, back and
forth) in batches of 1 and N-1 with each commit's `roles/` and `plugins/` (`git checkout <commit> -- roles plugins`;
the order alternates per round), on the same lab, and prints per rollout and as medians: the rollout's own overhead
per batch (wall minus the engines' stop and warm-up), its growth per added host, and the CPU per added host by where
it is spent. The working tree's `roles/` and `plugins/` are put back to HEAD at the end: commit your changes first.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_rollout  # noqa: E402  (the lab, the playbook runner and the CPU sampler)
from interleaved import alternating, flag_changes, record, save  # noqa: E402


def use(commit: str) -> None:
    """The commit's roles/ and plugins/ in the working tree, without files the commit does not have."""
    for folder in ("roles", "plugins"):
        subprocess.run(["git", "rm", "-r", "-q", "--cached", folder], cwd=ROOT, check=True)
        subprocess.run(["git", "clean", "-f", "-q", "--", folder], cwd=ROOT, check=True)
        subprocess.run(["git", "checkout", commit, "--", folder], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "rollout_ab.json"))
    args = parser.parse_args()
    sizes = fleet_rollout.kept_lab_batches()
    out = {
        "command": "python benchmarks/suite/rollout_ab.py " + " ".join(sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "serial": sizes,
        "rollouts": [],
    }
    sides = (("A", args.a), ("B", args.b))
    rollouts = flag_changes(sizes)
    try:
        for code, commit in alternating(args.rounds, sides):
            use(commit)
            record(out, {"code": code, "commit": commit, **next(rollouts)})
    finally:
        use("HEAD")
    rows = out["rollouts"]
    groups = {code: ({"commit": commit}, [r for r in rows if r["code"] == code]) for code, commit in sides}
    save(out, groups, args.output)


if __name__ == "__main__":
    main()
