"""Refusals before any write (before any API call for the inventory-only checks) and the inventory plugin's groups,
against the simulated cluster (lab/pvesim; its own answers against the PVE schema: tests/unit/pvesim)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from cluster import TOKEN_ID, TOKEN_SECRET
from proxmox_runner import ROOT, Runner

HERE = Path(__file__).parent


def test_inventory_only_mistakes_are_refused_before_any_api_call(runner: Runner):
    h = runner.hosts()
    h["gpu-a2"]["proxmox_gpu_vm_gpus"] = [{"bus": "0000:81:00.0"}]  # also gpu-a1's
    h["gpu-b1"]["proxmox_gpu_vm_machine"] = "pc-i440fx-8.1"  # pcie=1 without q35
    h["gpu-a1"]["proxmox_gpu_vm_memory_mib"] = 1536  # 1 GiB pages
    h["gpu-a2"]["proxmox_gpu_vm_name"] = "gpu_a2"  # no DNS name
    h["gpu-b1"].pop("proxmox_gpu_vm_numa_node")  # the role's default: no NUMA node is known for its GPUs
    h["gpu-b1"]["proxmox_gpu_vm_extra_tags"] = ["team/infra"]
    # and token auth: QEMU args (the OVMF MMIO window), hugepages and raw bus ids are root@pam's only
    token = {"PROXMOX_PASSWORD": "", "PROXMOX_TOKEN_ID": "gpufleet", "PROXMOX_TOKEN_SECRET": TOKEN_SECRET}
    p = runner.run("playbooks/provision.yml", "-v", env=token)
    assert p.returncode != 0
    out = p.stdout
    assert "gpu_a2: proxmox_gpu_vm_gpus[0]: GPU pve1 0000:81:00.0 is also given to gpu-a1" in out
    assert (
        "gpu-b1: proxmox_gpu_vm_gpus[0]: pcie=1 needs machine q35 but proxmox_gpu_vm_machine is 'pc-i440fx-8.1'" in out
    )
    assert "gpu-a1: proxmox_gpu_vm_hugepages 1024 (MiB pages) does not fit proxmox_gpu_vm_memory_mib 1536" in out
    assert "gpu_a2: proxmox_gpu_vm_name 'gpu_a2' is not a DNS name" in out
    assert "gpu-b1: tag 'team/infra' (from proxmox_gpu_vm_gpu_class, " in out
    assert (
        "gpu-b1: no host NUMA node is known for proxmox_gpu_vm_gpus[0] (mapping rtxpro-b0), proxmox_gpu_vm_gpus[1] "
        "(mapping rtxpro-b1) on pve2: proxmox_gpu_vm_numa_node is not set and the GPU has no numa_node." in out
    )
    root_only = "Proxmox VE accepts these settings only from root@pam (not from an API token or another user; now: "
    assert f"gpu-a1: {root_only}API token root@pam!gpufleet): proxmox_gpu_vm_gpus[0].bus 0000:81:00.0 " in out
    assert "proxmox_gpu_vm_gpus[1].bus 0000:82:00.0 (a raw bus id" in out
    b1 = next(line for line in out.split(" | ") if line.startswith(f"gpu-b1: {root_only}"))
    assert "proxmox_gpu_vm_mmio64_mb" in b1 and "proxmox_gpu_vm_hugepages '1024'" in b1
    assert ".bus" not in b1  # mappings are no root-only setting
    assert TOKEN_SECRET not in p.stdout + p.stderr
    assert runner.server.sim.exchanges == [] and runner.writes() == []


def test_a_vm_with_refused_variables_stops_the_others_before_any_api_call(runner: Runner):
    runner.hosts()["gpu-b1"]["proxmox_gpu_vm_cores"] = "many"
    p = runner.run()
    assert p.returncode != 0
    assert "gpu-b1: its variables were refused above; nothing is written while one VM is refused" in p.stdout
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


def test_what_proxmox_ve_refuses_is_refused_before_any_write(runner: Runner):
    """IOMMU groups, a GPU another VM has, a clone to another node without shared storage: each would fail (in
    pvesim as in PVE) after the role wrote something, or (a group shared with the host's NIC) take the NIC from the
    node at the start; the role refuses them first."""
    sim, h = runner.server.sim, runner.hosts()
    pve1 = sim.nodes["pve1"]["pci"]
    next(d for d in pve1 if d["id"] == "0000:01:00.0")["iommugroup"] = 42  # the host's NIC joins gpu-a2's group
    for d in sim.nodes["pve2"]["pci"]:
        d["iommugroup"] = -1  # pve2 without IOMMU
    sim.vms[160] = sim._new_vm(160, "pve1", {"name": "train01", "hostpci0": "0000:81:00", "memory": "8192"})
    h["gpu-b1"]["proxmox_gpu_vm_storage"] = "local-lvm"
    p = runner.run()
    assert p.returncode != 0
    out = p.stdout
    assert (
        "gpu-a2: proxmox_gpu_vm_gpus[0] (0000:a1:00.0 on pve1) shares IOMMU group 42 with 0000:01:00.0 "
        "(class 0x020000, Mellanox Technologies), which the VM does not get" in out
    )
    assert "gpu-b1: proxmox_gpu_vm_gpus[0] (0000:c1:00.0 on pve2) has no IOMMU group (iommugroup -1)" in out
    assert (
        "gpu-a1: proxmox_gpu_vm_gpus[0] (0000:81:00.0 on pve1) is also given to VM 160 'train01' (stopped, "
        "hostpci0: 0000:81:00)" in out
    )
    assert (
        "gpu-b1: proxmox_gpu_vm_template 'debian12-cloud' is on pve1 (proxmox_gpu_vm_template_node) and the VM goes "
        "to pve2: Proxmox VE clones to another node only on shared storage, and proxmox_gpu_vm_storage 'local-lvm' "
        "is not a shared storage of pve1" in out
    )
    assert runner.writes() == []


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
