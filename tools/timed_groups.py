"""Run make targets in steps, stop after the first step that fails, and print each target's time at the end.

`make test` runs `python3 tools/timed_groups.py setup lab-prune lint+unit+lab-tests-1+lab-tests-2+molecule`.
A step is one target, or several joined by `+` that run at the same time (each writes its output to
`.cache/test-logs/<target>.log`; the whole log of each is printed when it ends, so pytest's and the Molecule
runner's closing lines stay readable and in one piece; while a target runs, `.cache/test-logs/<target>.running`
holds its PID, so another target of the step can see it). Targets of one step must not share a lab, and the
one `prune` runs before them (`lab-prune`). The lab tests and Molecule share a step (2026-12-01): Molecule runs
at nice 10 and 2 scenarios at a time while the lab tests run (tools/run_molecule.py --beside). A first attempt
(2026-11-30, 4 scenarios at full priority beside the lab tests, load average 15) lost a lab's test hub and ran
a scenario past its 600 s bound; the lab tool's prune then took a lab being brought up for a stale one (fixed:
`up` and `down` hold the lab folder's lock). Since 2026-12-01 the lab tests run as two halves in that step
(`lab-tests-1`, `lab-tests-2`; Molecule's --beside names both), and lint joined that step.
The last line is the summary, for example:

  make test: PASS  setup 2s, lint 41s, lab-prune 1s, unit 4m31s, lab-tests 6m50s, molecule 15m03s; total 17m07s

Standard library only (it runs before the project's virtual environment exists).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def fmt(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def run_alone(make: str, target: str) -> tuple[int, str]:
    started = time.monotonic()
    rc = subprocess.run([make, "--no-print-directory", target], check=False).returncode
    return rc, f"{target} {fmt(time.monotonic() - started)}{'' if rc == 0 else ' (FAILED)'}"


def running_marker(logs: Path, target: str) -> Path:
    """A file that exists while the target runs in a step (it holds the target's PID): a target of the same step
    can see which others still run (tools/run_molecule.py --beside)."""
    return logs / f"{target}.running"


def run_together(make: str, targets: list[str]) -> tuple[int, list[str]]:
    """Start every target at once; print each one's log as it ends; first failure decides rc."""
    logs = Path(".cache/test-logs")
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    running = {}
    for target in targets:
        log_path = logs / f"{target}.log"
        log = log_path.open("w")
        proc = subprocess.Popen(
            [make, "--no-print-directory", target], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        running_marker(logs, target).write_text(f"{proc.pid}\n")
        running[target] = (proc, log, log_path)
        print(f"[{target}] started (output: {log_path})", flush=True)
    times: dict[str, str] = {}
    rc = 0
    while running:
        for target, (proc, log, log_path) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            log.close()
            running_marker(logs, target).unlink(missing_ok=True)
            del running[target]
            took = fmt(time.monotonic() - started)
            print(f"\n===== {target}: {'ok' if code == 0 else f'FAILED (rc {code})'} after {took} =====", flush=True)
            sys.stdout.write(log_path.read_text(errors="replace"))
            print(f"===== end of {target} =====", flush=True)
            times[target] = f"{target} {took}{'' if code == 0 else ' (FAILED)'}"
            rc = rc or code
        time.sleep(1)
    return rc, [times[t] for t in targets]


def main(steps: list[str]) -> int:
    if not steps:
        print("usage: timed_groups.py TARGET|TARGET+TARGET... ...", file=sys.stderr)
        return 2
    make = os.environ.get("MAKE", "make")
    began = time.monotonic()
    times: list[str] = []
    rc = 0
    for index, step in enumerate(steps):
        targets = [t for t in step.split("+") if t]
        if len(targets) == 1:
            rc, line = run_alone(make, targets[0])
            times.append(line)
        else:
            rc, lines = run_together(make, targets)
            times.extend(lines)
        if rc != 0:
            skipped = steps[index + 1 :]
            if skipped:
                times.append(f"not run: {' '.join(skipped)}")
            break
    print(
        f"\nmake test: {'PASS' if rc == 0 else 'FAIL'}  {', '.join(times)}; total {fmt(time.monotonic() - began)}",
        flush=True,
    )
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
