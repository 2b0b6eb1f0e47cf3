"""A lab host's systemd kills whole control groups, as on a real VM (KillMode=control-group and mixed).

Both hosts run the same units at the same time, as a fleet deploy does (two sglang.service): before each
host had its own cgroup subtree they shared one cgroup per unit name, and `systemctl stop` on one host
logged "Failed to kill control group ... Input/output error" and left the unit's other processes running.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LAB_ENV, cgroup_mounts, lab, lab_json

NAME = "t-cgroup"
HOSTS = [f"{NAME}-01", f"{NAME}-02"]
STATE_ROOT = Path("/var/lib/gpufleet-lab")

# The unit's main process starts a child and waits; both write every SIGTERM they get to /run/<unit>/.
# The child traps SIGTERM and keeps running, like a process that does not stop when asked.
MAIN = """#!/bin/bash
dir=/run/$1
mkdir -p "$dir"
/usr/local/bin/cgtest-child "$dir" &
trap 'echo TERM >> "$dir/main.signals"; exit 0' TERM
while :; do sleep 0.1; done
"""
CHILD = """#!/bin/bash
trap 'echo TERM >> "$1/child.signals"' TERM
echo $$ > "$1/child.pid"
while :; do sleep 0.1; done
"""
UNIT = """[Unit]
Description=gpufleet lab test unit (KillMode={mode})

[Service]
ExecStart=/usr/local/bin/cgtest-main %N
KillMode={mode}
TimeoutStopSec=2
"""
UNITS = {"cgtest-cg": "control-group", "cgtest-mixed": "mixed"}


def sh(host: str, script: str, check: bool = True) -> subprocess.CompletedProcess:
    """A shell command inside a lab host (nsenter), as `python -m gpufleet_lab exec` runs it."""
    return lab("--name", NAME, "exec", host, "--", "bash", "-c", script, check=check)


def put(host: str, path: str, text: str, mode: str = "0644") -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", "--name", NAME, "exec", host, "--", "bash", "-c",
         f"cat > {path} && chmod {mode} {path}"],
        input=text, capture_output=True, text=True, env=LAB_ENV, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def hosts():
    lab_json("--name", NAME, "up", "--hosts", str(len(HOSTS)))
    for host in HOSTS:
        put(host, "/usr/local/bin/cgtest-main", MAIN, "0755")
        put(host, "/usr/local/bin/cgtest-child", CHILD, "0755")
        for unit, mode in UNITS.items():
            put(host, f"/etc/systemd/system/{unit}.service", UNIT.format(mode=mode))
        sh(host, "systemctl daemon-reload")
    yield HOSTS
    lab("--name", NAME, "down", check=False)


def start_everywhere(unit: str) -> dict[str, int]:
    """Start unit on every host; the child PID of each (as that host sees it)."""
    pids = {}
    for host in HOSTS:
        sh(host, f"rm -rf /run/{unit}; systemctl start {unit}")
        out = sh(host, f"for i in $(seq 100); do [ -s /run/{unit}/child.pid ] && break; sleep 0.05; done; "
                       f"cat /run/{unit}/child.pid").stdout  # fmt: skip
        pids[host] = int(out)
    return pids


def stop_and_look(host: str, unit: str, child: int) -> dict:
    since = sh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    time.sleep(1)  # journal timestamps have one-second granularity in --since
    started = time.monotonic()
    sh(host, f"systemctl stop {unit}")
    seconds = time.monotonic() - started
    look = sh(
        host,
        f"""
        echo "child_alive=$(kill -0 {child} 2>/dev/null && echo yes || echo no)"
        echo "left=$(pgrep -x 'cgtest-(main|child)' | tr '\\n' ' ')"
        echo "main_signals=$(cat /run/{unit}/main.signals 2>/dev/null | tr '\\n' ' ')"
        echo "child_signals=$(cat /run/{unit}/child.signals 2>/dev/null | tr '\\n' ' ')"
        """,
    ).stdout
    facts = dict(line.split("=", 1) for line in look.splitlines() if "=" in line)
    facts = {k: v.strip() for k, v in facts.items()}
    facts["journal"] = sh(host, f"journalctl --no-pager -o cat --since '{since}'").stdout
    facts["seconds"] = seconds
    return facts


def still_running(host: str, unit: str, child: int) -> bool:
    out = sh(host, f"systemctl is-active {unit}; kill -0 {child} && echo child-alive", check=False).stdout
    return out.split() == ["active", "child-alive"]


@contextlib.contextmanager
def stopped_on_the_first_host(hosts: list[str], unit: str):
    """Start ``unit`` on both hosts, stop it on the first and yield what was seen (stop_and_look), after the checks
    both kill modes share: no cgroup that failed to be killed, the child that ignores SIGTERM got SIGKILL and nothing
    of the unit is left, the other host's unit of the same name was not touched. The unit is stopped on both hosts at
    the end."""
    children = start_everywhere(unit)
    try:
        seen = stop_and_look(hosts[0], unit, children[hosts[0]])
        assert "Failed to kill control group" not in seen["journal"], seen["journal"]
        assert f"Killing process {children[hosts[0]]} (cgtest-child) with signal SIGKILL" in seen["journal"], seen
        assert seen["child_alive"] == "no" and seen["left"] == "", seen
        assert still_running(hosts[1], unit, children[hosts[1]])
        yield seen
    finally:
        for host in hosts:
            sh(host, f"systemctl stop {unit}", check=False)


def test_control_group_stop_kills_every_process_of_the_unit(hosts):
    with stopped_on_the_first_host(hosts, "cgtest-cg") as seen:
        # SIGTERM reached every process, not only the main one ...
        # (systemd sends it again to what is left once the main process is gone: final-sigterm.)
        assert seen["main_signals"] == "TERM" and "TERM" in seen["child_signals"].split(), seen
        # ... and the child that ignores it got SIGKILL (checked by the helper) after TimeoutStopSec (2 s).
        assert seen["seconds"] >= 1.9, seen


def test_mixed_stop_terms_the_main_process_only_and_kills_the_rest_after_it(hosts):
    with stopped_on_the_first_host(hosts, "cgtest-mixed") as seen:
        assert seen["main_signals"] == "TERM", seen
        assert seen["child_signals"] == "", seen  # the child never saw SIGTERM, yet it is gone (the helper's check)
        assert "remains running after unit stopped" not in seen["journal"], seen["journal"]


def test_each_host_runs_in_its_own_cgroup_subtree(hosts):
    state = json.loads((STATE_ROOT / NAME / "state.json").read_text())
    assert cgroup_mounts(), "no cgroup hierarchy on this machine"
    for host in hosts:
        leader = state["hosts"][host]["leader_pid"]
        lines = Path(f"/proc/{leader}/cgroup").read_text().splitlines()
        paths = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in lines}
        # cgroup v2 ("") and the v1 name=systemd hierarchy: the host's own subtree, delegated to its systemd.
        for controller in ("", "name=systemd"):
            if controller in paths:
                assert paths[controller] == f"/gpufleet-lab/{NAME}/{host}/payload/init.scope", lines
        for mount in cgroup_mounts():
            assert (mount / "gpufleet-lab" / NAME / host / "payload").is_dir()
        # Inside, the host sees its own cgroup root and nothing of the other host's processes.
        assert sh(host, "cat /proc/1/cgroup").stdout.splitlines()[-1] == "0::/init.scope"


def lab_cgroups() -> list[str]:
    """The cgroup directories directly under <hierarchy>/gpufleet-lab/<lab>, in every hierarchy."""
    return sorted(str(p) for m in cgroup_mounts() for p in (m / "gpufleet-lab" / NAME).glob("*") if p.is_dir())


def test_up_again_changes_nothing_and_down_removes_the_cgroups(hosts):
    before = lab_cgroups()
    assert before == sorted(str(m / "gpufleet-lab" / NAME / h) for m in cgroup_mounts() for h in hosts)
    again = lab_json("--name", NAME, "up", "--hosts", str(len(hosts)))
    assert again["changed"] is False and again["started"] == []
    assert lab_cgroups() == before
    lab("--name", NAME, "down")
    assert [str(m / "gpufleet-lab" / NAME) for m in cgroup_mounts() if (m / "gpufleet-lab" / NAME).exists()] == []
    # A second down finds nothing to do and does not fail.
    lab("--name", NAME, "down")
