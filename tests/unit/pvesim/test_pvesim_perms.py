"""pvesim's permission model refuses what Proxmox VE refuses (qemu-server src/PVE/API2/Qemu.pm, see perms.py).

An API token authenticates as `user@realm!name`, never as root@pam, so even a token of root@pam without privilege
separation may not set what only root@pam may: `args`, `hugepages` (in no privilege class of
$check_vm_modify_config_perm), a hostpciN with a raw bus id (check_hostpci_perm). A hostpciN with `mapping=`
needs Mapping.Use on /mapping/pci/<id>.
"""

from __future__ import annotations

import pytest
from pvesim.server import ApiError
from pvesim_cluster import OPS_TOKEN

CONFIG = "/nodes/pve1/qemu/100/config"


def test_root_pam_may_set_raw_bus_ids_args_and_hugepages(root, sim):
    root("PUT", CONFIG, hostpci0="0000:81:00.0,pcie=1", args="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144")
    root("PUT", CONFIG, hugepages="1024")
    assert sim.vms[100]["config"]["hostpci0"] == "0000:81:00.0,pcie=1"


def test_token_may_not_set_a_raw_bus_id(root_token, sim):
    e = root_token.error("PUT", CONFIG, hostpci0="0000:81:00.0,pcie=1")
    assert (e.code, e.message) == (500, "only root can set 'hostpci0' config for non-mapped devices\n")
    assert "hostpci0" not in sim.vms[100]["config"]


def test_token_may_not_set_args_or_hugepages_and_nothing_is_written(root_token, sim):
    e = root_token.error("PUT", CONFIG, args="-x", cores=8)
    assert (e.code, e.message) == (500, "only root can set 'args' config\n")
    e = root_token.error("PUT", CONFIG, hugepages="1024", cores=8)
    assert (e.code, e.message) == (500, "only root can set 'hugepages' config\n")
    assert sim.vms[100]["config"]["cores"] == 4  # $check_vm_modify_config_perm runs before any write


def test_token_may_not_remove_a_raw_bus_id_either(root, root_token, sim):
    root("PUT", CONFIG, hostpci0="0000:81:00.0")
    e = root_token.error("PUT", CONFIG, delete="hostpci0")
    assert e.message == "only root can set 'hostpci0' config for non-mapped devices\n"
    assert sim.vms[100]["config"]["hostpci0"] == "0000:81:00.0"


def test_refused_hostpci_leaves_the_options_written_before_it(root_token, sim):
    """The update loop writes option by option; a hostpciN refused in it leaves what came before (Qemu.pm)."""
    e = root_token.error("PUT", CONFIG, cores=8, hostpci0="0000:81:00.0")
    assert e.code == 500
    assert sim.vms[100]["config"]["cores"] == "8"


def test_mapping_needs_mapping_use_on_that_mapping(ops_token, sim):
    ops_token("PUT", CONFIG, hostpci0="mapping=rtx-b0,pcie=1")
    assert sim.vms[100]["config"]["hostpci0"] == "mapping=rtx-b0,pcie=1"
    e = ops_token.error("PUT", CONFIG, hostpci1="mapping=rtx-b1,pcie=1")
    assert (e.code, e.message) == (403, "Permission check failed (/mapping/pci/rtx-b1, Mapping.Use)\n")


def test_root_token_may_use_mappings(root_token, sim):
    root_token("PUT", CONFIG, hostpci0="mapping=rtx-b1,pcie=1")
    assert sim.vms[100]["config"]["hostpci0"] == "mapping=rtx-b1,pcie=1"


def test_privilege_separated_token_sees_only_its_mappings(ops_token):
    assert [m["id"] for m in ops_token("GET", "/cluster/mapping/pci")] == ["rtx-b0"]


def test_method_permissions_from_the_schema(ops_token):
    """GET /nodes/{node}/hardware/pci needs Sys.Audit or Sys.Modify on / (apidata.js permissions)."""
    e = ops_token.error("GET", "/nodes/pve1/hardware/pci")
    assert (e.code, e.message) == (403, "Permission check failed\n")


def permissions(client, path: str, **params) -> dict:
    """GET /access/permissions?path=<path> as the client (its `path` argument is the URL's)."""
    return client.sim.handle("GET", "/access/permissions", {"path": path, **params}, client.headers)


def test_access_permissions_answer_the_callers_privileges_on_a_path(root, root_token, ops_token, sim):
    """GET /access/permissions?path= (pve-access-control AccessControl.pm permissions): root@pam every privilege of
    the release, a token without privilege separation its user's, a privilege-separated token the intersection."""
    everything = permissions(root, "/vms/100")["/vms/100"]
    assert ("VM.GuestAgent.Audit" in everything) == (sim.schema.release == "9.1")
    assert ("VM.Monitor" in everything) == (sim.schema.release == "8.4")
    assert permissions(root_token, "/vms/100") == {"/vms/100": everything}
    ops = permissions(ops_token, "/vms/100")["/vms/100"]
    assert "VM.Audit" in ops and "Mapping.Use" not in ops
    assert permissions(ops_token, "/mapping/pci/rtx-b0") == {"/mapping/pci/rtx-b0": {"Mapping.Use": 1}}
    assert permissions(ops_token, "/mapping/pci/rtx-b1") == {}  # not the token's
    with pytest.raises(ApiError) as e:
        permissions(ops_token, "/", userid="root@pam")
    assert (e.value.code, e.value.message) == (403, "Permission check failed (/access, Sys.Audit)\n")
    assert sim.writes == []


def grant(sim, path: str, privs: list[str]) -> None:
    """The privilege-separated token and its user ops@pve get exactly `privs` on `path` (the deepest entry wins)."""
    sim.perms.tokens[OPS_TOKEN[0]]["acl"][path] = privs
    sim.perms.users["ops@pve"]["acl"][path] = privs


def test_balloon_above_memory_is_refused_before_any_write(root, sim):
    """qemu-server Qemu.pm update_vm_api (9.1 :2208-2217): 'balloon value too large (must be smaller than assigned
    memory)', checked against the memory set in the same call or the VM's."""
    e = root.error("PUT", CONFIG, balloon=8192, cores=8)  # vm100: memory 4096
    assert (e.code, e.message) == (500, "balloon value too large (must be smaller than assigned memory)\n")
    e = root.error("PUT", CONFIG, memory=16384, balloon=32768)
    assert e.message == "balloon value too large (must be smaller than assigned memory)\n"
    assert sim.vms[100]["config"] == {"name": "vm100", "cores": 4, "memory": "4096"}
    root("PUT", CONFIG, memory=16384, balloon=8192)
    e = root.error("PUT", CONFIG, memory=4096)  # below the balloon now set
    assert e.message == "balloon value too large (must be smaller than assigned memory)\n"
    root("PUT", CONFIG, memory=4096, balloon=0)  # 0: ballooning off


def test_a_clone_needs_datastore_allocatespace_and_sdn_use(ops_token, sim):
    """clone_vm: Datastore.AllocateSpace on the clone's storage for each disk ($check_storage_access_clone) and
    SDN.Use on each NIC's bridge (check_bridge_access -> check_vnet_access), before anything is created."""
    sim.vms[9001]["config"]["net0"] = "virtio=BC:24:11:00:90:01,bridge=vmbr0,tag=20"
    e = ops_token.error("POST", "/nodes/pve1/qemu/9001/clone", newid=300, full=1, storage="ceph-vm")
    assert (e.code, e.message) == (403, "Permission check failed (/storage/ceph-vm, Datastore.AllocateSpace)\n")
    grant(sim, "/storage", ["Datastore.Audit", "Datastore.AllocateSpace"])
    e = ops_token.error("POST", "/nodes/pve1/qemu/9001/clone", newid=300, full=1, storage="ceph-vm")
    assert (e.code, e.message) == (403, "Permission check failed (/sdn/zones/localnetwork/vmbr0/20, SDN.Use)\n")
    assert 300 not in sim.vms
    grant(sim, "/sdn/zones/localnetwork/vmbr0", ["SDN.Use"])
    ops_token("POST", "/nodes/pve1/qemu/9001/clone", newid=300, full=1, storage="ceph-vm")
    assert sim.vms[300]["config"]["scsi0"].startswith("ceph-vm:vm-300-disk-0")


def test_an_efi_disk_needs_datastore_allocatespace_and_vm_config_disk(ops_token, sim):
    """PUT config with a new disk (STORAGE:SIZE): $check_storage_access Datastore.AllocateSpace on the storage
    (Qemu.pm 9.1 :189), then the update's check_drive_perms VM.Config.Disk (:2255)."""
    e = ops_token.error("PUT", CONFIG, efidisk0="local-lvm:1,efitype=4m")
    assert (e.code, e.message) == (403, "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)\n")
    grant(sim, "/storage", ["Datastore.AllocateSpace"])
    grant(sim, "/vms", ["VM.Audit", "VM.Config.HWType"])
    e = ops_token.error("PUT", CONFIG, efidisk0="local-lvm:1,efitype=4m")
    assert (e.code, e.message) == (403, "Permission check failed (/vms/100, VM.Config.Disk)\n")
    assert "efidisk0" not in sim.vms[100]["config"]
