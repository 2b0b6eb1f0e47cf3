"""What the controller's main process spends on one task and host: ansible-core's VariableManager.get_vars for a task
of playbooks/rollout.yml's batch play (its first, the pipeline-full flags include, which every host of a batch
runs), with the facts of a deployed lab, facts injected as variables or not.

    python benchmarks/suite/get_vars_cost.py [--inventory tmp/perf-fleet/hosts.yml] [--facts tmp/perf-fleet/facts]
        [--host perf-fleet-05] [--calls 200] [--output benchmarks/results/get_vars_cost.json]

Under the linear strategy the main process computes every host's variables for every task before the task's last host
starts (docs/measurements/2026-12-04-fleet-rollout.md: 35 task results per host in a rollout batch), so this cost is one
part of what a batch's overhead gains per host however many cores the controller has (the worker's fork and the result
handling are the others). Each setting runs in its own Python process (ansible-core reads its configuration once),
alternating, `--repeats` times; the best and median ms per call are printed and saved. The facts come from the lab's
fact cache (`ANSIBLE_CACHE_PLUGIN_CONNECTION`, as benchmarks/suite/fleet_rollout.py leaves it): run that benchmark (or a
deploy of the lab) first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# One measurement, in a child process: ansible-core's configuration (inject_facts_as_vars) is read at import.
CHILD = r"""
import json, sys, time
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1] + "/collections"])
from ansible import context
from ansible.inventory.manager import InventoryManager
from ansible.module_utils.common.collections import ImmutableDict
from ansible.parsing.dataloader import DataLoader
from ansible.playbook import Playbook
from ansible.vars.manager import VariableManager

context.CLIARGS = ImmutableDict(tags={}, skip_tags={}, extra_vars=[], forks=25)
loader = DataLoader()
inventory = InventoryManager(loader=loader, sources=[sys.argv[2]])
variables = VariableManager(loader=loader, inventory=inventory)
playbook = Playbook.load(sys.argv[1] + "/playbooks/rollout.yml", variable_manager=variables, loader=loader)
play = next(p for p in playbook.get_plays() if p.get_name().startswith("Rollout - batches"))
task = next(t for b in play.compile() for t in b.block if getattr(t, "action", "") == "ansible.builtin.include_role")
host = inventory.get_host(sys.argv[3])
names = [h.name for h in inventory.get_hosts()]
variables.get_vars(play=play, host=host, task=task, _hosts=names, _hosts_all=names)
started = time.perf_counter()
for _ in range(int(sys.argv[4])):
    result = variables.get_vars(play=play, host=host, task=task, _hosts=names, _hosts_all=names)
elapsed = time.perf_counter() - started
facts = result.get("ansible_facts") or {}
print(json.dumps({"ms_per_call": 1000 * elapsed / int(sys.argv[4]), "variables": len(result), "facts": len(facts)}))
"""


def measure(inject: bool, args) -> dict:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_INJECT_FACT_VARS=str(inject),
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(Path(args.facts).resolve()),
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(Path(args.inventory).resolve()), args.host, str(args.calls)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"get_vars measurement failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inventory", default=str(ROOT / "tmp/perf-fleet/hosts.yml"))
    parser.add_argument("--facts", default=str(ROOT / "tmp/perf-fleet/facts"))
    parser.add_argument("--host", default="perf-fleet-05")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/get_vars_cost.json"))
    args = parser.parse_args(argv)
    if not any(Path(args.facts).glob(f"*{args.host}")):
        raise SystemExit(f"no cached facts of {args.host} in {args.facts}: run benchmarks/suite/fleet_rollout.py first")
    runs: dict[str, list[dict]] = {"injected": [], "not_injected": []}
    for _ in range(args.repeats):
        runs["injected"].append(measure(True, args))
        runs["not_injected"].append(measure(False, args))
    out = {
        "command": "python benchmarks/suite/get_vars_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": round(os.getloadavg()[0], 2)},
        "host": args.host,
        "calls": args.calls,
    }
    for name, samples in runs.items():
        ms = [s["ms_per_call"] for s in samples]
        out[name] = {
            "ms_per_call_best": round(min(ms), 2),
            "ms_per_call_median": round(statistics.median(ms), 2),
            "variables": samples[0]["variables"],
            "facts": samples[0]["facts"],
        }
        print(f"get_vars, facts {name.replace('_', ' ')}: {out[name]['ms_per_call_best']} ms per call (best), "
              f"{out[name]['ms_per_call_median']} ms (median); {out[name]['variables']} variables")  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(f"saved {args.output}")
    return out


if __name__ == "__main__":
    main()
