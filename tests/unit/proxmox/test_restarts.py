"""Restarts of serving VMs by playbooks/provision.yml, as rollout.yml restarts servers, against
the simulated Proxmox VE API (lab/pvesim) on loopback: pending changes applied one VM at a time (provision_serial,
default 1), each drained first and put back after its start; a failed start (pvesim's fault mode start_fails) stops
the run with Proxmox VE's message, that VM stopped and out of service and no later VM touched; proxmox_gpu_vm_state
stopped drains too and is refused without a drain hook; bad settings refused before any API call.

The drain and undrain hooks are the stand-ins of tests/unit/proxmox (drain_hook.yml, undrain_hook.yml): each records
the VM and the controller's clock, so their order against pvesim's write records is what the tests check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster import PASSWORD, TOKEN_SECRET
from proxmox_runner import Provisioned, Runner, simulated_cluster

HERE = Path(__file__).parent
FAULT = "kvm: failed to allocate 131072 MiB of 1 GiB hugepages on host NUMA node 0"


def power_writes(writes: list[dict]) -> list[tuple[str, str, int]]:
    """(vmid, start|shutdown|stop, t_ns) of every power write, in the order pvesim recorded them."""
    return [
        (w["path"].split("/")[4], w["path"].rsplit("/", 1)[1], w["t_ns"]) for w in writes if "/status/" in w["path"]
    ]


def log_lines(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(h, int(t)) for h, t in (line.split() for line in path.read_text().splitlines())]


def events(writes, drain_log: Path, undrain_log: Path) -> list[str]:
    """One time line: drain/undrain of a host and shutdown/start of a vmid, sorted by their clocks (one machine)."""
    out = [(t, f"{kind} {vmid}") for vmid, kind, t in power_writes(writes)]
    out += [(t, f"drain {h}") for h, t in log_lines(drain_log)]
    out += [(t, f"undrain {h}") for h, t in log_lines(undrain_log)]
    return [e for _, e in sorted(out)]


def hooks(tmp: Path, name: str) -> tuple[tuple[str, ...], Path, Path]:
    drain_log, undrain_log = tmp / f"{name}-drain.log", tmp / f"{name}-undrain.log"
    args = (
        "-e", "proxmox_gpu_vm_apply_pending=true",
        "-e", f"proxmox_gpu_vm_drain_tasks={HERE / 'drain_hook.yml'}",
        "-e", f"proxmox_gpu_vm_undrain_tasks={HERE / 'undrain_hook.yml'}",
        "-e", f"drain_log={drain_log}",
        "-e", f"undrain_log={undrain_log}",
    )  # fmt: skip
    return args, drain_log, undrain_log


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, provisioned: Provisioned):
    tmp = tmp_path_factory.mktemp("restarts")
    out = {"provision": provisioned.run}  # three running VMs (conftest's provisioned cluster)
    with simulated_cluster(tmp, provisioned) as (server, r):
        # every VM gets a change that waits for a full stop and start (vCPUs: cores and the NUMA binding)
        for h in r.hosts().values():
            h["proxmox_gpu_vm_cores"] = 8
        n = len(server.sim.writes)
        args, drain_log, undrain_log = hooks(tmp, "serial")
        out["serial"] = r.run("playbooks/provision.yml", *args)
        out["serial_events"] = events(server.sim.writes[n:], drain_log, undrain_log)
        out["serial_config"] = {v: server.sim.vms[v]["config"]["cores"] for v in (201, 202, 203)}
        # the same change back, and gpu-a2's start fails on the node (pvesim's fault mode start_fails)
        for h in r.hosts().values():
            h["proxmox_gpu_vm_cores"] = 16
        server.sim.faults["start_fails"] = {"202": FAULT}
        n = len(server.sim.writes)
        args, drain_log, undrain_log = hooks(tmp, "failed")
        out["failed"] = r.run("playbooks/provision.yml", *args)
        out["failed_events"] = events(server.sim.writes[n:], drain_log, undrain_log)
        out["failed_status"] = {v: server.sim.vms[v]["status"] for v in (201, 202, 203)}
        out["failed_report"] = json.loads((r.reports / "gpu-a2.json").read_text())
        # the node is fixed: the next run starts gpu-a2 (it is not running, so it is started as a new VM is) and
        # restarts gpu-b1, which the failed run did not reach
        server.sim.faults["start_fails"] = {}
        n = len(server.sim.writes)
        args, drain_log, undrain_log = hooks(tmp, "again")
        out["again"] = r.run("playbooks/provision.yml", *args)
        out["again_events"] = events(server.sim.writes[n:], drain_log, undrain_log)
        out["again_report"] = json.loads((r.reports / "gpu-a2.json").read_text())
        # state stopped: refused without a drain hook (before any write), drained first with one
        r.hosts()["gpu-b1"]["proxmox_gpu_vm_state"] = "stopped"
        n = len(server.sim.writes)
        out["stop_refused"] = r.run()
        out["stop_refused_writes"] = server.sim.writes[n:]
        args, drain_log, undrain_log = hooks(tmp, "stop")
        out["stop"] = r.run("playbooks/provision.yml", *args)
        out["stop_events"] = events(server.sim.writes[n:], drain_log, undrain_log)
        out["stop_status"] = server.sim.vms[203]["status"]
    return out


def _ok(p) -> None:
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_pending_changes_restart_one_vm_at_a_time_each_drained_first(scenario):
    _ok(scenario["provision"])
    _ok(scenario["serial"])
    assert scenario["serial_events"] == [
        "drain gpu-a1", "shutdown 201", "start 201", "undrain gpu-a1",
        "drain gpu-a2", "shutdown 202", "start 202", "undrain gpu-a2",
        "drain gpu-b1", "shutdown 203", "start 203", "undrain gpu-b1",
    ]  # fmt: skip
    assert scenario["serial_config"] == {201: "8", 202: "8", 203: "8"}


def test_a_failed_start_stops_the_run_with_the_vm_out_of_service(scenario):
    p = scenario["failed"]
    assert p.returncode != 0
    # gpu-a1 went through; gpu-a2 was drained, stopped, its start failed: it is not put back, gpu-b1 is not touched
    assert scenario["failed_events"] == [
        "drain gpu-a1", "shutdown 201", "start 201", "undrain gpu-a1",
        "drain gpu-a2", "shutdown 202", "start 202",
    ]  # fmt: skip
    assert scenario["failed_status"] == {201: "running", 202: "stopped", 203: "running"}
    out = " ".join(p.stdout.split())
    assert (
        "gpu-a2 (VM 202 on pve1) did not start again after applying cores, numa0: VM 202 on pve1: the start "
        f"failed: {FAULT}" in out
    )
    assert (
        "It is stopped and out of service (the drain hook took it out; it was not put back), and this run stops" in out
    )
    assert "gpu-b1" not in p.stdout.split("PLAY [Stop or restart the running VMs")[1].split("PLAY RECAP")[0]
    report = scenario["failed_report"]
    assert report["status"] == "stopped" and report["start_error"] == f"VM 202 on pve1: the start failed: {FAULT}"
    assert report["pending"] == ["cores", "numa0"]


def test_after_the_fix_the_next_run_starts_it_and_restarts_the_rest(scenario):
    _ok(scenario["again"])
    # gpu-a2 is stopped (serves nothing): started in the first play; gpu-b1 restarted after its drain
    assert scenario["again_events"] == ["start 202", "drain gpu-b1", "shutdown 203", "start 203", "undrain gpu-b1"]
    assert scenario["again_report"]["status"] == "running" and scenario["again_report"]["start_error"] == ""


def test_state_stopped_drains_first_and_is_refused_without_a_drain_hook(scenario):
    p = scenario["stop_refused"]
    assert p.returncode != 0
    assert (
        "gpu-b1: proxmox_gpu_vm_state is stopped and the VM is running, but proxmox_gpu_vm_drain_tasks is empty"
        in p.stdout
    )
    assert scenario["stop_refused_writes"] == []
    _ok(scenario["stop"])
    # stopped after its drain; a stopped VM is not put back in service
    assert scenario["stop_events"] == ["drain gpu-b1", "shutdown 203"]
    assert scenario["stop_status"] == "stopped"


def test_no_secret_in_any_output(scenario):
    for key in ("provision", "serial", "failed", "again", "stop_refused", "stop"):
        text = scenario[key].stdout + scenario[key].stderr
        assert PASSWORD not in text and TOKEN_SECRET not in text


def test_the_old_proxmox_host_variable_is_refused_before_any_api_call(runner: Runner):
    p = runner.run(env={"PROXMOX_HOST": "pve1.example.net"})
    assert p.returncode != 0
    assert (
        "the environment variable PROXMOX_HOST is no longer read: export PROXMOX_URL=https://pve1.example.net:8006 "
        "instead (the Proxmox inventory plugin reads the same variable) and unset PROXMOX_HOST" in p.stdout
    )
    assert runner.server.sim.exchanges == [] and runner.writes() == []


def test_no_api_host_and_no_credentials_are_refused_before_any_api_call(runner: Runner):
    del runner.inventory["all"]["vars"]["proxmox_gpu_vm_api_host"]
    p = runner.run(env={"PROXMOX_URL": "pve1.example.net", "PROXMOX_PASSWORD": ""})
    assert p.returncode != 0
    out = " ".join(p.stdout.split())
    assert 'proxmox_gpu_vm_api_host is empty: export PROXMOX_URL=https://<node>:8006 (now: "pve1.example.net")' in out
    assert (
        "no credentials: export PROXMOX_PASSWORD (root@pam, needed for the root-only settings) or PROXMOX_TOKEN_ID"
        in out
    )
    assert runner.server.sim.exchanges == [] and runner.writes() == []


def test_a_bad_provision_serial_is_refused_before_any_api_call(runner: Runner):
    p = runner.run("playbooks/provision.yml", "-e", "provision_serial=0")
    assert p.returncode != 0
    assert "provision_serial must be a number of VMs per batch (1 or more) or a percentage (1%-100%), got" in p.stdout
    assert runner.server.sim.exchanges == [] and runner.writes() == []
