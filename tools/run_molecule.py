"""Run Molecule scenarios in parallel: every one in the project (default) or those named.

Scenarios live in molecule/<name>/ (project-wide) and roles/<role>/molecule/<name>/ (per role). Each runs
`molecule test` from its owner directory, in a pool of MOLECULE_JOBS workers (default: see default_jobs),
longest first (last measured durations, else the committed estimates in tools/molecule_durations.json).
Each scenario's whole output goes to .cache/molecule-logs/<scenario>.log; the console gets one line per
start and finish. All run even when one fails; at the end the full log of every failed scenario is
printed, then the summary (each scenario's time), the lines of each failed log that say why, and
`N passed, N failed`; the exit status is non-zero
if any failed.

What keeps parallel scenarios apart: each has its own lab (molecule/shared/create.yml names it from
MOLECULE_EPHEMERAL_DIRECTORY; the lab tool gives each lab its own bridge, /24 and NAT rules) and this
runner gives each its own ephemeral directory under this checkout (so two checkouts on one machine never
share a lab) and its own Ansible fact cache (host names such as sglang-01 repeat across scenarios).

  python tools/run_molecule.py                       # every scenario
  python tools/run_molecule.py roles/ml_env:default  # one role scenario
  python tools/run_molecule.py molecule:lab_harness  # one project scenario
  python tools/run_molecule.py -j 1                  # one after another (or MOLECULE_JOBS=1)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"
LOG_DIR = CACHE / "molecule-logs"
EPHEMERAL_ROOT = CACHE / "molecule"
DURATIONS_FILE = CACHE / "molecule-durations.json"
ESTIMATES_FILE = Path(__file__).with_name("molecule_durations.json")


@dataclass
class Scenario:
    owner: Path
    name: str

    @property
    def label(self) -> str:
        rel = self.owner.relative_to(ROOT)
        return f"{'molecule' if rel == Path('.') else rel}:{self.name}"

    @property
    def slug(self) -> str:
        """The label as one file name: roles/ml_env:default -> roles-ml_env-default."""
        return self.label.replace("/", "-").replace(":", "-")


@dataclass
class Result:
    scenario: Scenario
    rc: int | None  # None: not run (the runner was interrupted first)
    seconds: float
    log: Path


def discover() -> list[Scenario]:
    found = [Scenario(ROOT, p.parent.name) for p in sorted(ROOT.glob("molecule/*/molecule.yml"))]
    found += [Scenario(p.parents[2], p.parent.name) for p in sorted(ROOT.glob("roles/*/molecule/*/molecule.yml"))]
    return found


def default_jobs() -> int:
    """Scenarios mostly wait (host boots, engine start-up, ssh round trips): two per core, at most 6."""
    return max(1, min(6, 2 * (os.cpu_count() or 1)))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def ordered(scenarios: list[Scenario]) -> list[Scenario]:
    """Longest first (last measured time on this machine, else the committed estimate); unknown ones first."""
    known = {**_read_json(ESTIMATES_FILE), **_read_json(DURATIONS_FILE)}
    return sorted(scenarios, key=lambda s: -known.get(s.label, float("inf")))


def record_durations(results: list[Result]) -> None:
    durations = _read_json(DURATIONS_FILE)
    durations.update({r.scenario.label: round(r.seconds) for r in results if r.rc == 0})
    DURATIONS_FILE.parent.mkdir(parents=True, exist_ok=True)
    tmp = DURATIONS_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(durations, indent=2, sort_keys=True) + "\n")
    tmp.replace(DURATIONS_FILE)


def scenario_env(scenario: Scenario) -> dict[str, str]:
    ephemeral = EPHEMERAL_ROOT / scenario.slug
    env = dict(
        os.environ,
        GPUFLEET_ROOT=str(ROOT),
        PYTHONPATH=str(ROOT / "lab"),
        HF_HUB_OFFLINE="1",
        ANSIBLE_FORCE_COLOR="0",
        PY_COLORS="0",
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
        # Molecule's working directory (and so the lab's name) belongs to this checkout and scenario.
        MOLECULE_EPHEMERAL_DIRECTORY=str(ephemeral),
        # The project's ansible.cfg caches facts in .cache/facts by host name; scenarios share host names.
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(ephemeral / "facts"),
    )
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    return env


# Lines of a scenario's log that say why it failed, in this order: pytest's (the verifier's assertion and its
# summary), Ansible's failures with their messages, Molecule's errors. A `msg:` line counts only inside a failure's
# block: successful debug tasks print msg lines too, and they filled the summary of a failed verify once (CI,
# 2026-12-03) while the assertion that failed was not shown.
PYTEST_PREFIXES = ("E   ", "FAILED ")
ANSIBLE_FAILURE_PREFIXES = ("fatal: [", "failed: [")
MOLECULE_PREFIXES = ("CRITICAL ", "ERROR ")
BLOCK_ENDS = ("TASK [", "PLAY [", "RUNNING HANDLER [", "PLAY RECAP", "ok: [", "changed: [", "skipping: [")
WHY_LINES = 12


def why_failed(text: str) -> list[str]:
    """The lines of a failed scenario's log that say why (time stamps stripped), at most WHY_LINES."""
    pytest_lines: list[str] = []
    ansible_lines: list[str] = []
    molecule_lines: list[str] = []
    in_failure = False
    for line in text.splitlines():
        body = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
        if body.startswith(PYTEST_PREFIXES):
            pytest_lines.append(body[:300])
        elif body.startswith(ANSIBLE_FAILURE_PREFIXES):
            ansible_lines.append(body[:300])
            in_failure = True
        elif body.startswith(BLOCK_ENDS):
            in_failure = False
        elif in_failure and body.lstrip().startswith("msg:"):
            ansible_lines.append(body[:300])
        elif body.startswith(MOLECULE_PREFIXES):
            molecule_lines.append(body[:300])
    return (pytest_lines + ansible_lines + molecule_lines)[:WHY_LINES]


def fmt(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


TEST_LOGS = CACHE / "test-logs"


def pid_alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie, ended but not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def still_running(targets: list[str]) -> list[str]:
    """The targets of the same `make test` step that still run: their marker (tools/timed_groups.py) exists and
    names a live process."""
    alive = []
    for target in targets:
        try:
            pid = int((TEST_LOGS / f"{target}.running").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if pid_alive(pid):
            alive.append(target)
    return alive


class Runner:
    def __init__(self, scenarios: list[Scenario], jobs: int, beside: list[str] | None = None, jobs_beside: int = 0):
        self.scenarios = scenarios
        self.jobs = jobs
        # While targets named in beside run in the same make test step (the lab tests), at most jobs_beside
        # scenarios run at once, one more for each of them that has ended; when none runs, jobs run at once.
        self.beside = beside or []
        self.jobs_beside = jobs_beside or jobs
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.running: dict[str, subprocess.Popen] = {}
        self.starting = 0
        # scenarios start in their order (longest first): a thread whose scenario ended takes the next one from the
        # pool and must not start it before the earlier ones that other threads are waiting with
        self.position = {s.label: i for i, s in enumerate(scenarios)}
        self.admitted = 0
        self.done = 0
        self.stopping = False

    def _take_slot(self, scenario: Scenario) -> None:
        """Wait until a scenario may start: after every scenario before it, and while targets of beside run, fewer than
        jobs_beside plus one for each target of beside that has ended (the half of the lab tests that ends first
        frees its CPU for a scenario)."""
        waited = False
        while True:
            busy = still_running(self.beside) if self.beside and self.jobs_beside < self.jobs else []
            allowed = min(self.jobs, self.jobs_beside + len(self.beside) - len(busy))
            with self.lock:
                turn = self.position[scenario.label] == self.admitted
                if turn and (not busy or self.starting < allowed or self.stopping):
                    self.starting += 1
                    self.admitted += 1
                    break
            if not waited and busy:
                self.say(f"wait   {scenario.label}  ({', '.join(busy)} still running: {self.jobs_beside} at a time)")
                waited = True
            time.sleep(2 if turn else 0.2)

    def stop(self, signum: int, _frame) -> None:
        """SIGINT/SIGTERM: start nothing more, pass the signal on to the running scenarios."""
        self.stopping = True
        with self.lock:
            procs = list(self.running.values())
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def say(self, text: str) -> None:
        with self.lock:
            print(f"[{fmt(time.monotonic() - self.started):>6}] {text}", flush=True)

    def run_one(self, scenario: Scenario) -> Result:
        log = LOG_DIR / f"{scenario.slug}.log"
        self._take_slot(scenario)
        try:
            return self._run_one(scenario, log)
        finally:
            with self.lock:
                self.starting -= 1

    def _run_one(self, scenario: Scenario, log: Path) -> Result:
        if self.stopping:
            log.write_text("not run: the runner was interrupted\n")
            return Result(scenario, None, 0.0, log)
        self.say(f"start  {scenario.label}  (log {log.relative_to(ROOT)})")
        began = time.monotonic()
        with log.open("w") as handle:
            handle.write(f"$ cd {scenario.owner} && molecule test -s {scenario.name}\n")
            with subprocess.Popen(
                ["molecule", "test", "-s", scenario.name],
                cwd=scenario.owner,
                env=scenario_env(scenario),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            ) as proc:
                with self.lock:
                    self.running[scenario.label] = proc
                # Each line stamped with the time since the scenario began: the phases' costs can be read off.
                for line in proc.stdout:
                    handle.write(f"[{fmt(time.monotonic() - began):>6}] {line}")
                    handle.flush()
            rc = proc.returncode
        seconds = time.monotonic() - began
        with self.lock:
            self.running.pop(scenario.label)
            self.done += 1
            done, running = self.done, len(self.running)
        self.say(
            f"{'PASS' if rc == 0 else 'FAIL'}   {scenario.label}  {fmt(seconds)}"
            f"  [{done}/{len(self.scenarios)} done, {running} running]"
        )
        return Result(scenario, rc, seconds, log)

    def run(self) -> list[Result]:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        beside = (
            f" ({self.jobs_beside} at a time while {', '.join(self.beside)} runs)"
            if self.beside and self.jobs_beside < self.jobs
            else ""
        )
        self.say(f"{len(self.scenarios)} Molecule scenarios, {self.jobs} at a time{beside}, longest first")
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                return list(pool.map(self.run_one, self.scenarios))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*", help="labels such as roles/ml_env:default (default: all)")
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=int(os.environ.get("MOLECULE_JOBS") or default_jobs()),
        help="scenarios run at once (env MOLECULE_JOBS; default %(default)s on this machine)",
    )
    parser.add_argument(
        "--beside",
        default=os.environ.get("MOLECULE_BESIDE", ""),
        help="make targets of the same `make test` step (e.g. lab-tests): while one runs, at most --jobs-beside "
        "scenarios run at once (env MOLECULE_BESIDE)",
    )
    parser.add_argument(
        "--jobs-beside",
        type=int,
        default=int(os.environ.get("MOLECULE_JOBS_BESIDE") or 2),
        help="scenarios at once while a --beside target runs (env MOLECULE_JOBS_BESIDE; default %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.jobs_beside < 1:
        parser.error("--jobs and --jobs-beside must be at least 1")
    scenarios = discover()
    if args.scenarios:
        wanted = set(args.scenarios)
        scenarios = [s for s in scenarios if s.label in wanted]
        unknown = wanted - {s.label for s in scenarios}
        if unknown:
            print(
                f"unknown scenarios: {', '.join(sorted(unknown))}; known: {', '.join(s.label for s in discover())}",
                file=sys.stderr,
            )
            return 2
    if not scenarios:
        print("no Molecule scenarios found", file=sys.stderr)
        return 1
    beside = [t for t in args.beside.split(",") if t]
    runner = Runner(ordered(scenarios), min(args.jobs, len(scenarios)), beside, min(args.jobs_beside, args.jobs))
    results = runner.run()
    wall = time.monotonic() - runner.started
    record_durations(results)
    failed = [r for r in results if r.rc != 0]
    for result in (r for r in failed if r.rc is not None):
        print(f"\n{'=' * 30} FAILED {result.scenario.label}: {result.log.relative_to(ROOT)} {'=' * 30}")
        print(result.log.read_text(errors="replace"), end="", flush=True)
        print(f"{'=' * 30} end of {result.scenario.label} {'=' * 30}")
    print(f"\nMolecule scenarios ({runner.jobs} at a time, wall time {fmt(wall)}):")
    for result in sorted(results, key=lambda r: -r.seconds):
        verdict = "PASS" if result.rc == 0 else "SKIP" if result.rc is None else "FAIL"
        print(f"  {verdict}  {result.scenario.label:<45} {fmt(result.seconds):>7}")
    # Why each failed, again at the very end: a CI log is often read from its tail only.
    for result in (r for r in failed if r.rc is not None):
        print(f"why {result.scenario.label} failed (first lines; whole log above):")
        for line in why_failed(result.log.read_text(errors="replace")) or ["(no failure line found in the log)"]:
            print(f"    {line}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    if runner.stopping:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
