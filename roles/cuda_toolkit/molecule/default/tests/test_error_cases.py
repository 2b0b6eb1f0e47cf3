"""Refusals and check mode, driven through ansible-playbook against the scenario's hosts.

error_cases.yml runs the role with bad input (unknown method, malformed version, wheels for 12.x,
unsupported distribution, ...), a wrong signing key, a runfile with a wrong checksum and an old
driver; each case asserts the role's message and that nothing changed. Then converge.yml runs in
check mode on the converged host and must report no change.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SCENARIO = Path(__file__).resolve().parents[1]
ROOT = SCENARIO.parents[3]


def ansible_playbook(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
        ANSIBLE_HOST_KEY_CHECKING="False",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_GATHERING="implicit",
    )
    return subprocess.run(
        ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], *args],
        cwd=SCENARIO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def recap(output: str) -> dict[str, dict[str, int]]:
    found = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        found[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return found


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
