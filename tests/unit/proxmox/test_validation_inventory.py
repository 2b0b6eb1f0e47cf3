"""Refusals before any write (before any API call for the inventory-only checks) and the inventory plugin's groups,
against the simulated cluster (lab/pvesim; its own answers against the PVE schema: tests/unit/pvesim)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from cluster import TOKEN_ID, TOKEN_SECRET
from conftest import ROOT, Runner

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
        sim.vms[vmid] = sim._new_vm(
            vmid, "pve1", {"name": name, "tags": tags, "agent": "1", "cores": 8, "memory": "65536"}
        )
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
