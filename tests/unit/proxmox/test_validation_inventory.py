"""Refusals before any write (before any API call for the inventory-only checks), the inventory plugin's groups
against the simulated cluster, and the simulator's answers against the published Proxmox VE API schema."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests
import urllib3  # noqa: F401 (warning filter)
from cluster import TOKEN_ID, TOKEN_SECRET, cluster
from conftest import ROOT, Runner
from pvesim.server import SCHEMA_PATH, PveSim, PveSimServer

HERE = Path(__file__).parent


def test_inventory_only_mistakes_are_refused_before_any_api_call(runner: Runner):
    h = runner.hosts()
    h["gpu-a2"]["proxmox_gpu_vm_gpus"] = [{"bus": "0000:81:00.0"}]  # also gpu-a1's
    h["gpu-b1"]["proxmox_gpu_vm_machine"] = "pc-i440fx-8.1"  # pcie=1 without q35
    h["gpu-a1"]["proxmox_gpu_vm_memory_mib"] = 1536  # 1 GiB pages
    # and token auth, while the OVMF MMIO window is QEMU args, which Proxmox VE accepts only from root@pam itself
    token = {"PROXMOX_PASSWORD": "", "PROXMOX_TOKEN_ID": "gpufleet", "PROXMOX_TOKEN_SECRET": TOKEN_SECRET}
    p = runner.run("playbooks/provision.yml", "-v", env=token)
    assert p.returncode != 0
    out = p.stdout
    assert "gpu-a2: proxmox_gpu_vm_gpus[0]: GPU pve1 0000:81:00.0 is also given to gpu-a1" in out
    assert (
        "gpu-b1: proxmox_gpu_vm_gpus[0]: pcie=1 needs machine q35 but proxmox_gpu_vm_machine is 'pc-i440fx-8.1'" in out
    )
    assert "gpu-a1: proxmox_gpu_vm_hugepages 1024 (MiB pages) does not fit proxmox_gpu_vm_memory_mib 1536" in out
    assert "which Proxmox VE accepts only from root@pam with a password (not from an API token; now: API token " in out
    assert TOKEN_SECRET not in p.stdout + p.stderr
    assert runner.server.sim.exchanges == [] and runner.writes() == []


def test_cluster_mistakes_are_refused_before_any_write(runner: Runner):
    h = runner.hosts()
    h["gpu-a1"]["proxmox_gpu_vm_gpus"] = [{"bus": "0000:99:00.0"}]
    h["gpu-b1"]["proxmox_gpu_vm_gpus"] = [{"mapping": "rtxpro-nope"}]
    h["gpu-a2"]["proxmox_gpu_vm_vmid"] = 150  # db01, not ours
    p = runner.run()
    assert p.returncode != 0
    out = p.stdout
    assert "gpu-a1: proxmox_gpu_vm_gpus[0].bus 0000:99:00.0 is not in the PCI list of node pve1" in out
    assert "gpu-b1: proxmox_gpu_vm_gpus[0].mapping 'rtxpro-nope' is not a PCI resource mapping of the cluster" in out
    assert "gpu-a2: proxmox_gpu_vm_vmid 150 is taken by VM 'db01' on pve2, which this inventory does not own" in out
    assert runner.server.sim.exchanges != []  # it did read (GET) ...
    assert runner.writes() == []  # ... and wrote nothing


def test_inventory_plugin_groups_from_tags_and_address_from_agent(pve, tmp_path):
    sim = pve.sim
    for vmid, name, tags in (
        (301, "gpu-x1", "gpufleet;gpu-rtx-pro-6000;model-glm5"),
        (302, "gpu-x2", "gpufleet;gpu-h200;model-qwen3"),
    ):
        sim.vms[vmid] = {
            "vmid": vmid,
            "node": "pve1",
            "status": "stopped",
            "template": 0,
            "pending": {},
            "pending_delete": [],
            "snapshots": [],
            "agent_ip": None,
            "config": {"name": name, "tags": tags, "agent": "1", "cores": 8, "memory": "65536"},
        }
        sim.ep_post_nodes_node_qemu_vmid_status_start(user="root@pam", node="pve1", vmid=str(vmid))
    example = (ROOT / "inventory/examples/proxmox/cluster.proxmox.yml").read_text()
    assert example.count("validate_certs: true") == 1
    inv = tmp_path / "test.proxmox.yml"
    inv.write_text(example.replace("validate_certs: true", "validate_certs: false"))  # the simulator's own cert
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's verify=False (docs/proxmox.md)
    env = {k: v for k, v in os.environ.items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}
    env = {
        **env,
        "PROXMOX_URL": f"https://127.0.0.1:{pve.port}",
        "PROXMOX_USER": "root@pam",
        "PROXMOX_TOKEN_ID": TOKEN_ID.split("!")[1],
        "PROXMOX_TOKEN_SECRET": TOKEN_SECRET,
    }
    p = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(inv), "--list", "--export"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert sorted(data["sglang_servers"]["hosts"]) == ["gpu-x1", "gpu-x2"]
    assert data["gpu_rtx_pro_6000"]["hosts"] == ["gpu-x1"] and data["gpu_h200"]["hosts"] == ["gpu-x2"]
    assert data["model_glm5"]["hosts"] == ["gpu-x1"] and data["model_qwen3"]["hosts"] == ["gpu-x2"]
    hv = data["_meta"]["hostvars"]
    assert "db01" not in hv  # not owned by gpufleet
    unsafe = lambda v: v["__ansible_unsafe"] if isinstance(v, dict) else v  # noqa: E731 (values from an API)
    assert unsafe(hv["gpu-x1"]["ansible_host"]) == sim.vms[301]["agent_ip"] == "192.0.2.11"
    assert unsafe(hv["gpu-x2"]["ansible_host"]) == sim.vms[302]["agent_ip"] == "192.0.2.12"
    assert unsafe(hv["gpu-x1"]["proxmox_gpu_vm_vmid"]) == 301
    assert TOKEN_SECRET not in p.stdout + p.stderr


def check_answer(schema: dict, endpoint: str, data) -> list[str]:
    """Problems of one answer against the schema's return type (required fields, field types, no unknown fields)."""
    ret = schema["endpoints"][endpoint]["returns"]
    pytypes = {"number": (int, float), "boolean": (int, bool), "string": (str,)}
    if ret in ("string", "null", "any"):
        ok = {"string": isinstance(data, str), "null": data is None, "any": True}[ret]
        return [] if ok else [f"{endpoint}: {data!r} is not {ret}"]
    iface = schema["interfaces"][ret.removesuffix("[]")]
    items = data if ret.endswith("[]") else [data]
    if ret.endswith("[]") and not isinstance(data, list):
        return [f"{endpoint}: not a list"]
    problems = []
    for item in items:
        for name, f in iface["fields"].items():
            if f["required"] and name not in item:
                problems.append(f"{endpoint}: required field {name} missing")
        for name, value in item.items():
            f = iface["fields"].get(name)
            if f is None:
                if not iface["additional_properties"]:
                    problems.append(f"{endpoint}: unknown field {name}")
                continue
            if f["type"] in pytypes and not isinstance(value, pytypes[f["type"]]):
                problems.append(f"{endpoint}: {name}={value!r} is not {f['type']}")
            if f["type"] == "boolean" and value not in (0, 1, True, False):
                problems.append(f"{endpoint}: {name}={value!r} is not a boolean")
    return problems


@pytest.fixture(scope="module")
def schema():
    return json.loads(SCHEMA_PATH.read_text())


def test_schema_check_catches_a_toy_answer(schema):
    assert check_answer(schema, "GET /nodes/{node}/qemu/{vmid}/config", {"cores": "16", "digest": "x"}) == [
        "GET /nodes/{node}/qemu/{vmid}/config: cores='16' is not number"
    ]
    assert check_answer(schema, "GET /nodes/{node}/qemu/{vmid}/pending", [{"value": "1"}]) == [
        "GET /nodes/{node}/qemu/{vmid}/pending: required field key missing"
    ]


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_every_simulator_answer_matches_the_schema(schema, tmp_path):
    """Drive every served endpoint over HTTPS (token and ticket auth) and check each answer."""
    sim = PveSim(cluster())
    with PveSimServer(sim, tmp_path) as server:
        base = f"https://127.0.0.1:{server.port}/api2/json"
        s = requests.Session()
        s.verify = False
        s.trust_env = False  # else REQUESTS_CA_BUNDLE overrides verify=False
        s.headers["Authorization"] = f"PVEAPIToken={TOKEN_ID}={TOKEN_SECRET}"
        t = s.post(
            f"{base}/access/ticket",
            data={"username": "root@pam", "password": cluster()["users"]["root@pam"]},
        ).json()["data"]
        pw = requests.Session()
        pw.verify = False
        pw.trust_env = False
        pw.cookies.set("PVEAuthCookie", t["ticket"])
        pw.headers["CSRFPreventionToken"] = t["CSRFPreventionToken"]
        upid = s.post(f"{base}/nodes/pve1/qemu/9000/clone", data={"newid": 401, "name": "x", "full": 1}).json()["data"]
        for path in (
            "/version",
            "/nodes",
            "/pools",
            "/cluster/resources?type=vm",
            "/cluster/mapping/pci",
            "/nodes/pve1/hardware/pci",
            "/nodes/pve1/qemu",
            "/nodes/pve1/lxc",
            "/nodes/pve1/qemu/401/config",
            f"/nodes/pve1/tasks/{upid}/status",
            f"/nodes/pve1/tasks/{upid}/log",
        ):
            assert s.get(base + path).status_code == 200, path
        r = pw.put(
            f"{base}/nodes/pve1/qemu/401/config",
            data={
                "args": "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144",
                "hostpci0": "0000:81:00.0,pcie=1",
                "machine": "q35",
                "agent": "1",
                "efidisk0": "local-lvm:1,efitype=4m",
            },
        )
        assert r.status_code == 200, r.text
        assert s.put(f"{base}/nodes/pve1/qemu/401/config", data={"args": "-x"}).json()["message"] == (
            "only root can set 'args' config\n"
        )
        assert s.post(f"{base}/nodes/pve1/qemu/401/status/start").status_code == 200
        s.put(f"{base}/nodes/pve1/qemu/401/config", data={"hostpci1": "0000:82:00.0,pcie=1", "delete": "agent"})
        s.post(f"{base}/nodes/pve1/qemu/401/snapshot", data={"snapname": "before", "vmstate": 0})
        for path in (
            "/nodes/pve1/qemu/401/pending",
            "/nodes/pve1/qemu/401/status/current",
            "/nodes/pve1/qemu/401/snapshot",
            "/nodes/pve1/qemu/401/agent/network-get-interfaces",
        ):
            assert s.get(base + path).status_code == 200, path
        for path in ("shutdown", "stop"):
            assert s.post(f"{base}/nodes/pve1/qemu/401/status/{path}").status_code == 200
        bad = s.put(f"{base}/nodes/pve1/qemu/401/config", data={"hostpcix": "1"})
        assert bad.status_code == 400 and "hostpcix" in bad.json()["errors"]
    served = {e["endpoint"] for e in sim.exchanges}
    assert served == set(schema["endpoints"]) - {"POST /access/ticket"} | {"POST /access/ticket"}
    problems = [p for e in sim.exchanges for p in check_answer(schema, e["endpoint"], e["data"])]
    assert problems == []
