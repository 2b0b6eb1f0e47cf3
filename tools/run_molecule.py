"""Run Molecule scenarios: every one in the project (default) or those named.

Scenarios live in molecule/<name>/ (project-wide) and roles/<role>/molecule/<name>/ (per role).
Each runs `molecule test` from its owner directory; all run even when one fails, then a summary
is printed and the exit status is non-zero if any failed.

  python tools/run_molecule.py                       # every scenario
  python tools/run_molecule.py roles/ml_env:default  # one role scenario
  python tools/run_molecule.py molecule:lab_harness  # one project scenario
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def discover() -> list[tuple[Path, str]]:
    found = [(ROOT, p.parent.name) for p in sorted(ROOT.glob("molecule/*/molecule.yml"))]
    found += [(p.parents[2], p.parent.name) for p in sorted(ROOT.glob("roles/*/molecule/*/molecule.yml"))]
    return found


def label(owner: Path, scenario: str) -> str:
    rel = owner.relative_to(ROOT)
    return f"{'molecule' if rel == Path('.') else rel}:{scenario}"


def main(argv: list[str]) -> int:
    scenarios = discover()
    if argv:
        wanted = set(argv)
        scenarios = [s for s in scenarios if label(*s) in wanted]
        unknown = wanted - {label(*s) for s in scenarios}
        if unknown:
            print(
                f"unknown scenarios: {', '.join(sorted(unknown))}; known: {', '.join(label(*s) for s in discover())}",
                file=sys.stderr,
            )
            return 2
    env = dict(
        os.environ,
        GPUFLEET_ROOT=str(ROOT),
        PYTHONPATH=str(ROOT / "lab"),
        HF_HUB_OFFLINE="1",
        ANSIBLE_FORCE_COLOR="0",
        PY_COLORS="0",
    )
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    results = []
    for owner, scenario in scenarios:
        name = label(owner, scenario)
        print(f"=== molecule test {name}", flush=True)
        started = time.monotonic()
        rc = subprocess.run(["molecule", "test", "-s", scenario], cwd=owner, env=env, check=False).returncode
        results.append((name, rc, time.monotonic() - started))
    print("\nMolecule scenarios:")
    for name, rc, seconds in results:
        print(f"  {'PASS' if rc == 0 else 'FAIL'}  {name}  ({seconds:.0f} s)")
    failed = sum(1 for _, rc, _ in results if rc != 0)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
