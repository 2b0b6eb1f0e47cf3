"""proxmox_gpu_vm_drain_tasks: router - provision.yml's restarts go through rollout.yml's own drain (the rollout
role's experiment_out.yml / experiment_in.yml), against pvesim and the stand-in router and worker of
tests/unit/rollout/test_router_drain.py (smg's worker API, as strict as smg 1.13.0 where the module depends on it):
each VM is taken out of the router (DELETE) before its stop and added back (POST, after its /health) after its start,
one at a time; a VM whose start fails stays out of the router, the run stops and the fleet lock is given back."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from proxmox_runner import Provisioned, Runner, simulated_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from test_router_drain import loads_answer, router  # noqa: E402, F401 (the stand-in router fixture)

FAULT = "kvm: failed to allocate 131072 MiB of 1 GiB hugepages on host NUMA node 0"
ADDRESSES = {"gpu-a1": "127.0.0.1", "gpu-a2": "127.0.0.2", "gpu-b1": "127.0.0.3"}
VMIDS = {"201": "gpu-a1", "202": "gpu-a2", "203": "gpu-b1"}


@pytest.fixture
def worker():
    """The VMs' servers: one loopback endpoint on every 127.x address (the VMs' worker addresses), /health 200 and
    SGLang 0.5.9's /v1/loads with no request in flight."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = b"" if self.path == "/health" else json.dumps(loads_answer(0)).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{server.server_address[1]}"}
    server.shutdown()


def fleet(r: Runner, tmp: Path, router_url: str, worker_url: str) -> dict:
    """The provisioning inventory joined with the fleet's: the VMs are sglang_servers behind one gateway."""
    port = int(worker_url.rsplit(":", 1)[1])
    hosts = r.hosts()
    for name, h in hosts.items():
        h["fleet_router_worker_address"] = ADDRESSES[name]
    inv = r.inventory["all"]
    inv["vars"].update(
        fleet_router_port=int(router_url.rsplit(":", 1)[1]),
        fleet_router_control_plane_api_key="k",
        fleet_router_workers_file=str(tmp / "workers.json"),
        fleet_router_worker_port=port,
        rollout_lock_dir=str(tmp / "locks"),
        rollout_drain_timeout_s=5,
        rollout_readd_timeout_s=10,
    )
    inv["children"]["sglang_servers"] = {"hosts": {name: {} for name in hosts}}
    inv["children"]["fleet_routers"] = {"hosts": {"gw": {}}}
    return {name: f"http://{a}:{port}" for name, a in ADDRESSES.items()}


def power(writes) -> list[str]:
    """start/shutdown and the VM, in the order pvesim recorded the writes."""
    return [
        f"{w['path'].rsplit('/', 1)[1]} {VMIDS[w['path'].split('/')[4]]}" for w in writes if "/status/" in w["path"]
    ]


def run_scenario(stand_in, worker, tmp_path, provisioned: Provisioned, quarantined: tuple = ()) -> dict:
    # three running VMs (conftest's provisioned cluster), the fleet behind its router as deploy.yml left it; a change
    # that waits for a stop and start on every VM, and gpu-a2's start fails (pvesim's fault mode start_fails).
    # The order of drain, stop, start and add-back of one VM against the next is test_restarts.py's time line.
    # ``quarantined``: VMs with a quarantine record (fleet_remediation's file, one per VM here: they share this host)
    with simulated_cluster(tmp_path, provisioned) as (server, r):
        urls = fleet(r, tmp_path, stand_in["url"], worker["url"])
        by_url = {u: n for n, u in urls.items()}
        for name, u in urls.items():
            if name not in quarantined:  # a quarantined worker is out of the gateway already
                stand_in["workers"][str(uuid.uuid4())] = u
        for name, h in r.hosts().items():
            h["proxmox_gpu_vm_cores"] = 8
            h["fleet_remediation_quarantine_file"] = str(tmp_path / f"quarantine-{name}.json")
        for name in quarantined:
            record = {"since": "2026-12-07T10:00:00Z", "alert": "GpufleetGpuFatalXid", "reason": "Xid 79"}
            (tmp_path / f"quarantine-{name}.json").write_text(json.dumps(record))
        server.sim.faults["start_fails"] = {"202": FAULT}
        n, c = len(server.sim.writes), len(stand_in["calls"])
        p = r.run("playbooks/provision.yml", "-e", "proxmox_gpu_vm_apply_pending=true",
                  "-e", "proxmox_gpu_vm_drain_tasks=router")  # fmt: skip
        out = {"provisioned": provisioned.run, "failed": (p, server.sim.writes[n:], stand_in["calls"][c:])}
        out["router_urls"] = sorted(by_url[u] for u in stand_in["workers"].values() if u in by_url)
        out["locks"] = sorted(p.name for p in (tmp_path / "locks").glob("*")) if (tmp_path / "locks").exists() else []
        out["by_url"] = by_url
    return out


@pytest.fixture
def scenario(router, worker, tmp_path, provisioned: Provisioned):  # noqa: F811 (the imported fixture)
    return run_scenario(router, worker, tmp_path, provisioned)


def router_events(calls, by_url) -> list[str]:
    return [f"{m} {by_url.get(u, u)}" for m, u in calls if m in ("DELETE", "POST")]


def test_router_drain_then_restart_one_vm_at_a_time_and_a_failed_start_stays_out(scenario):
    first = scenario["provisioned"]
    assert first.returncode == 0, first.stdout[-3000:]
    p, writes, calls = scenario["failed"]
    assert p.returncode != 0
    by_url = scenario["by_url"]
    # gpu-a1: out of the router, stopped, started, back in; gpu-a2: out, stopped, its start failed, never back;
    # gpu-b1 untouched
    assert router_events(calls, by_url) == ["DELETE gpu-a1", "POST gpu-a1", "DELETE gpu-a2"]
    assert power(writes) == [
        "shutdown gpu-a1", "start gpu-a1", "shutdown gpu-a2", "start gpu-a2",
    ]  # fmt: skip
    assert "gpu-a1 is out of gw and drained for the experiment" in p.stdout
    assert "gpu-a1 is back in gw" in p.stdout
    assert "gpu-a2 is back in gw" not in p.stdout
    out = " ".join(p.stdout.split())
    assert (
        "gpu-a2 (VM 202 on pve1) did not start again after applying cores, numa0: VM 202 on pve1: the start "
        f"failed: {FAULT}" in out
    )
    assert scenario["router_urls"] == ["gpu-a1", "gpu-b1"]
    # the fleet lock and the host lock were given back (another rollout may run; gpu-a2 stays out until fixed)
    assert scenario["locks"] == []


def test_a_quarantined_vm_restarts_without_a_drain_and_stays_out_of_the_router(
    router,  # noqa: F811 (the imported fixture)
    worker,
    tmp_path,
    provisioned,  # noqa: F811 (the imported fixture)
):
    """gpu-a1 is quarantined (fleet_remediation's record): it is out of the gateway already, so its restart takes no
    drain and puts nothing back (before, the drain's undrain added it to the router again, with its fault)."""
    scenario = run_scenario(router, worker, tmp_path, provisioned, quarantined=("gpu-a1",))
    p, writes, calls = scenario["failed"]
    assert router_events(calls, scenario["by_url"]) == ["DELETE gpu-a2"]
    assert power(writes)[:2] == ["shutdown gpu-a1", "start gpu-a1"]
    out = " ".join(p.stdout.split())
    assert "gpu-a1 is quarantined since 2026-12-07T10:00:00Z, out of every gateway: nothing to drain" in out
    assert "gpu-a1" not in scenario["router_urls"]
