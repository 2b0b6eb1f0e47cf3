"""Simulated host hardware and guests for pvesim clusters: the PCI functions of a GPU node and a cloud-init template.

Shared by the proxmox unit tests (tests/unit/proxmox/cluster.py) and `make proxmox-demo` (tools/proxmox_demo.py), so
both build the same devices: each GPU is alone in its IOMMU group with its audio function, which the hosts bind to
vfio-pci as well (as `options vfio-pci ids=10de:2bb1,10de:22e8` does).
"""

from __future__ import annotations

NVIDIA = ("0x10de", "NVIDIA Corporation")
# Both example nodes: two sockets, one NUMA node each (/sys/devices/system/node/nodeN/cpulist; not in the API)
HOST_NUMA = {0: "0-31,64-95", 1: "32-63,96-127"}


def pci_function(bus: str, iommu: int, cls: str, vendor: tuple[str, str], device: tuple[str, str], **extra) -> dict:
    """One entry of GET /nodes/{node}/hardware/pci: vendor and device as (id, name)."""
    return {
        "id": bus,
        "class": cls,
        "vendor": vendor[0],
        "vendor_name": vendor[1],
        "device": device[0],
        "device_name": device[1],
        **extra,
        "iommugroup": iommu,
    }


def host_bridge() -> dict:
    """The host bridge at 0000:00:00.0 (AMD), in IOMMU group 0."""
    return {"id": "0000:00:00.0", "class": "0x060000", "vendor": "0x1022", "device": "0x14a4", "iommugroup": 0}


def gpu(bus: str, iommu: int) -> dict:
    """An RTX PRO 6000 Blackwell Server Edition (class 0x030000), as a host with these cards lists it."""
    device = ("0x2bb1", "GB202GL [RTX PRO 6000 Blackwell Server Edition]")
    return pci_function(
        bus, iommu, "0x030000", NVIDIA, device, subsystem_vendor="0x10de", subsystem_device="0x204b", mdev=0
    )


def audio(bus: str, iommu: int) -> dict:
    """The GPU's HD audio function (function 1 of the card)."""
    return pci_function(bus, iommu, "0x040300", NVIDIA, ("0x22e8", "GB202 High Definition Audio Controller"))


def nic(bus: str, iommu: int) -> dict:
    """A ConnectX-6 Dx port."""
    mellanox = ("0x15b3", "Mellanox Technologies")
    return pci_function(bus, iommu, "0x020000", mellanox, ("0x101d", "MT2892 Family [ConnectX-6 Dx]"))


def gpu_cards(buses, first_group: int) -> list[dict]:
    """The GPU (function .0) and audio (function .1) of each card bus, card i alone in IOMMU group first_group + i."""
    return [d for i, b in enumerate(buses) for d in (gpu(f"{b}.0", first_group + i), audio(f"{b}.1", first_group + i))]


def vfio_bound(devices: list[dict]) -> dict:
    """The drivers of the audio functions among devices: vfio-pci (the GPUs' own binding is up to the test)."""
    return {d["id"]: "vfio-pci" for d in devices if d["class"] == "0x040300"}


def cloud_template(storage: str, vmid: int = 9000, node: str = "pve1") -> dict:
    """The cloud-init template debian12-cloud, its disks on storage."""
    return {
        "vmid": vmid,
        "node": node,
        "template": 1,
        "config": {
            "name": "debian12-cloud",
            "template": 1,
            "ostype": "l26",
            "scsihw": "virtio-scsi-single",
            "scsi0": f"{storage}:base-{vmid}-disk-0,iothread=1,size=64G",
            "ide2": f"{storage}:vm-{vmid}-cloudinit,media=cdrom",
            "net0": "virtio=BC:24:11:00:90:00,bridge=vmbr0",
            "boot": "order=scsi0",
            "serial0": "socket",
            "vga": "serial0",
            "cores": 2,
            "memory": "2048",
            "agent": "1",
        },
    }
