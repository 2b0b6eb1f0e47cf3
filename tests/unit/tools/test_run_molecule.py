"""tools/run_molecule.py against a fake project: a fake `molecule` in <root>/.venv/bin plays the scenarios."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# The fake molecule: records its environment, then behaves as the scenario's name says.
#   meet-*  : waits (up to 20 s) until every meet-* scenario has started: passes only when they run at once
#   bad     : prints a marker and fails
FAKE_MOLECULE = """\
#!/usr/bin/env python3
import json, os, sys, time
from pathlib import Path
name = sys.argv[sys.argv.index("-s") + 1]
record = Path(os.environ["FAKE_RECORD"])
with record.open("a") as handle:
    handle.write(json.dumps({"name": name, "cwd": os.getcwd(),
        "ephemeral": os.environ["MOLECULE_EPHEMERAL_DIRECTORY"],
        "facts": os.environ["ANSIBLE_CACHE_PLUGIN_CONNECTION"]}) + "\\n")
print(f"fake molecule playing {name}", flush=True)
if name.startswith("meet-"):
    (record.parent / f"{name}.started").touch()
    deadline = time.monotonic() + 20
    while len(list(record.parent.glob("meet-*.started"))) < int(os.environ["FAKE_MEET"]):
        if time.monotonic() > deadline:
            print("the other scenarios never started beside me", flush=True)
            sys.exit(1)
        time.sleep(0.05)
if name == "bad":
    print("BAD-SCENARIO-DETAIL: converge failed on purpose", flush=True)
    print("fatal: [sglang-01]: FAILED! => the converge failed on purpose", flush=True)
    print("E   assert 'is no longer running' in out", flush=True)
    sys.exit(3)
"""


def load_runner(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "run_molecule.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A fake project root with the runner's paths pointed into it."""
    module = load_runner("run_molecule_under_test")
    root = tmp_path / "project"
    fake = root / ".venv" / "bin" / "molecule"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_MOLECULE)
    fake.chmod(0o755)
    monkeypatch.setattr(module, "ROOT", root)
    monkeypatch.setattr(module, "CACHE", root / ".cache")
    monkeypatch.setattr(module, "LOG_DIR", root / ".cache" / "molecule-logs")
    monkeypatch.setattr(module, "EPHEMERAL_ROOT", root / ".cache" / "molecule")
    monkeypatch.setattr(module, "DURATIONS_FILE", root / ".cache" / "molecule-durations.json")
    monkeypatch.setattr(module, "ESTIMATES_FILE", root / "estimates.json")
    monkeypatch.setattr(module, "TEST_LOGS", root / ".cache" / "test-logs")
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.jsonl"))
    # `make test` runs these unit tests beside the lab tests and exports MOLECULE_BESIDE=lab-tests: the runner
    # under test must not see the real project's markers nor that environment (CI failed on it once).
    for name in ("MOLECULE_JOBS", "MOLECULE_BESIDE", "MOLECULE_JOBS_BESIDE", "MOLECULE_NICE"):
        monkeypatch.delenv(name, raising=False)
    module.test_root = root
    module.record = tmp_path / "record.jsonl"
    return module


def add(root: Path, owner: str, name: str) -> None:
    base = root / ("molecule" if owner == "." else f"roles/{owner}/molecule") / name
    base.mkdir(parents=True)
    (base / "molecule.yml").write_text("---\nplatforms: []\n")


def played(module) -> list[dict]:
    return [json.loads(line) for line in module.record.read_text().splitlines()]


def beside_target(module, target: str, argv: list[str]) -> subprocess.Popen:
    """A make target of the same step, as tools/timed_groups.py marks it: its PID in <test logs>/<target>.running
    (here a stand-in process running argv)."""
    module.TEST_LOGS.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(argv)
    (module.TEST_LOGS / f"{target}.running").write_text(f"{proc.pid}\n")
    return proc


def test_scenarios_run_at_once(project, monkeypatch, capsys):
    for name in ("meet-a", "meet-b", "meet-c"):
        add(project.test_root, "role1", name)
    monkeypatch.setenv("FAKE_MEET", "3")
    assert project.main(["--jobs", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 Molecule scenarios, 3 at a time" in out
    assert out.rstrip().endswith("3 passed, 0 failed")


def test_jobs_from_the_environment(project, monkeypatch, capsys):
    for name in ("meet-a", "meet-b"):
        add(project.test_root, "role1", name)
    monkeypatch.setenv("FAKE_MEET", "2")
    monkeypatch.setenv("MOLECULE_JOBS", "2")
    assert project.main([]) == 0
    assert "2 at a time" in capsys.readouterr().out


def test_longest_first_unknown_before_known(project, capsys):
    for owner, name in ((".", "short"), ("role1", "long"), ("role2", "middle"), ("role2", "new")):
        add(project.test_root, owner, name)
    (project.test_root / "estimates.json").write_text(
        json.dumps({"molecule:short": 10, "roles/role1:long": 300, "roles/role2:middle": 90})
    )
    # A measurement on this machine beats the committed estimate.
    project.DURATIONS_FILE.parent.mkdir(parents=True)
    project.DURATIONS_FILE.write_text(json.dumps({"molecule:short": 500}))
    assert project.main(["-j", "1"]) == 0
    assert [p["name"] for p in played(project)] == ["new", "short", "long", "middle"]
    durations = json.loads(project.DURATIONS_FILE.read_text())
    assert set(durations) == {"molecule:short", "roles/role1:long", "roles/role2:middle", "roles/role2:new"}


def test_each_scenario_has_its_own_directory_fact_cache_and_log(project, capsys):
    add(project.test_root, ".", "default")
    add(project.test_root, "role1", "default")
    assert project.main(["-j", "2"]) == 0
    runs = {p["cwd"]: p for p in played(project)}
    assert set(runs) == {str(project.test_root), str(project.test_root / "roles" / "role1")}
    ephemerals = {p["ephemeral"] for p in runs.values()}
    facts = {p["facts"] for p in runs.values()}
    assert len(ephemerals) == 2 and len(facts) == 2
    assert all(e.startswith(str(project.test_root / ".cache" / "molecule")) for e in ephemerals)
    for slug in ("molecule-default", "roles-role1-default"):
        log = (project.LOG_DIR / f"{slug}.log").read_text()
        assert "fake molecule playing default" in log
    out = capsys.readouterr().out
    assert "start  molecule:default" in out and "PASS   roles/role1:default" in out


def test_a_failure_prints_its_whole_log_and_the_count(project, capsys):
    add(project.test_root, "role1", "bad")
    add(project.test_root, "role1", "good")
    assert project.main(["-j", "2"]) == 1
    out = capsys.readouterr().out
    assert "FAILED roles/role1:bad" in out
    assert "BAD-SCENARIO-DETAIL: converge failed on purpose" in out
    assert "fake molecule playing good" not in out  # passing logs stay in their files
    summary = out[out.index("Molecule scenarios (") :]
    assert "FAIL  roles/role1:bad" in summary and "PASS  roles/role1:good" in summary
    # the lines that say why come again after the table (a CI log is read from its tail)
    why = summary[summary.index("why roles/role1:bad failed") :]
    assert "    fatal: [sglang-01]: FAILED! => the converge failed on purpose" in why
    assert "    E   assert 'is no longer running' in out" in why
    assert "BAD-SCENARIO-DETAIL" not in why
    assert out.rstrip().endswith("1 passed, 1 failed")
    # Failed runs do not overwrite the last good duration.
    assert "roles/role1:bad" not in json.loads(project.DURATIONS_FILE.read_text())


def test_unknown_scenario_is_refused(project, capsys):
    add(project.test_root, "role1", "default")
    assert project.main(["roles/role1:nope"]) == 2
    assert "unknown scenarios: roles/role1:nope" in capsys.readouterr().err


def test_committed_estimates_name_existing_scenarios():
    """tools/molecule_durations.json orders CI's first run: it must not name scenarios that are gone."""
    estimates = json.loads((REPO / "tools" / "molecule_durations.json").read_text())
    labels = {s.label for s in load_runner("run_molecule_real").discover()}
    assert set(estimates) <= labels, sorted(set(estimates) - labels)


def test_default_jobs_for_two_cores(project, monkeypatch):
    monkeypatch.setattr(project.os, "cpu_count", lambda: 2)
    assert project.default_jobs() == 4


def test_beside_the_lab_tests_fewer_scenarios_run_until_they_end(project, monkeypatch, capsys):
    """make test runs the lab tests and Molecule in one step: while lab-tests runs (its marker names a live
    process), at most --jobs-beside scenarios run; when it ends, --jobs do."""
    lab_tests = beside_target(project, "lab-tests", ["sleep", "3"])
    for name in ("meet-a", "meet-b", "meet-c"):
        add(project.test_root, "role1", name)
    monkeypatch.setenv("FAKE_MEET", "3")  # each passes only once all three run at once
    try:
        assert project.main(["--jobs", "3", "--beside", "lab-tests", "--jobs-beside", "1"]) == 0
    finally:
        lab_tests.wait()
    ended = time.time()
    out = capsys.readouterr().out
    assert "3 at a time (1 at a time while lab-tests runs)" in out
    assert out.count("(lab-tests still running: 1 at a time)") == 2
    starts = sorted(p.stat().st_mtime for p in project.record.parent.glob("meet-*.started"))
    assert starts[1] - starts[0] >= 2.0 and starts[2] <= ended  # the 2nd and 3rd waited for the lab tests


def test_each_beside_target_that_ends_frees_one_more_slot(project, monkeypatch, capsys):
    """make test runs two halves of the lab tests beside Molecule: when the first half ends, one more scenario
    may start; the last one waits for the second half."""
    started = time.time()
    long = beside_target(project, "lab-tests-1", ["sleep", "7"])
    short = beside_target(project, "lab-tests-2", ["sleep", "2"])
    for name in ("meet-a", "meet-b", "meet-c"):
        add(project.test_root, "role1", name)
    monkeypatch.setenv("FAKE_MEET", "3")
    try:
        assert project.main(["--jobs", "3", "--beside", "lab-tests-1,lab-tests-2", "--jobs-beside", "1"]) == 0
    finally:
        short.wait()
        long.wait()
    starts = sorted(p.stat().st_mtime - started for p in project.record.parent.glob("meet-*.started"))
    assert starts[0] < 2 <= starts[1] < 7 <= starts[2], starts  # one, one more after the short half, the last
    assert "(lab-tests-1, lab-tests-2 still running: 1 at a time)" in capsys.readouterr().out


def test_scenarios_start_in_their_order_when_a_slot_frees(project, capsys):
    """A thread whose scenario ended takes the next one from the pool at once; the earlier scenario another thread
    holds (polling every 2 s) must still start first (CI's e2e_pipeline started eighth instead of third)."""
    lab_tests = beside_target(project, "lab-tests", ["sleep", "5"])
    for name in ("first", "second", "third"):
        add(project.test_root, "role1", name)
    (project.test_root / "estimates.json").write_text(
        json.dumps({"roles/role1:first": 300, "roles/role1:second": 200, "roles/role1:third": 100})
    )
    try:
        assert project.main(["--jobs", "2", "--beside", "lab-tests", "--jobs-beside", "1"]) == 0
    finally:
        lab_tests.wait()
    assert [p["name"] for p in played(project)] == ["first", "second", "third"]


def test_a_marker_of_a_gone_process_does_not_hold_scenarios_back(project, monkeypatch, capsys):
    beside_target(project, "lab-tests", ["true"]).wait()  # its marker left by a killed make test
    for name in ("meet-a", "meet-b"):
        add(project.test_root, "role1", name)
    monkeypatch.setenv("FAKE_MEET", "2")
    assert project.main(["--jobs", "2", "--beside", "lab-tests", "--jobs-beside", "1"]) == 0
    assert "still running" not in capsys.readouterr().out


# A failed verify's log as CI printed it (2026-12-03), shortened: debug tasks' msg lines of a converge that passed,
# Molecule's noise, then the verifier's assertion at the end.
FAILED_VERIFY_LOG = """\
[ 0m05s] CRITICAL 'molecule/default/molecule.yml' glob failed.  Exiting.
[ 1m10s] TASK [gpufleet.fleet.preflight : Report the GPUs] ****
[ 1m10s] ok: [e2e-01] =>
[ 1m10s]     msg: 8 x NVIDIA RTX PRO 6000 Blackwell Server Edition (sm_120), driver 570.172.08,
[ 2m00s] TASK [gpufleet.fleet.sglang_server : Wait for readiness] ****
[ 2m00s] fatal: [e2e-01]: FAILED! => changed=false
[ 2m00s]   msg: 'e2e-01: not ready after 60 s'
[ 2m00s] ...ignoring
[ 2m01s] TASK [gpufleet.fleet.sglang_server : Report] ****
[ 2m01s] ok: [e2e-01] =>
[ 2m01s]     msg: restart e2e-01 in batches of 1
[ 9m00s] E   AssertionError: e2e-01: converged, proven in place by a generation
[ 9m00s] FAILED tests/test_e2e_pipeline.py::test_a_second_deploy - AssertionError
[ 9m13s] ERROR    Verifier tests failed
"""


def test_why_a_verify_failed_names_the_assertion_first_and_no_successful_task_message(project):
    why = project.why_failed(FAILED_VERIFY_LOG)
    assert why[:2] == [
        "E   AssertionError: e2e-01: converged, proven in place by a generation",
        "FAILED tests/test_e2e_pipeline.py::test_a_second_deploy - AssertionError",
    ]
    assert why[2:4] == ["fatal: [e2e-01]: FAILED! => changed=false", "  msg: 'e2e-01: not ready after 60 s'"]
    assert why[4:] == [
        "CRITICAL 'molecule/default/molecule.yml' glob failed.  Exiting.",
        "ERROR    Verifier tests failed",
    ]
