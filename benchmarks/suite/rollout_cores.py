"""How a real rollout's own overhead per batch depends on the CPU cores the lab has: one core against two,
interleaved, on a lab kept by fleet_rollout.py.

    python benchmarks/suite/fleet_rollout.py --hosts 5 --repeats 1 --rollout-repeats 1 --keep-lab
    python benchmarks/suite/rollout_cores.py [--rounds 3] [--output benchmarks/results/rollout_cores.json]

On this machine the controller, every lab host and every simulated engine share two cores; on a real fleet each
VM has its own. The goal is a per-batch overhead that stays flat as hosts are added to a batch, and what a
host adds to a batch here is about 3.5-4.5 CPU seconds (fleet_rollout.py's `cpu_per_added_host_s`). Whether that
CPU, on shared cores, is what makes the overhead grow is a question this script answers by measurement: each round
runs one rollout of a flag change (chunked-prefill-size, back and forth) in batches of 1 and N-1 with every process
of the machine allowed on one core (sched_setaffinity on every pid; new processes inherit it: ssh, sshd sessions,
the units the lab hosts' systemd starts), and one with both cores (the order alternates per round). If the growth
per added host is the shared CPU, it about doubles on one core; if it were waiting (lockstep, polls, sleeps), it
would stay. Every process gets both cores back at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_rollout  # noqa: E402  (the lab, the playbook runner and the CPU sampler)
from interleaved import alternating, flag_changes, record, save  # noqa: E402


def pin_machine(cpus: set[int]) -> dict:
    """Every process of the machine allowed on `cpus` only; how many took it and how many refused (per-CPU kernel
    threads refuse, and processes that end while we walk /proc)."""
    took = refused = 0
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            os.sched_setaffinity(pid, cpus)
            took += 1
        except OSError:
            refused += 1
    return {"cpus": sorted(cpus), "processes": took, "refused": refused}


def engine_affinity() -> list[list[int]]:
    """The CPUs each running simulated engine may use (they are started by the lab hosts' systemd during the
    rollout, so this shows that the pin reached them)."""
    seen = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"sglang_sim" in cmdline and b"launch_server" in cmdline:
            try:
                seen.append(sorted(os.sched_getaffinity(int(pid))))
            except OSError:
                continue
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "rollout_cores.json"))
    args = parser.parse_args()
    all_cpus = os.sched_getaffinity(0)
    if len(all_cpus) < 2:
        raise SystemExit(f"this machine lets this process use {len(all_cpus)} CPU: nothing to compare")
    sizes = fleet_rollout.kept_lab_batches()
    both = set(sorted(all_cpus)[:2])
    one = {min(both)}
    out = {
        "command": "python benchmarks/suite/rollout_cores.py " + " ".join(sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip(),
        "serial": sizes,
        "rollouts": [],
    }
    rollouts = flag_changes(sizes)
    try:
        for cpus in alternating(args.rounds, (one, both)):
            pinned = pin_machine(cpus)
            rollout = next(rollouts)
            record(out, {"cores": len(cpus), "pinned": pinned, "engines_allowed_on": engine_affinity(), **rollout})
    finally:
        out["restored"] = pin_machine(all_cpus)
    rows = out["rollouts"]
    groups = {
        key: ({"cores": n}, [r for r in rows if r["cores"] == n]) for key, n in (("one_core", 1), ("two_cores", 2))
    }
    save(out, groups, args.output)


if __name__ == "__main__":
    main()
