"""A small simulated cluster for the pvesim rule tests, and a client that calls the simulator in-process.

pve1: two GPUs, each alone in its IOMMU group with its audio function (both bound to vfio-pci), and a GPU that
shares group 50 with a Mellanox NIC the host uses (mlx5_core). pve2: no IOMMU (every device iommugroup -1).
Storages: local-lvm (not shared) and ceph-vm (shared) on both nodes.
"""

from __future__ import annotations

import copy

from pvesim.server import ApiError, PveSim

ROOT_PW = "root-pw-test"
ROOT_TOKEN = ("root@pam!gpufleet", "root-token-secret")
OPS_TOKEN = ("ops@pve!provision", "ops-token-secret")  # privilege separated: mapping rtx-b0 only


def dev(bus: str, cls: str, group: int, vendor: str = "0x10de", device: str = "0x2bb1") -> dict:
    return {"id": bus, "class": cls, "vendor": vendor, "device": device, "iommugroup": group}


def cluster(version: str = "8.4.1") -> dict:
    vm_privs = ["VM.Audit", "VM.Config.HWType", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options"]
    vm_privs += ["VM.Config.Disk", "VM.Config.Cloudinit", "VM.PowerMgmt", "VM.Allocate", "VM.Clone"]
    return {
        "version": version,
        "nodes": {
            "pve1": {
                "pci": [
                    dev("0000:00:00.0", "0x060000", 0, "0x1022", "0x14a4"),
                    dev("0000:81:00.0", "0x030000", 40),
                    dev("0000:81:00.1", "0x040300", 40, device="0x22e8"),
                    dev("0000:82:00.0", "0x030000", 41),
                    dev("0000:82:00.1", "0x040300", 41, device="0x22e8"),
                    dev("0000:85:00.0", "0x030000", 50),
                    dev("0000:86:00.0", "0x020000", 50, "0x15b3", "0x101d"),  # ConnectX-6 Dx, same group
                ],
                "drivers": {
                    "0000:81:00.1": "vfio-pci",
                    "0000:82:00.1": "vfio-pci",
                    "0000:86:00.0": "mlx5_core",
                },
            },
            "pve2": {"pci": [dev("0000:c1:00.0", "0x030000", -1), dev("0000:c1:00.1", "0x040300", -1)]},
        },
        "storages": {
            "local-lvm": {"type": "lvmthin", "content": "images,rootdir", "shared": 0},
            "ceph-vm": {"type": "rbd", "content": "images", "shared": 1},
        },
        "mappings": [
            {"id": "rtx-b0", "map": ["node=pve1,path=0000:82:00.0,id=10de:2bb1,iommugroup=41"]},
            {"id": "rtx-b1", "map": ["node=pve1,path=0000:81:00.0,id=10de:2bb1,iommugroup=40"]},
        ],
        "users": {"root@pam": ROOT_PW, "ops@pve": {"password": "x", "acl": {"/": [*vm_privs, "Mapping.Use"]}}},
        "tokens": {
            ROOT_TOKEN[0]: ROOT_TOKEN[1],
            OPS_TOKEN[0]: {
                "secret": OPS_TOKEN[1],
                "privsep": 1,
                "acl": {"/vms": vm_privs, "/mapping/pci/rtx-b0": ["Mapping.Use"], "/storage": ["Datastore.Audit"]},
            },
        },
        "vms": [
            {
                "vmid": 9000,
                "node": "pve1",
                "template": 1,
                "config": {"name": "tmpl-local", "template": 1, "scsi0": "local-lvm:base-9000-disk-0,size=8G"},
            },
            {
                "vmid": 9001,
                "node": "pve1",
                "template": 1,
                "config": {"name": "tmpl-shared", "template": 1, "scsi0": "ceph-vm:base-9001-disk-0,size=8G"},
            },
            {"vmid": 100, "node": "pve1", "config": {"name": "vm100", "cores": 4, "memory": "4096"}},
            {"vmid": 101, "node": "pve1", "config": {"name": "vm101", "cores": 4, "memory": "4096"}},
            {"vmid": 200, "node": "pve2", "config": {"name": "vm200", "cores": 4, "memory": "4096"}},
        ],
    }


class Client:
    """Calls PveSim.handle as one authenticated caller (root@pam ticket, or a token)."""

    def __init__(self, sim: PveSim, token: tuple[str, str] | None = None):
        self.sim = sim
        if token:
            self.headers = {"Authorization": f"PVEAPIToken={token[0]}={token[1]}"}
        else:
            t = sim.handle("POST", "/access/ticket", {"username": "root@pam", "password": ROOT_PW}, {})
            self.headers = {"Cookie": f"PVEAuthCookie={t['ticket']}", "CSRFPreventionToken": t["CSRFPreventionToken"]}

    def __call__(self, method: str, path: str, **params):
        return self.sim.handle(method, path, {k: str(v) for k, v in params.items()}, self.headers)

    def error(self, method: str, path: str, **params) -> ApiError:
        try:
            self(method, path, **params)
        except ApiError as e:
            return e
        raise AssertionError(f"{method} {path} {params} was accepted")

    def task(self, upid: str) -> dict:
        node = upid.split(":")[1]
        return self("GET", f"/nodes/{node}/tasks/{upid}/status")


def sim_of(version: str = "8.4.1", **changes) -> PveSim:
    c = copy.deepcopy(cluster(version))
    c.update(changes)
    return PveSim(c)
