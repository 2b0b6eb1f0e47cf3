"""The privileges an API token needs (docs/proxmox.md, API privileges), checked before any write with Proxmox VE's
GET /access/permissions: a missing one is named with its path and what it is for, and nothing is written. A PVE 9
token without VM.GuestAgent.Audit used to clone, configure and start the VM, then wait proxmox_gpu_vm_agent_timeout
(300 s) for an address and fail; a token with the documented privileges provisions the VM (pvesim refusing what
Proxmox VE refuses, the methods' permissions from PVE's schema)."""

from __future__ import annotations

import copy

import pytest
import test_pve_rules_contract as contract
from ansible_collections.gpufleet.fleet.plugins.filter import proxmox_gpu_vm_privileges as privileges
from cluster import cluster
from proxmox_gpu_vm_info import read_cluster, read_permissions
from proxmox_runner import Runner
from pvesim.server import ApiError, PveSim, PveSimServer

OPS = ("ops@pve!gpufleet", "ops-token-secret-must-never-show")
OPS_AUTH = f"API token {OPS[0]}"


def documented_acl(version: str) -> dict:
    """What gpu-b1 (VM 203 on pve2, GPUs by mapping, cloned from template 9000 onto ceph-vm) needs: the docs' table."""
    agent = ["VM.Monitor"] if version.startswith("8") else ["VM.GuestAgent.Audit"]
    vm = ["VM.Audit", "VM.Allocate", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.HWType", "VM.Config.Options"]
    vm += ["VM.Config.Cloudinit", "VM.Config.Disk", "VM.PowerMgmt", *agent]
    return {
        "/": ["Sys.Audit"],
        "/vms/203": vm,
        "/vms/9000": ["VM.Audit", "VM.Clone"],
        "/storage/ceph-vm": ["Datastore.AllocateSpace"],
        "/mapping/pci": ["Mapping.Use"],
        "/sdn/zones/localnetwork/vmbr0": ["SDN.Use"],
    }


def ops_cluster(version: str, acl: dict) -> dict:
    c = copy.deepcopy(cluster(version))
    c["users"]["ops@pve"] = {"password": "x", "acl": documented_acl(version)}
    c["tokens"][OPS[0]] = {"secret": OPS[1], "privsep": 1, "acl": acl}
    return c


def token_spec(**kw) -> dict:
    base = {"name": "gpu-b1", "node": "pve2", "vmid": 203, "storage": "ceph-vm", "numa_node": 1, "auth": OPS_AUTH}
    base |= {"hugepages": "", "mmio64_mb": 0, "gpus": [{"mapping": "rtxpro-b0"}], "agent_address": True}
    return contract.spec(**(base | kw))


def check(sim: PveSim, s: dict) -> list[str]:
    api = contract.SimApi(sim, {"Authorization": f"PVEAPIToken={OPS[0]}={OPS[1]}"})
    c = read_cluster(api, ["pve1", "pve2"], [s["vmid"]], [s["template"]], False)
    return privileges.privilege_problems([s], c, read_permissions(api, privileges.privilege_paths([s], c)))


def test_a_pve9_token_without_guest_agent_audit_is_refused_naming_it():
    acl = documented_acl("9.1.2")
    acl["/vms/203"] = [p for p in acl["/vms/203"] if p != "VM.GuestAgent.Audit"]
    sim = PveSim(ops_cluster("9.1.2", acl))
    (problem,) = check(sim, token_spec())
    assert problem.startswith(
        "gpu-b1: the API token ops@pve!gpufleet lacks VM.GuestAgent.Audit or VM.GuestAgent.Unrestricted on /vms/203 "
        "(the guest agent's address: GET .../agent/network-get-interfaces) (Proxmox VE 9.1.2;"
    )
    assert "pveum acl modify <path> --tokens 'ops@pve!gpufleet'" in problem
    assert "or set proxmox_gpu_vm_address_from_agent: false and give ansible_host" in problem
    assert sim.writes == []
    # Proxmox VE 8 names the privilege VM.Monitor
    acl = documented_acl("8.4.1")
    acl["/vms/203"] = [p for p in acl["/vms/203"] if p != "VM.Monitor"]
    (problem,) = check(PveSim(ops_cluster("8.4.1", acl)), token_spec())
    assert "lacks VM.Monitor on /vms/203 (the guest agent's address" in problem


def test_each_missing_privilege_is_named_with_its_path():
    acl = documented_acl("9.1.2")
    del acl["/storage/ceph-vm"], acl["/sdn/zones/localnetwork/vmbr0"]
    acl["/vms/9000"] = ["VM.Audit"]
    acl["/mapping/pci"] = []
    (problem,) = check(PveSim(ops_cluster("9.1.2", acl)), token_spec())
    for says in (
        "VM.Clone on /vms/9000 (the clone of template 'debian12-cloud')",
        "Datastore.AllocateSpace on /storage/ceph-vm (the clone's disks on that storage, allocating the EFI disk on "
        "that storage)",
        "SDN.Use on /sdn/zones/localnetwork/vmbr0 (the clone of the template's net0 on bridge vmbr0)",
        "Mapping.Use on /mapping/pci/rtxpro-b0 (hostpci0 (mapping))",
    ):
        assert says in problem, problem
    assert "VM.Config" not in problem and "VM.GuestAgent" not in problem


def test_root_pam_is_not_checked():
    s = contract.spec()
    assert privileges.privilege_paths([s], {"vms": []}) == []
    assert privileges.privilege_problems([s], {"vms": []}, {}) == []


def test_a_token_with_the_documented_privileges_provisions_and_one_without_is_refused_before_any_write(tmp_path):
    acl = documented_acl("9.1.2")
    acl["/vms/203"] = [p for p in acl["/vms/203"] if p != "VM.GuestAgent.Audit"]
    sim = PveSim(ops_cluster("9.1.2", acl))
    with PveSimServer(sim, tmp_path) as server:
        r = Runner(server, tmp_path)
        h = r.hosts()
        del h["gpu-a1"], h["gpu-a2"]
        h["gpu-b1"].update(proxmox_gpu_vm_hugepages="", proxmox_gpu_vm_mmio64_mb=0)
        env = {"PROXMOX_PASSWORD": "", "PROXMOX_USER": "ops@pve", "PROXMOX_TOKEN_ID": "gpufleet"}
        env["PROXMOX_TOKEN_SECRET"] = OPS[1]
        p = r.run("playbooks/provision.yml", env=env)
        assert p.returncode != 0
        out = " ".join(p.stdout.split())
        assert (
            "Refused before any change: gpu-b1: the API token ops@pve!gpufleet lacks VM.GuestAgent.Audit or "
            "VM.GuestAgent.Unrestricted on /vms/203" in out
        ), (p.stdout[-3000:], [w["endpoint"] for w in sim.writes])
        assert sim.writes == []
        assert OPS[1] not in p.stdout + p.stderr
        sim.perms.tokens[OPS[0]]["acl"] = documented_acl("9.1.2")  # granted
        p = r.run("playbooks/provision.yml", env=env)
        assert p.returncode == 0, p.stdout[-3000:]
        assert sim.vms[203]["status"] == "running" and sim.vms[203]["config"]["hostpci0"] == "mapping=rtxpro-b0,pcie=1"
        assert {w["user"] for w in sim.writes} == {OPS[0]}


def test_pvesim_refuses_the_clone_and_efi_disk_the_role_refuses_for_lack_of_a_privilege():
    """Datastore.AllocateSpace and SDN.Use (clone_vm) and the EFI disk's Datastore.AllocateSpace: the role names them
    before any write, and pvesim refuses the very calls tasks/vm.yml would make, as Proxmox VE does."""
    acl = documented_acl("8.4.1")
    del acl["/storage/ceph-vm"], acl["/sdn/zones/localnetwork/vmbr0"]
    sim = PveSim(ops_cluster("8.4.1", acl))
    (problem,) = check(sim, token_spec())
    assert "Datastore.AllocateSpace on /storage/ceph-vm (the clone's disks on that storage, allocating the" in problem
    assert "SDN.Use on /sdn/zones/localnetwork/vmbr0 (the clone of the template's net0 on bridge vmbr0)" in problem
    assert sim.writes == []
    h = {"Authorization": f"PVEAPIToken={OPS[0]}={OPS[1]}"}
    clone = {"newid": "203", "name": "gpu-b1", "full": "1", "storage": "ceph-vm", "target": "pve2"}
    with pytest.raises(ApiError) as e:
        sim.handle("POST", "/nodes/pve1/qemu/9000/clone", clone, h)
    assert e.value.message == "Permission check failed (/storage/ceph-vm, Datastore.AllocateSpace)\n"
    sim.perms.tokens[OPS[0]]["acl"]["/storage/ceph-vm"] = ["Datastore.Audit"]  # sees it, may not allocate
    with pytest.raises(ApiError) as e:
        sim.handle("POST", "/nodes/pve1/qemu/9000/clone", clone, h)
    assert e.value.message == "Permission check failed (/storage/ceph-vm, Datastore.AllocateSpace)\n"
    sim.perms.tokens[OPS[0]]["acl"]["/storage/ceph-vm"] = ["Datastore.AllocateSpace"]
    with pytest.raises(ApiError) as e:
        sim.handle("POST", "/nodes/pve1/qemu/9000/clone", clone, h)
    assert e.value.message == "Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use)\n"
    assert 203 not in sim.vms
    # the EFI disk on a storage the token may not allocate on
    sim.perms.tokens[OPS[0]]["acl"]["/sdn/zones/localnetwork/vmbr0"] = ["SDN.Use"]
    sim.handle("POST", "/nodes/pve1/qemu/9000/clone", clone, h)
    (problem,) = check(sim, token_spec(efidisk_storage="local-lvm"))
    assert "Datastore.AllocateSpace on /storage/local-lvm (allocating the EFI disk on that storage)" in problem
    with pytest.raises(ApiError) as e:
        sim.handle("PUT", "/nodes/pve2/qemu/203/config", {"efidisk0": "local-lvm:1,efitype=4m"}, h)
    assert e.value.message == "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)\n"
