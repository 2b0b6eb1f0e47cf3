"""Fleet benchmarks on one lab: no-op `deploy.yml` and no-op `playbooks/rollout.yml` on 1
and on N server hosts, and a real rollout's overhead per batch split from the engine's warm-up.

    python benchmarks/suite/fleet_rollout.py [--hosts 8] [--repeats 2] [--rollout-repeats 3] [--keep-lab]
        [--output benchmarks/results/fleet_rollout.json]

One lab `perf-fleet` (N server hosts with simulated GPUs + 1 gateway host running the router), its inventory in
tmp/perf-fleet (two levels under the project, so the lab group_vars' paths resolve), the lab's equipment (CUDA
mirror, test hub, wheelhouses) as `make deploy` uses it. Steps:

1. first `deploy.yml` on every host (all servers restart at once: `sglang_server_serial=N`);
2. no-op `deploy.yml` (each host proven in place by the converged check, `hosts_proven_in_place`) limited to one
   server host, then to every server host (`-l sglang_servers`; the gateway
   stage has no host in either run), alternating, `--repeats` times each: best wall time and the ratio
   N hosts / 1 host (the goal: at most 1.5);
3. no-op `rollout.yml` (its default batches `[1, "25%", "100%"]`, with `rollout_max_unavailable: 100%`: the
   default budget of 50% refuses a last batch of 5 of 8 workers) on one server host, then on every one;
4. a real rollout of a flag change (`chunked-prefill-size`) in batches of 1, 2 and the rest: per batch the
   rollout report's `batch_timings` (wall time from the batch's start to its gate, the slowest engine
   start-to-ready of the batch, and the difference, the rollout's overhead; and with the engine's stop counted as
   engine time too, SGLang's drain of 0-5 s, the rollout's own overhead; goal: flat as hosts are added),
   `--rollout-repeats` times (the flag changed back and forth): the medians per batch size, and from them what each
   host added to a batch costs.

Every figure is a wall time on this machine, recorded with the load average at the start; the ratios are
measured in the same run. JSON in benchmarks/results/fleet_rollout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from gpufleet_testinfra import recap, run_playbook  # noqa: E402  (the lab tests' playbook runner)

LAB = "perf-fleet"
WORK = ROOT / "tmp" / LAB
LAB_ENV = dict(os.environ, PYTHONPATH=str(ROOT / "lab"), HF_HUB_OFFLINE="1")
# this lab's facts apart from the default lab's (host names differ, but the cache folder is shared)
PLAY_ENV = {
    "PYTHONPATH": str(ROOT / "lab"),
    "HF_HUB_OFFLINE": "1",
    "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(WORK / "facts"),
}
REPORTS = {
    "sglang_server_report_dir": str(WORK / "reports/deploy"),
    "rollout_report_dir": str(WORK / "reports/rollout"),
}


CLK_TCK = os.sysconf("SC_CLK_TCK")


def controller_stat() -> tuple[int, list[str]] | None:
    """The pid and /proc stat fields (after the command name) of the running ansible-playbook child of this
    process (its main process); None when no playbook runs."""
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == os.getpid() and "ansible-playboo" in stat[: stat.rindex(")")]:
            return int(pid), fields
    return None


def controller_pid() -> int | None:
    found = controller_stat()
    return found[0] if found else None


def controller_cpu() -> tuple[float, float] | None:
    """(main, all) CPU seconds of the running ansible-playbook child of this process: its main process alone (the
    serial part: strategy, variables of each task and host, results) and with the workers it has reaped (cutime,
    cstime; a worker's ssh clients are in its own). None when no playbook runs."""
    found = controller_stat()
    if found is None:
        return None
    utime, stime, cutime, cstime = (int(x) / CLK_TCK for x in found[1][11:15])
    return utime + stime, utime + stime + cutime + cstime


def machine_busy_s(stat: str | None = None) -> float:
    """CPU seconds this whole machine has been busy since boot, every core and process (/proc/stat's first line:
    user, nice, system, irq, softirq, steal; guest time is inside user): what the sampled cgroups do not see (the ssh
    control masters, the kernel's network work for the lab's hosts) is in it."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    fields = [int(x) for x in text.split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


# The engine's unit inside a lab host (its systemd gets the cgroup subtree <host>/payload: lab/gpufleet_lab/cgroups.py)
ENGINE_CGROUP = "payload/system.slice/sglang-server.service"


def cgroup_usage_s(cpu_stat: Path) -> float | None:
    """usage_usec of a cgroup v2 cpu.stat, in seconds; None when the cgroup does not exist (a unit not running)."""
    try:
        text = cpu_stat.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1]) / 1e6
    return None


def lab_host_cpu() -> dict[str, tuple[float, float | None]]:
    """Per host of the bench lab, (CPU seconds of the host, of its engine unit) from their cgroups (the lab tool's
    gpufleet-lab/<lab>/<host>, and sglang-server.service in it; None while the unit has no cgroup)."""
    out = {}
    for stat in Path(f"/sys/fs/cgroup/unified/gpufleet-lab/{LAB}").glob("*/cpu.stat"):
        total = cgroup_usage_s(stat)
        if total is not None:
            out[stat.parent.name] = (total, cgroup_usage_s(stat.parent / ENGINE_CGROUP / "cpu.stat"))
    return out


def counter_increase(values: list[float | None]) -> float:
    """How much a CPU counter grew over consecutive samples when its cgroup can go away and come back: a restarted
    unit's new cgroup counts from 0 again. None is a sample without the cgroup; the first sample is the baseline
    (None there: the cgroup was made inside the window, all of its count is new). A cgroup removed and made again
    between two samples is seen by its count going down; the last 0.2 s of a stopped unit are not seen."""
    total, previous = 0.0, (values[0] if values and values[0] is not None else 0.0)
    for value in values[1:]:
        if value is None:
            previous = 0.0
            continue
        total += value - previous if value >= previous else value
        previous = value
    return total


class CpuSampler(threading.Thread):
    """Samples (time, controller main CPU, controller CPU, each lab host's CPU, the machine's busy CPU) every 0.2 s
    while a playbook runs, so each batch's window of a rollout can be charged: the controller's serial main process,
    the controller with its workers, the gateway host and the server hosts, split into their engines and the rest (on
    real VMs each server host has its own CPUs; here all of them share this machine's cores, which is why the server
    hosts' CPU is reported apart, and the engines' apart from what the rollout itself runs on the hosts)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, float, dict, float]] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            cpu = controller_cpu()
            if cpu is not None:
                self.samples.append((time.time(), cpu[0], cpu[1], lab_host_cpu(), machine_busy_s()))

    def window(self, start: float, end: float) -> dict:
        """CPU seconds spent between two wall-clock times (the samples nearest inside them)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {}
        (t0, m0, a0, h0, b0), (t1, m1, a1, h1, b1) = inside[0], inside[-1]
        hosts = {h: h1[h][0] - h0.get(h, h1[h])[0] for h in h1}
        servers = [h for h in hosts if "-router-" not in h]
        server_hosts = sum(hosts[h] for h in servers)
        engines = sum(counter_increase([s[3].get(h, (0.0, None))[1] for s in inside]) for h in servers)
        return {
            "controller_main_s": round(m1 - m0, 2),
            "controller_s": round(a1 - a0, 2),
            "gateway_s": round(sum(hosts.values()) - server_hosts, 2),
            "server_hosts_s": round(server_hosts, 2),
            "server_engines_s": round(engines, 2),
            "server_hosts_without_engines_s": round(server_hosts - engines, 2),
            "sampled_s": round(t1 - t0, 2),
            # the whole machine: busy CPU seconds in the window, and how many of its cores that is on average
            "machine_busy_s": round(b1 - b0, 2),
            "machine_cores_busy": round((b1 - b0) / (t1 - t0), 2) if t1 > t0 else 0.0,
        }


def lab(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", "--name", LAB, *args],
        env=LAB_ENV, capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"gpufleet_lab {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def playbook(name: str, *args: str, extra: dict | None = None) -> tuple[float, str]:
    """Wall time and output of one ansible-playbook run on the bench lab's inventory (its log kept in WORK)."""
    started = time.perf_counter()
    proc = run_playbook(
        name, *args, extra_vars={**REPORTS, **(extra or {})}, inventory=WORK / "hosts.yml", env=PLAY_ENV,
        log_dir=WORK, timeout=3600,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name} {' '.join(args)} failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}")
    return wall, proc.stdout


def noop_pair(playbook_name: str, one: str, many: str, repeats: int, extra: dict | None = None) -> dict:
    """Best no-op wall time limited to one host and to many, alternating; the ratio; what changed (must be 0)."""
    samples: dict[str, list[float]] = {"one": [], "many": []}
    changed: dict[str, dict] = {}
    proven: dict[str, int] = {}
    for _ in range(repeats):
        for key, limit in (("one", one), ("many", many)):
            wall, out = playbook(playbook_name, "-l", limit, extra=extra)
            samples[key].append(round(wall, 2))
            changed[key] = {h: c["changed"] for h, c in recap(out).items() if c.get("changed")}
            # hosts the converged check proved in place (they skipped every stage, or the rollout's server stage)
            proven[key] = out.count(": converged, proven in place")
    best = {k: min(v) for k, v in samples.items()}
    median = {k: round(statistics.median(v), 2) for k, v in samples.items()}
    return {
        "limit_one": one,
        "limit_many": many,
        "one_host_s": {"best": best["one"], "median": median["one"], "samples": samples["one"]},
        "many_hosts_s": {"best": best["many"], "median": median["many"], "samples": samples["many"]},
        "many_over_one": round(best["many"] / best["one"], 2),
        # the same ratio of the medians: less moved by one lucky or unlucky sample
        "many_over_one_median": round(median["many"] / median["one"], 2),
        "changed_tasks_by_host": changed,  # a no-op changes nothing (report folders aside)
        "hosts_proven_in_place": proven,
    }


def batches_for(hosts: int) -> list[int]:
    """Batches of 1, 2, then the rest (as many as the hosts allow)."""
    sizes, left = [], hosts
    for size in (1, 2):
        if left > 1:
            sizes.append(size)
            left -= size
    return [*sizes, left] if left else sizes


def real_rollout(sizes: list[int], chunked_prefill: int) -> dict:
    """One rollout of a flag change in batches `sizes`: its report's batch_timings, each with the CPU of its window."""
    extra = {
        "rollout_serial": sizes,
        "rollout_max_unavailable": max(sizes),
        "sglang_server_args_host": {"chunked-prefill-size": chunked_prefill},
    }
    sampler = CpuSampler()
    sampler.start()
    try:
        wall, _ = playbook("playbooks/rollout.yml", extra=extra)
    finally:
        sampler.stop.set()
        sampler.join()
    report = json.loads((WORK / "reports/rollout/last.json").read_text())
    if report["result"] != "ok":
        raise SystemExit(f"the real rollout did not end ok: {json.dumps(report)[:3000]}")
    for t in report["batch_timings"]:
        # CPU spent in the batch's window (its start to its gate): what grows with the hosts of a batch
        t["cpu_s"] = sampler.window(float(t["started_at"]), float(t["started_at"]) + float(t["wall_s"]))
    return {
        "change": f"sglang_server_args_host chunked-prefill-size {chunked_prefill}",
        "wall_s": round(wall, 2),
        "batch_timings": report["batch_timings"],
        "hosts": report["hosts"],
    }


def changing_rollout(sizes: list[int], chunked_prefill: int) -> tuple[dict, int]:
    """real_rollout of a value the servers do not run yet: a rollout of the value they run restarts nothing (its
    report has no batches), so the other value is rolled out instead. Returns the run and the value it set."""
    run = real_rollout(sizes, chunked_prefill)
    if run["batch_timings"]:
        return run, chunked_prefill
    other = 2048 if chunked_prefill == 4096 else 4096
    return real_rollout(sizes, other), other


# The CPU figures of a batch's window that the comparisons on a kept lab (rollout_ab.py, rollout_cores.py) summarise.
COMPARED_CPU_KEYS = ("controller_main_s", "controller_s", "server_hosts_without_engines_s", "machine_busy_s")


def kept_lab_batches() -> list[int]:
    """Batches of one server host and of every other one, on the lab a run with --keep-lab left (its gateway host
    is not a server)."""
    return [1, len(json.loads(lab("instances"))) - 2]


def rollout_row(run: dict) -> dict:
    """One rollout of a comparison: per batch its hosts, own overhead, the engines' stop and warm-up, and its CPU."""
    timings = run["batch_timings"]
    return {
        "wall_s": run["wall_s"],
        "hosts": [len(t["hosts"]) for t in timings],
        "own_overhead_s": [t["own_overhead_s"] for t in timings],
        "engine_stop_s": [t["engine_stop_s"] for t in timings],
        "engine_start_to_ready_s": [t["engine_start_to_ready_s"] for t in timings],
        "machine_cores_busy": [t["cpu_s"]["machine_cores_busy"] for t in timings],
        **{k: [t["cpu_s"][k] for t in timings] for k in COMPARED_CPU_KEYS},
    }


def compared(rows: list[dict]) -> dict:
    """Medians over the rollout_row()s of one side of a comparison (two batches each): own overhead per batch, its
    growth per added host (the median of each rollout's), CPU per added host, cores busy per batch."""
    added = rows[0]["hosts"][1] - rows[0]["hosts"][0]

    def med(key: str, batch: int) -> float:
        return round(statistics.median(r[key][batch] for r in rows), 3)

    return {
        "rollouts": len(rows),
        "own_overhead_s": [med("own_overhead_s", 0), med("own_overhead_s", 1)],
        "own_overhead_per_added_host_s": round(
            statistics.median((r["own_overhead_s"][1] - r["own_overhead_s"][0]) / added for r in rows), 2
        ),
        "cpu_per_added_host_s": {k: round((med(k, 1) - med(k, 0)) / added, 2) for k in COMPARED_CPU_KEYS},
        "machine_cores_busy": [med("machine_cores_busy", 0), med("machine_cores_busy", 1)],
    }


def per_added_host(runs: list[dict]) -> dict:
    """What each host added to a batch costs beyond the one-host batch (flat: 0), from the median over the runs of
    the first and the last batch: the overhead (wall - warm-up), the rollout's own (the engine's stop counted as
    engine time too: SGLang's drain takes 0-5 s, its 5 s watchdog) and the CPU by where it is spent."""
    first = [r["batch_timings"][0] for r in runs]
    last = [r["batch_timings"][-1] for r in runs]
    added = len(last[0]["hosts"]) - len(first[0]["hosts"])
    if added <= 0:
        return {}

    def slope(key: str) -> float:
        return round((statistics.median(t[key] for t in last) - statistics.median(t[key] for t in first)) / added, 2)

    cpu_keys = [k for k in (last[0].get("cpu_s") or {}) if k not in ("sampled_s", "machine_cores_busy")]
    return {
        "overhead_per_added_host_s": slope("overhead_s"),
        "own_overhead_per_added_host_s": slope("own_overhead_s"),
        "cpu_per_added_host_s": {
            k: round(
                (statistics.median(t["cpu_s"][k] for t in last) - statistics.median(t["cpu_s"][k] for t in first))
                / added,
                2,
            )
            for k in cpu_keys
            if all(k in (t.get("cpu_s") or {}) for t in first + last)
        },
    }


def real_rollouts(sizes: list[int], repeats: int) -> dict:
    """`repeats` rollouts of a flag change (chunked-prefill-size 4096, then back to 2048, ...) in batches `sizes`:
    the first one's details, every run's per-batch figures, the medians per batch, and the cost per added host from
    the medians (one run's slowest engine stop alone moves a batch's figures by seconds)."""
    runs = [real_rollout(sizes, 4096 if n % 2 == 0 else 2048) for n in range(repeats)]
    keys = ("wall_s", "engine_start_to_ready_s", "overhead_s", "engine_stop_s", "engine_s", "own_overhead_s")
    return {
        **runs[0],
        "serial": sizes,
        "repeats": repeats,
        "runs": [
            {
                "change": r["change"],
                "wall_s": r["wall_s"],
                "batches": [{"hosts": len(t["hosts"]), **{k: t[k] for k in keys}} for t in r["batch_timings"]],
            }
            for r in runs
        ],  # fmt: skip
        "median_by_batch": [
            {
                "hosts": len(runs[0]["batch_timings"][b]["hosts"]),
                **{k: round(statistics.median(r["batch_timings"][b][k] for r in runs), 3) for k in keys},
            }
            for b in range(len(sizes))
        ],  # fmt: skip
        **per_added_host(runs),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8, help="server hosts (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--rollout-repeats", type=int, default=3, help="real rollouts of a flag change (default %(default)s; 0: none)"
    )
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab up (inventory tmp/perf-fleet)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "fleet_rollout.json"))
    args = parser.parse_args(argv)
    if args.hosts < 2:
        parser.error("--hosts must be at least 2 (one host against many)")
    out: dict = {
        "command": "python benchmarks/suite/fleet_rollout.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": round(os.getloadavg()[0], 2)},
        "lab": {"server_hosts": args.hosts, "gateway_hosts": 1, "engine": "simulated (lab/sglang-sim)"},
    }
    subprocess.run(["make", "-s", "lab-wheelhouse", "router-wheelhouse"], cwd=ROOT, check=True, timeout=1800)
    lab("down")
    WORK.mkdir(parents=True, exist_ok=True)
    link = WORK / "group_vars"
    if not link.is_symlink():
        link.symlink_to(ROOT / "inventory/lab/group_vars")
    try:
        started = time.perf_counter()
        lab("up", "--hosts", str(args.hosts), "--routers", "1", "--inventory", str(WORK / "hosts.yml"))
        lab("cuda-mirror", "up")
        lab("testhub", "up")
        out["lab_up_with_equipment_s"] = round(time.perf_counter() - started, 2)
        first, _ = playbook("deploy.yml", extra={"sglang_server_serial": args.hosts})
        out["first_deploy_s"] = round(first, 2)
        one = f"{LAB}-01"
        out["noop_deploy"] = noop_pair("deploy.yml", one, "sglang_servers", args.repeats)
        # The default batches [1, "25%", "100%"] over 8 workers end with 5 at once: more than the default budget
        # (rollout_max_unavailable 50% = 4), so the default plan is refused before any change on 8 hosts. The
        # benchmark times the batches, so it lifts the budget (the last-healthy-worker guard stays).
        budget = {"rollout_max_unavailable": "100%"}
        out["noop_rollout"] = noop_pair("playbooks/rollout.yml", one, "sglang_servers", args.repeats, extra=budget)
        out["noop_rollout"]["extra_vars"] = budget
        if args.rollout_repeats > 0:
            out["rollout"] = real_rollouts(batches_for(args.hosts), args.rollout_repeats)
    finally:
        if not args.keep_lab:
            lab("down")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    nd, nr = out["noop_deploy"], out["noop_rollout"]
    print(f"no-op deploy.yml:  1 host {nd['one_host_s']['best']} s, {args.hosts} hosts {nd['many_hosts_s']['best']} s "
          f"({nd['many_over_one']}x; medians {nd['many_over_one_median']}x; goal 1.5x)")  # fmt: skip
    print(f"no-op rollout.yml: 1 host {nr['one_host_s']['best']} s, {args.hosts} hosts {nr['many_hosts_s']['best']} s "
          f"({nr['many_over_one']}x; medians {nr['many_over_one_median']}x)")  # fmt: skip
    if "rollout" not in out:  # --rollout-repeats 0
        return out
    sizes = out["rollout"]["serial"]
    print(f"rollout of a flag change in batches {sizes}: {out['rollout']['wall_s']} s (the first of "
          f"{out['rollout']['repeats']})")  # fmt: skip
    for t in out["rollout"]["batch_timings"]:
        print(f"  batch {t['batch']} ({len(t['hosts'])} hosts): wall {t['wall_s']} s = engine warm-up "
              f"{t['engine_start_to_ready_s']} s + rollout overhead {t['overhead_s']} s; engine stop + warm-up "
              f"{t['engine_s']} s (slowest stop {t['engine_stop_s']} s) + the rollout's own "
              f"{t['own_overhead_s']} s")  # fmt: skip
    for t in out["rollout"]["batch_timings"]:
        print(f"  batch {t['batch']} CPU in its window: {t.get('cpu_s')}")
    for t in out["rollout"]["median_by_batch"]:
        print(f"  median of {out['rollout']['repeats']} runs, batch of {t['hosts']}: overhead {t['overhead_s']} s, "
              f"the rollout's own {t['own_overhead_s']} s (slowest engine stop {t['engine_stop_s']} s)")  # fmt: skip
    if "overhead_per_added_host_s" in out["rollout"]:
        own = out["rollout"]["own_overhead_per_added_host_s"]
        print(f"  overhead per host added to a batch (medians): {out['rollout']['overhead_per_added_host_s']} s "
              f"(the rollout's own, engine stops apart: {own} s)")  # fmt: skip
        print(f"  CPU per host added to a batch: {out['rollout'].get('cpu_per_added_host_s')}")
    print(f"saved {args.output}")
    return out


if __name__ == "__main__":
    main()
