"""Run make targets one after another, stop at the first that fails, and print each one's time at the end.

`make test` runs `python3 tools/timed_groups.py setup lint unit lab-tests molecule`. Each group's output goes
straight to the console (pytest's and the Molecule runner's closing lines stay where CI looks for them); the
last line is the summary, for example:

  make test: PASS  setup 2s, lint 41s, unit 2m31s, lab-tests 1m50s, molecule 12m03s; total 17m07s

Standard library only (it runs before the project's virtual environment exists).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def fmt(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def main(groups: list[str]) -> int:
    if not groups:
        print("usage: timed_groups.py TARGET...", file=sys.stderr)
        return 2
    make = os.environ.get("MAKE", "make")
    began = time.monotonic()
    times: list[str] = []
    rc = 0
    for group in groups:
        started = time.monotonic()
        rc = subprocess.run([make, "--no-print-directory", group], check=False).returncode
        times.append(f"{group} {fmt(time.monotonic() - started)}{'' if rc == 0 else ' (FAILED)'}")
        if rc != 0:
            skipped = groups[len(times) :]
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
