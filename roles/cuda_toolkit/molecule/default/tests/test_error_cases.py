"""Refusals and check mode, driven through ansible-playbook against the scenario's hosts.

error_cases.yml runs the role with bad input (unknown method, malformed version, wheels for 12.x,
unsupported distribution, ...), a wrong signing key, a runfile with a wrong checksum and an old
driver; each case asserts the role's message and that nothing changed. Then converge.yml runs in
check mode on the converged host and must report no change.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet_testinfra import recap, run_playbook

SCENARIO = Path(__file__).resolve().parents[1]


def ansible_playbook(*args: str):
    return run_playbook(args[-1], *args[:-1], cwd=SCENARIO, env={"ANSIBLE_GATHERING": "implicit"})


def test_error_cases_are_refused_clearly():
    proc = ansible_playbook("error_cases.yml")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    result = recap(proc.stdout)
    assert result["cuda-host"]["failed"] == 0 and result["cuda-host"]["rescued"] >= 8
    assert result["old-driver-host"]["rescued"] == 1


def test_check_mode_on_the_converged_host_changes_nothing():
    proc = ansible_playbook("--check", "converge.yml")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert recap(proc.stdout)["cuda-host"]["changed"] == 0, proc.stdout[-6000:]
