"""Benchmark: what the sglang_server role adds to a restart beyond the engine's own start time.

On one lab host (simulated 8x RTX PRO 6000 VM, the seed's flags, the simulated engine with 1 s weights +
1 s CUDA graphs), the server is deployed once, then restarted with `playbooks/restart.yml` (a forced
safe restart) --repeats times. Each run's deploy report gives:

* engine_start_to_ready_s: the engine's own start (process start -> /health 200);
* down_to_healthy_s: the server's downtime as the role runs it (stop begins -> health proven by generation);
* downtime_overhead_s = down_to_healthy_s - engine_start_to_ready_s: stop (drain + cgroup empty), GPU
  memory release wait, file install + start, readiness detection latency, smoke generation, Ansible
  task overhead in between (target: under 3 s);
* pre-stop checks (validate_s: flags against --help, probes, render + systemd-analyze verify): the old
  server is still serving then, so they add no downtime; and the playbook's wall time.

  python benchmarks/restart/bench_restart.py [--repeats 3] [--keep]   # as root; saves benchmarks/results/restart.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAB = "bench-restart"
HOST = "bench-restart-01"


def sh(argv, env=None, check=True):
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"failed: {' '.join(map(str, argv))}")
    return proc


def lab(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "lab"))
    return sh([sys.executable, "-m", "gpufleet_lab", "--name", LAB, *args], env=env)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--subnet", default="10.139.0.0/24")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "restart.json"))
    args = ap.parse_args()

    up = json.loads(
        lab("up", "--hosts", "1", "--host-names", HOST, "--profile", "rtx-pro-6000x8-vm", "--subnet", args.subnet,
            "--json").stdout
    )  # fmt: skip
    host = up["hosts"][0]
    work = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    inv = work / "inventory"
    inv.mkdir()
    (inv / "group_vars").symlink_to(ROOT / "inventory" / "lab" / "group_vars")
    ssh_args = "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR"
    (inv / "hosts.yml").write_text(
        json.dumps(
            {
                "all": {
                    "children": {
                        "gpufleet_lab": {"hosts": {HOST: None}},
                        "sglang_servers": {"hosts": {HOST: None}},
                    },
                    "vars": {
                        "ansible_host": host["address"],
                        "ansible_user": "root",
                        "ansible_ssh_private_key_file": host["ssh_key"],
                        "ansible_ssh_common_args": ssh_args,
                    },
                }
            }
        )
    )
    reports = work / "reports"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_HOST_KEY_CHECKING="False",
        MOLECULE_EPHEMERAL_DIRECTORY=str(work),
        GPUFLEET_ROOT=str(ROOT),
        PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
    )
    playbook = [
        str(ROOT / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        str(inv),
        "-e",
        f"sglang_server_report_dir={reports}",
    ]
    sh(playbook + ["roles/sglang_server/molecule/shared/prepare.yml"], env=env)
    sh(playbook + ["playbooks/deploy_server.yml"], env=env)

    runs = []
    for i in range(args.repeats):
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        sh(playbook + ["playbooks/restart.yml"], env=env)
        wall = time.monotonic() - t0
        r = json.loads((reports / f"{HOST}.json").read_text())
        assert r["result"] == "ok", r["result"]
        t = r["timings"]
        run = {
            "run": i + 1,
            "playbook_wall_s": round(wall, 3),
            "validate_s": t["validate_s"],
            "stop_s": t["deploy_stop_s"],
            "release_wait_s": t["deploy_release_wait_s"],
            "engine_start_to_ready_s": t["deploy_engine_start_to_ready_s"],
            "ready_detection_latency_s": t["deploy_ready_detection_latency_s"],
            "smoke_s": t["deploy_smoke_s"],
            "down_to_healthy_s": t["deploy_down_to_healthy_s"],
            "load_avg_1m_before": round(load, 2),
        }
        run["downtime_overhead_s"] = round(run["down_to_healthy_s"] - run["engine_start_to_ready_s"], 3)
        runs.append(run)
        print(json.dumps(run), flush=True)

    def med(key):
        return round(statistics.median(r[key] for r in runs), 3)

    keys = [k for k in runs[0] if k not in ("run",)]
    result = {
        "benchmark": "sglang_server restart overhead (lab, simulated engine)",
        "command": f"python benchmarks/restart/bench_restart.py --repeats {args.repeats}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "lab": {"profile": "rtx-pro-6000x8-vm", "engine": "sglang_sim (1 s weights + 1 s CUDA graphs)"},
        "target_downtime_overhead_s": 3.0,
        "median": {k: med(k) for k in keys},
        "best": {"downtime_overhead_s": min(r["downtime_overhead_s"] for r in runs)},
        "runs": runs,
    }
    result["meets_target"] = result["median"]["downtime_overhead_s"] < 3.0
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))
    if not args.keep:
        lab("down")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
