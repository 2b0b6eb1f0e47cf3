"""tools/timed_groups.py (what `make test` runs): groups in order, stop at the first failure, times at the end."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TIMED = REPO / "tools" / "timed_groups.py"


def test_timed_groups_stop_at_the_first_failure(tmp_path):
    (tmp_path / "Makefile").write_text(
        textwrap.dedent(
            """\
            one:
            \t@echo ONE-RAN
            two:
            \t@echo TWO-RAN; exit 4
            three:
            \t@echo THREE-RAN
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(TIMED), "one", "two", "three"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0
    assert "ONE-RAN" in proc.stdout and "TWO-RAN" in proc.stdout and "THREE-RAN" not in proc.stdout
    last = proc.stdout.rstrip().splitlines()[-1]
    assert last.startswith("make test: FAIL  one ")
    assert "two " in last and "(FAILED)" in last and "not run: three" in last and "; total " in last


def test_timed_groups_summary_after_all_output(tmp_path):
    (tmp_path / "Makefile").write_text("a:\n\t@echo '1 passed in 0.01s'\nb:\n\t@echo '2 passed, 0 failed'\n")
    proc = subprocess.run(
        [sys.executable, str(TIMED), "a", "b"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0
    lines = proc.stdout.rstrip().splitlines()
    assert lines[0] == "1 passed in 0.01s" and lines[1] == "2 passed, 0 failed"
    assert lines[-1].startswith("make test: PASS  a ") and ", b " in lines[-1]


def test_timed_groups_step_of_targets_run_together(tmp_path):
    # a and b each wait for the other's mark: they only both finish when they run at the same time.
    (tmp_path / "Makefile").write_text(
        "a:\n\t@touch a.mark; for i in $$(seq 50); do [ -e b.mark ] && break; sleep 0.1; done; "
        "[ -e b.mark ] && echo A-SAW-B\n"
        "b:\n\t@touch b.mark; for i in $$(seq 50); do [ -e a.mark ] && break; sleep 0.1; done; "
        "[ -e a.mark ] && echo B-SAW-A; exit 3\n"
        "c:\n\t@echo C-RAN\n"
    )
    proc = subprocess.run(
        [sys.executable, str(TIMED), "a+b", "c"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0
    assert "A-SAW-B" in proc.stdout and "B-SAW-A" in proc.stdout and "C-RAN" not in proc.stdout
    assert "===== b: FAILED (rc 2)" in proc.stdout  # make answers 2 when a recipe fails
    last = proc.stdout.rstrip().splitlines()[-1]
    assert last.startswith("make test: FAIL  a ") and "b " in last and "(FAILED)" in last and "not run: c" in last
    assert (tmp_path / ".cache/test-logs/a.log").read_text().strip() == "A-SAW-B"


def test_each_target_of_a_step_has_a_running_marker_until_it_ends(tmp_path):
    # tools/run_molecule.py --beside reads these markers: a sees b's marker (b's PID) while b runs; none is left.
    (tmp_path / "Makefile").write_text(
        "a:\n\t@for i in $$(seq 50); do [ -e .cache/test-logs/b.running ] && break; sleep 0.1; done; "
        "cat .cache/test-logs/b.running; touch a.done\n"
        "b:\n\t@for i in $$(seq 50); do [ -e a.done ] && break; sleep 0.1; done\n"
    )
    proc = subprocess.run(
        [sys.executable, str(TIMED), "a+b"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout
    assert (tmp_path / ".cache/test-logs/a.log").read_text().strip().isdigit()
    assert list((tmp_path / ".cache/test-logs").glob("*.running")) == []
