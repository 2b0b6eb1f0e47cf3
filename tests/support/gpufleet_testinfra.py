"""Helpers shared by the testinfra suites of gpufleet's Molecule scenarios.

* Service checks include the unit's journal in their failure message, so a red test says why.
* ``run_playbook`` runs a playbook with ``ansible-playbook`` against the scenario's own inventory (the
  Molecule lab hosts), capturing everything it prints, so a test can assert on a refusal's message,
  on the PLAY RECAP and on what changed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
import testinfra

ROOT = Path(os.environ.get("GPUFLEET_ROOT") or Path(__file__).resolve().parents[2])


def journal(host, unit: str, lines: int = 60) -> str:
    return host.run(f"journalctl -u {unit} -n {lines} --no-pager -o short-precise").stdout


def assert_unit_active(host, unit: str) -> None:
    service = host.service(unit)
    if not service.is_running:
        state = host.run(f"systemctl status {unit} --no-pager").stdout
        pytest.fail(
            f"{unit} is not running on {host.backend.get_hostname()}\n{state}\n"
            f"--- journalctl -u {unit} ---\n{journal(host, unit)}"
        )


@pytest.fixture(scope="module")
def host_by_name():
    """Open a testinfra host for another instance of the same Molecule inventory."""
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]

    def _get(name: str):
        return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")

    return _get


def playbook_env(env: dict | None = None, config: str | Path | None = None) -> dict:
    """The environment ``run_playbook`` gives ``ansible-playbook`` (for a caller that starts it itself)."""
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(config or ROOT / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
        ANSIBLE_HOST_KEY_CHECKING="False",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CALLBACK_RESULT_FORMAT="yaml",
        **(env or {}),
    )


def run_playbook(
    playbook: str | Path,
    *args: str,
    extra_vars: dict | None = None,
    inventory: str | Path | None = None,
    config: str | Path | None = None,
    cwd: str | Path | None = None,
    env: dict | None = None,
    log_dir: str | Path | None = None,
    timeout: int = 600,
) -> subprocess.CompletedProcess:
    """``ansible-playbook -i INVENTORY [-e @vars.json] ARGS PLAYBOOK`` against the scenario's hosts.

    playbook: a path (relative to ``cwd``, by default the project root). inventory: default the Molecule
    inventory file of the running scenario. config: the ansible.cfg to use (default the project's).
    extra_vars: passed as a JSON file (so values keep their types). log_dir: where to keep the command and
    its whole output (``run-<playbook>-<n>.log``) for the person reading a failed run. Never raises on a
    non-zero exit: the caller asserts on ``returncode``, ``stdout`` and ``stderr``.
    """
    full_env = playbook_env(env, config)
    argv = ["ansible-playbook", "-i", str(inventory or os.environ["MOLECULE_INVENTORY_FILE"])]
    vars_file = None
    if extra_vars:
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=log_dir, delete=False) as fh:
            json.dump(extra_vars, fh)
            vars_file = fh.name
        argv += ["-e", f"@{vars_file}"]
    argv += [*args, str(playbook)]
    try:
        proc = subprocess.run(
            argv, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
        )
    finally:
        if vars_file:
            os.unlink(vars_file)
    if log_dir:
        log_dir = Path(log_dir)
        log = log_dir / f"run-{Path(playbook).stem}-{len(list(log_dir.glob('run-*.log')))}.log"
        log.write_text(" ".join(shlex.quote(a) for a in argv) + "\n" + json.dumps(extra_vars or {}) + "\n"
                       + proc.stdout + proc.stderr)  # fmt: skip
    return proc


def recap(output: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP counters per host (the last line seen for each host)."""
    found = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        found[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return found


def changed_tasks(output: str) -> list[str]:
    """Names of the tasks that reported a change (for failure messages)."""
    found, task = [], None
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line[6 : line.rfind("]")]
        elif line.startswith("changed: [") and task not in found:
            found.append(task)
    return found
