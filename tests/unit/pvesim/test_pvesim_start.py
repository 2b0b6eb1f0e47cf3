"""Starting a VM in pvesim fails where qemu-server's vm_start (and QEMU's vfio) fail; the task carries the message.
What a start does to the host (the IOMMU group bound to vfio-pci) is kept in the node's `drivers`.

See lab/pvesim/vmstart.py for each rule's source. The VM stays stopped and its pending changes stay pending.
"""

from __future__ import annotations

import pytest
from pvesim_cluster import Client, sim_of

CONFIG, START = "/nodes/pve1/qemu/100/config", "/nodes/pve1/qemu/100/status/start"
GPU_CONF = {"machine": "q35", "memory": "16384"}


def start(client: Client, path: str = START) -> dict:
    return client.task(client("POST", path))


def test_hugepages_without_numa_fail_the_start(root, sim):
    root("PUT", CONFIG, hugepages="1024", **GPU_CONF)
    task = start(root)
    line = {"8.4": 405, "9.1": 388}[sim.schema.release]
    assert task["exitstatus"] == (
        f"numa needs to be enabled to use hugepages at /usr/share/perl5/PVE/QemuServer/Memory.pm line {line}."
    )
    assert sim.vms[100]["status"] == "stopped"
    root("PUT", CONFIG, numa=1, numa0="cpus=0-3,hostnodes=0,memory=16384,policy=bind")
    assert start(root)["exitstatus"] == "OK"


def test_hugepages_with_a_numa_node_without_hostnodes_fail(root, sim):
    root("PUT", CONFIG, hugepages="2", numa=1, numa0="cpus=0-3,memory=16384", **GPU_CONF)
    assert start(root)["exitstatus"].startswith("numa hostnodes need to be defined to use hugepages at ")


def test_no_iommu_fails_the_start(root, sim):
    """pve2 lists every device with iommugroup -1 (no IOMMU): prepare_pci_device refuses."""
    root("PUT", "/nodes/pve2/qemu/200/config", hostpci0="0000:c1:00", machine="q35")
    task = start(root, "/nodes/pve2/qemu/200/status/start")
    assert task["exitstatus"] == "cannot prepare PCI pass-through, IOMMU not present"


def test_gpu_sharing_its_iommu_group_with_a_host_nic_takes_the_nic_from_the_host(root, sim):
    """prepare_pci_device binds every device of the group to vfio-pci (pci_dev_group_bind_to_vfio): the start
    succeeds, and the node's NIC is unbound from mlx5_core."""
    assert sim.nodes["pve1"]["drivers"]["0000:86:00.0"] == "mlx5_core"
    root("PUT", CONFIG, hostpci0="0000:85:00.0,pcie=1", **GPU_CONF)
    assert start(root)["exitstatus"] == "OK"
    assert sim.nodes["pve1"]["drivers"]["0000:86:00.0"] == "vfio-pci"
    assert sim.nodes["pve1"]["drivers"].get("0000:00:00.0") is None  # the host bridge (group 0) is not touched


def test_driver_keep_rebinds_nothing_and_qemu_refuses_the_group(root, sim):
    """9.1's driver=keep skips the binding: QEMU's vfio refuses the group the NIC's driver still holds."""
    if sim.schema.release == "8.4":  # no driver= in 8.4's hostpci format
        e = root.error("PUT", CONFIG, hostpci0="0000:85:00.0,pcie=1,driver=keep", **GPU_CONF)
        assert "invalid key in comma-separated list property: driver" in str(e.errors)
        return
    root("PUT", CONFIG, hostpci0="0000:85:00.0,pcie=1,driver=keep", **GPU_CONF)
    task = start(root)
    assert task["exitstatus"] == "start failed: QEMU exited with code 1"
    log = [line["t"] for line in root("GET", f"/nodes/pve1/tasks/{root('POST', START)}/log")]
    assert "vfio 0000:85:00.0: group 50 is not viable" in log[0]
    assert log[1] == "Please ensure all devices within the iommu_group are bound to their vfio bus driver."
    assert sim.nodes["pve1"]["drivers"]["0000:86:00.0"] == "mlx5_core"


def test_gpu_with_its_own_functions_in_the_group_starts(root, sim):
    root("PUT", CONFIG, hostpci0="0000:81:00.0,pcie=1", **GPU_CONF)
    assert start(root)["exitstatus"] == "OK"


def test_same_gpu_in_two_vms_fails_the_second_start(root, sim):
    root("PUT", CONFIG, hostpci0="0000:81:00.0,pcie=1", **GPU_CONF)
    root("PUT", "/nodes/pve1/qemu/101/config", hostpci0="mapping=rtx-b1,pcie=1", **GPU_CONF)  # the same device
    assert start(root)["exitstatus"] == "OK"
    task = start(root, "/nodes/pve1/qemu/101/status/start")
    assert task["exitstatus"] == "PCI device '0000:81:00.0' already in use by VMID '100'"
    assert sim.vms[101]["status"] == "stopped"


def test_pcie_without_q35_fails(root, sim):
    root("PUT", CONFIG, hostpci0="0000:81:00.0,pcie=1")
    assert start(root)["exitstatus"].startswith("q35 machine model is not enabled at /usr/share/perl5/PVE/QemuServer/")


def test_missing_device_and_mapping_fail(root, sim):
    root("PUT", CONFIG, hostpci0="0000:99:00.0", **GPU_CONF)
    assert start(root)["exitstatus"] == "no PCI device found for '0000:99:00.0'"
    root("PUT", "/nodes/pve2/qemu/200/config", hostpci0="mapping=rtx-b0")
    assert start(root, "/nodes/pve2/qemu/200/status/start")["exitstatus"] == "PCI device mapping not found for 'rtx-b0'"


@pytest.mark.parametrize("version", ["8.4.1", "9.1.2"])
def test_fault_mode_start_fails(version):
    """Named fault mode: the start task of a listed VM fails though its configuration is fine."""
    root = Client(sim_of(version, faults={"start_fails": {"100": "start failed: QEMU exited with code 1"}}))
    assert start(root)["exitstatus"] == "start failed: QEMU exited with code 1"
    assert start(root, "/nodes/pve1/qemu/101/status/start")["exitstatus"] == "OK"
