"""Where the CPU a host adds to a rollout batch goes, by program: one real rollout on a lab kept by fleet_rollout.py,
under the kernel's process accounting, and (with py-spy installed) the controller's main process sampled.

    apt-get install acct        # accton, dump-acct (Debian); py-spy from PyPI is optional
    python benchmarks/suite/fleet_rollout.py --hosts 5 --repeats 1 --rollout-repeats 1 --keep-lab
    python benchmarks/suite/rollout_processes.py [--output benchmarks/results/rollout_processes.json]

Process accounting writes one record per process that ends, with its command name (15 characters), CPU and start
and run time, for every process of the machine, the lab hosts' included (they are containers on this kernel). The
rollout runs in batches of 1 and N-1 (a flag change, chunked-prefill-size); each record is charged to the batch in
whose window (its start to its gate, the rollout report's batch_timings) the process ended, and the difference of
the two batches divided by the hosts added is what one host adds, per program: the controller's workers
(`ansible-playboo`, one fork per task and host), the module runs on the hosts (`python3.11`), the simulated
nvidia-smi, the engines (a stopped engine's record carries all the CPU it used since its start). Processes still
running at the end (the controller's main process, ssh masters, the new engines) have no record: the main process
is what py-spy samples (`--rate 200`, raw stacks; the share of its samples by function, cumulative; the result
loop's short sleeps between looks at the workers count as samples of `_wait_on_pending_results`).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_rollout  # noqa: E402  (the lab, the playbook runner and the CPU sampler)

# dump-acct: command|version|user|system|elapsed (1/100 s)|uid|gid|memory|io|pid|ppid|flags|exit|tty|start
DUMP_FIELDS = 15


def accounted(pacct: Path) -> list[tuple[str, float, float]]:
    """(command, CPU seconds, end time) of each process record."""
    out = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) != DUMP_FIELDS:
            continue
        start = time.mktime(time.strptime(f[14], "%a %b %d %H:%M:%S %Y"))  # local time, second resolution
        rows.append((f[0], (float(f[2]) + float(f[3])) / 100, start + float(f[4]) / 100))
    return rows


def by_program(rows: list[tuple[str, float, float]], windows: list[tuple[int, float, float]]) -> dict:
    """Per program: CPU and processes in each batch's window, and per host added (last batch minus first)."""
    cpu = {n: collections.Counter() for n, _, _ in windows}
    count = {n: collections.Counter() for n, _, _ in windows}
    for command, seconds, end in rows:
        for n, a, b in windows:
            if a <= end <= b + 1:  # the start time has a resolution of one second
                cpu[n][command] += seconds
                count[n][command] += 1
    (first, _, _), (last, _, _) = windows[0], windows[-1]
    programs = sorted(set(cpu[first]) | set(cpu[last]), key=lambda c: cpu[first][c] - cpu[last][c])  # most added first
    return {
        c: {
            "cpu_per_added_host_s": round((cpu[last][c] - cpu[first][c]) / (last - first), 3),
            "processes_per_added_host": round((count[last][c] - count[first][c]) / (last - first), 1),
            "cpu_s": [round(cpu[n][c], 2) for n, _, _ in windows],
            "processes": [count[n][c] for n, _, _ in windows],
        }
        for c in programs
        if cpu[first][c] or cpu[last][c]
    }


def main_process_profile(raw: Path, top: int = 20) -> dict:
    """py-spy raw stacks: share of the main process's samples by function (cumulative), site-packages cut."""
    cumulative, total = collections.Counter(), 0
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        total += int(n)
        seen = set()
        for frame in stack.split(";"):
            key = re.sub(r" \(/.*/site-packages/", " (", re.sub(r":\d+\)?$", "", frame))
            if key not in seen:
                seen.add(key)
                cumulative[key] += int(n)
    return {
        "samples": total,
        "cumulative_share": {k: round(v / total, 3) for k, v in cumulative.most_common(top)} if total else {},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "rollout_processes.json"))
    args = parser.parse_args()
    if not shutil.which("accton") or not shutil.which("dump-acct"):
        raise SystemExit("needs the kernel's process accounting tools: apt-get install acct")
    sizes = fleet_rollout.kept_lab_batches()
    spy = shutil.which("py-spy")
    work = Path(tempfile.mkdtemp(prefix="rollout-processes-"))
    pacct, raw = work / "pacct", work / "main.txt"
    pacct.touch()
    result: dict = {}

    def rollout() -> None:
        result["run"] = fleet_rollout.changing_rollout(sizes, 2048)[0]

    subprocess.run(["accton", str(pacct)], check=True, capture_output=True)
    try:
        worker = threading.Thread(target=rollout)
        worker.start()
        sampler = None
        while spy and sampler is None and worker.is_alive():
            cpu_pid = fleet_rollout.controller_pid()
            if cpu_pid:
                sampler = subprocess.Popen(
                    [spy, "record", "--pid", str(cpu_pid), "--rate", "200", "--format", "raw", "--nonblocking",
                     "--output", str(raw)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            time.sleep(0.05)
        worker.join()
        if sampler:
            sampler.wait(timeout=60)
    finally:
        subprocess.run(["accton", "off"], check=True, capture_output=True)
    if "run" not in result:
        raise SystemExit("the rollout did not finish")
    timings = result["run"]["batch_timings"]
    windows = [(len(t["hosts"]), float(t["started_at"]), float(t["started_at"]) + float(t["wall_s"])) for t in timings]
    out = {
        "command": "python benchmarks/suite/rollout_processes.py " + " ".join(sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip(),
        "serial": sizes,
        "own_overhead_s": [t["own_overhead_s"] for t in timings],
        "cpu_s": [t["cpu_s"] for t in timings],
        "programs": by_program(accounted(pacct), windows),
        "main_process": main_process_profile(raw) if raw.exists() else "py-spy not installed",
    }
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(f"own overhead per batch {sizes}: {out['own_overhead_s']}")
    print("CPU s per added host, processes per added host, program:")
    for command, row in list(out["programs"].items())[:12]:
        print(f"  {row['cpu_per_added_host_s']:6.2f} {row['processes_per_added_host']:6.1f}  {command}")
    if isinstance(out["main_process"], dict):
        print("controller main process, share of samples (cumulative):")
        for frame, share in list(out["main_process"]["cumulative_share"].items())[:20]:
            print(f"  {share:6.1%}  {frame[:140]}")
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
