"""Cloning in pvesim: a clone to another node needs shared storage, as qemu-server's clone_vm requires."""

from __future__ import annotations

CLONE = "/nodes/pve1/qemu/{}/clone"


def test_cross_node_clone_of_a_template_on_local_storage_is_refused(root, sim):
    e = root.error("POST", CLONE.format(9000), newid=300, name="x", full=1, target="pve2")
    assert (e.code, e.message) == (500, "can't clone VM to node 'pve2' (VM uses local storage)\n")
    assert 300 not in sim.vms


def test_cross_node_clone_to_non_shared_storage_is_refused(root, sim):
    e = root.error("POST", CLONE.format(9001), newid=300, name="x", full=1, target="pve2", storage="local-lvm")
    assert (e.code, e.message) == (500, "can't clone to non-shared storage 'local-lvm'\n")


def test_cross_node_clone_on_shared_storage_works(root, sim):
    upid = root("POST", CLONE.format(9001), newid=300, name="x", full=1, target="pve2", storage="ceph-vm")
    assert root.task(upid)["exitstatus"] == "OK"
    assert sim.vms[300]["node"] == "pve2" and sim.vms[300]["config"]["scsi0"].startswith("ceph-vm:vm-300-disk-0")


def test_same_node_clone_from_local_storage_works(root, sim):
    root("POST", CLONE.format(9000), newid=300, name="x", full=1, storage="local-lvm")
    assert sim.vms[300]["node"] == "pve1"


def test_storage_for_images_only_and_not_for_linked_clones(root, sim):
    sim.storages["iso"] = {"type": "dir", "content": "iso", "shared": 0}
    sim.nodes["pve1"]["storage"] = ["local-lvm", "ceph-vm", "iso"]
    e = root.error("POST", CLONE.format(9000), newid=300, full=1, storage="iso")
    assert e.errors == {"storage": "storage 'iso' does not support vm images"}
    e = root.error("POST", CLONE.format(9000), newid=300, full=0, storage="local-lvm")
    assert e.message == "parameter 'storage' not allowed for linked clones\n"
