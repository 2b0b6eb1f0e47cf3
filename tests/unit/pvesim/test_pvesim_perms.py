"""pvesim's permission model refuses what Proxmox VE refuses (qemu-server src/PVE/API2/Qemu.pm, see perms.py).

An API token authenticates as `user@realm!name`, never as root@pam, so even a token of root@pam without privilege
separation may not set what only root@pam may: `args`, `hugepages` (in no privilege class of
$check_vm_modify_config_perm), a hostpciN with a raw bus id (check_hostpci_perm). A hostpciN with `mapping=`
needs Mapping.Use on /mapping/pci/<id>.
"""

from __future__ import annotations

import pytest
from pvesim.server import ApiError

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
