"""pvesim's permission model refuses what Proxmox VE refuses (qemu-server src/PVE/API2/Qemu.pm, see perms.py).

An API token authenticates as `user@realm!name`, never as root@pam, so even a token of root@pam without privilege
separation may not set what only root@pam may: `args`, `hugepages` (in no privilege class of
$check_vm_modify_config_perm), a hostpciN with a raw bus id (check_hostpci_perm). A hostpciN with `mapping=`
needs Mapping.Use on /mapping/pci/<id>.
"""

from __future__ import annotations

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
