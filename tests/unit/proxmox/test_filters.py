"""The role's pure filters: the GPUDirect clique verdict, the pending keys, and what Proxmox VE would refuse."""

from __future__ import annotations

import json
from pathlib import Path

import test_pve_rules_contract as contract
from ansible_collections.gpufleet.fleet.plugins.filter import proxmox_gpu_vm as pgv
from ansible_collections.gpufleet.fleet.plugins.filter import proxmox_gpu_vm_pve_rules as rules

ROOT = Path(__file__).resolve().parents[3]
NCCL = json.loads((ROOT / "tests/unit/fixtures/h200-device/nccl-allreduce.json").read_text())


def test_clique_kept_only_with_a_completed_all_reduce_and_a_gain():
    best = max(NCCL["summary"]["busbw_gbps"]["derived"].items(), key=lambda kv: float(kv[0]))[1]
    assert pgv.clique_verdict(NCCL, best / 1.5, 0.2)["keep"] is True
    assert pgv.clique_verdict(NCCL, best, 0.2)["keep"] is False
    assert "no baseline" in pgv.clique_verdict(NCCL, None, 0.2)["reason"]
    assert "no NCCL all-reduce measurement" in pgv.clique_verdict(None, 10, 0.2)["reason"]
    hung = json.loads(json.dumps(NCCL))
    derived = next(v for v in hung["variants"] if v["name"] == "derived")
    derived.update(ok=False, error="TimeoutError('all-reduce did not finish')")
    assert "did not complete with the clique: TimeoutError" in pgv.clique_verdict(hung, 1, 0.2)["reason"]
    wrong = json.loads(json.dumps(NCCL))
    next(v for v in wrong["variants"] if v["name"] == "derived")["results"][0]["correct"] = False
    assert "wrong sums at [1.0] MiB" in pgv.clique_verdict(wrong, 1, 0.2)["reason"]


def test_pending_keys_include_pending_deletes():
    pending = [
        {"key": "cores", "value": "16"},
        {"key": "hostpci1", "pending": "0000:a2:00.0,pcie=1"},
        {"key": "hostpci3", "value": "0000:c1:00.0", "delete": 1},
    ]
    assert pgv.pending_keys(pending) == ["hostpci1", "hostpci3"]


def _spec(**kw) -> dict:
    """gpu-a1's spec as test_pve_rules_contract builds it, from the template tmpl, without the MMIO window unless kw
    sets one."""
    return contract.spec(**({"template": "tmpl", "mmio64_mb": 0} | kw))


def _dev(bus: str, group: int, cls: str = "0x030000") -> dict:
    return {"id": bus, "class": cls, "vendor": "0x10de", "iommugroup": group}


def test_pve_static_problems_name_the_variable_and_the_fix():
    assert rules.pve_static_problems([_spec()]) == []
    (nonuma,) = rules.pve_static_problems([_spec(numa_node=None, gpus=[])])
    assert "proxmox_gpu_vm_numa_node is not set" in nonuma and "proxmox_gpu_vm_hugepages: ''" in nonuma
    (token,) = rules.pve_static_problems([_spec(auth="API token ops@pve!x", mmio64_mb=1024)])
    assert "proxmox_gpu_vm_gpus[0].bus 0000:81:00.0" in token and "proxmox_gpu_vm_mmio64_mb" in token
    assert "proxmox_gpu_vm_hugepages '1024'" in token and "proxmox_gpu_vm_api_user: root@pam" in token
    mapped = _spec(auth="API token ops@pve!x", hugepages="", gpus=[{"mapping": "rtx"}])
    assert rules.pve_static_problems([mapped]) == []  # a mapping needs Mapping.Use, not root
    assert len(rules.pve_static_problems([_spec(name="gpu_a1", tags=["a/b"])])) == 2


def test_pve_cluster_problems_iommu_groups():
    own = [_dev("0000:81:00.0", 40), _dev("0000:81:00.1", 40, "0x040300")]
    base = {"vms": [], "mappings": [], "hostpci": {}, "storage": {}, "templates": {}, "configs": {}}
    assert rules.pve_cluster_problems([_spec()], base | {"pci": {"pve1": own}}) == []
    nic = _dev("0000:01:00.0", 40, "0x020000")
    (shared,) = rules.pve_cluster_problems([_spec()], base | {"pci": {"pve1": [*own, nic]}})
    assert "shares IOMMU group 40 with 0000:01:00.0" in shared and "proxmox_gpu_vm_gpus" in shared
    two = [_dev("0000:81:00.0", 40), _dev("0000:82:00.0", 40)]  # both GPUs go to the same VM: viable
    both = _spec(gpus=[{"bus": "0000:81:00.0"}, {"bus": "0000:82:00.0"}])
    assert rules.pve_cluster_problems([both], base | {"pci": {"pve1": two}}) == []
    (none,) = rules.pve_cluster_problems([_spec()], base | {"pci": {"pve1": [_dev("0000:81:00.0", -1)]}})
    assert "iommugroup -1" in none


def test_pve_cluster_problems_gpu_of_another_vm_and_cross_node_clone():
    pci = {"pve1": [_dev("0000:81:00.0", 40), _dev("0000:81:00.1", 40)], "pve2": []}
    vms = [{"vmid": 160, "name": "train01", "node": "pve1", "status": "running"}]
    base = {"pci": pci, "vms": vms, "mappings": [], "storage": {}, "templates": {}, "configs": {}}
    (used,) = rules.pve_cluster_problems([_spec()], base | {"hostpci": {"160": {"hostpci0": "0000:81:00"}}})
    assert "is also given to VM 160 'train01' (running, hostpci0: 0000:81:00)" in used
    assert rules.pve_cluster_problems([_spec()], base | {"hostpci": {"160": {"hostpci0": "0000:82:00.0"}}}) == []
    storage = {"pve1": [{"storage": "local-lvm", "shared": 0}, {"storage": "ceph-vm", "shared": 1}]}
    tmpl = {"tmpl": [{"vmid": 9000, "node": "pve1", "storages": ["local-lvm"]}]}
    far = _spec(node="pve2", gpus=[], storage="ceph-vm")
    (clone,) = rules.pve_cluster_problems([far], base | {"hostpci": {}, "storage": storage, "templates": tmpl})
    assert "the template's disks are on local-lvm, not shared" in clone
    tmpl["tmpl"][0]["storages"] = ["ceph-vm"]
    assert rules.pve_cluster_problems([far], base | {"hostpci": {}, "storage": storage, "templates": tmpl}) == []


def test_pve_cluster_problems_root_only_keys_of_an_existing_vm():
    pci = {"pve1": [_dev("0000:81:00.0", 40)]}
    current = {"hostpci0": "0000:82:00.0", "hugepages": "1024"}
    cluster = {"pci": pci, "vms": [], "mappings": [], "hostpci": {}, "storage": {}, "templates": {}}
    token = _spec(auth="API token ops@pve!x", hugepages="", gpus=[])
    (p,) = rules.pve_cluster_problems([token], cluster | {"configs": {"201": current}})
    assert "hugepages" in p and "hostpci0 (0000:82:00.0)" in p and "only root@pam may change or remove" in p
