"""The simulated cluster of the proxmox tests: two GPU nodes, a template on shared storage, a VM owned by someone else.

Every GPU is alone in its IOMMU group with its audio function, which the hosts bind to vfio-pci as well (as
`options vfio-pci ids=10de:2bb1,10de:22e8` does); local-lvm is each node's own storage, ceph-vm is shared.
"""

from __future__ import annotations


def gpu(bus: str, iommu: int) -> dict:
    # Shape of GET /nodes/{node}/hardware/pci on a host with RTX PRO 6000 Blackwell cards (class 0x030000).
    return {
        "id": bus,
        "class": "0x030000",
        "vendor": "0x10de",
        "vendor_name": "NVIDIA Corporation",
        "device": "0x2bb1",
        "device_name": "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
        "subsystem_vendor": "0x10de",
        "subsystem_device": "0x204b",
        "iommugroup": iommu,
        "mdev": 0,
    }


def audio(bus: str, iommu: int) -> dict:
    return {
        "id": bus,
        "class": "0x040300",
        "vendor": "0x10de",
        "vendor_name": "NVIDIA Corporation",
        "device": "0x22e8",
        "device_name": "GB202 High Definition Audio Controller",
        "iommugroup": iommu,
    }


PVE1_GPUS = ["0000:81:00", "0000:82:00", "0000:a1:00", "0000:a2:00"]
# Both nodes: two sockets, one NUMA node each (/sys/devices/system/node/nodeN/cpulist; not in the API)
HOST_NUMA = {0: "0-31,64-95", 1: "32-63,96-127"}
PVE2_GPUS = ["0000:c1:00", "0000:c2:00"]

TOKEN_ID = "root@pam!gpufleet"
TOKEN_SECRET = "5e5c2e7a-token-secret-must-never-show"
PASSWORD = "pw-must-never-show-7f3a"


def nic(bus: str, iommu: int) -> dict:
    return {
        "id": bus,
        "class": "0x020000",
        "vendor": "0x15b3",
        "vendor_name": "Mellanox Technologies",
        "device": "0x101d",
        "device_name": "MT2892 Family [ConnectX-6 Dx]",
        "iommugroup": iommu,
    }


def cluster(version: str = "8.4.1") -> dict:
    pve1 = [d for i, b in enumerate(PVE1_GPUS) for d in (gpu(b + ".0", 40 + i), audio(b + ".1", 40 + i))]
    pve2 = [d for i, b in enumerate(PVE2_GPUS) for d in (gpu(b + ".0", 60 + i), audio(b + ".1", 60 + i))]
    base = {"id": "0000:00:00.0", "class": "0x060000", "vendor": "0x1022", "device": "0x14a4", "iommugroup": 0}
    vfio = lambda devs: {d["id"]: "vfio-pci" for d in devs if d["class"] == "0x040300"}  # noqa: E731
    return {
        "version": version,
        "nodes": {
            "pve1": {
                "pci": [base, *pve1, nic("0000:01:00.0", 10)],
                "drivers": vfio(pve1) | {"0000:01:00.0": "mlx5_core"},
                "numa": HOST_NUMA,
            },
            "pve2": {"pci": [base, *pve2], "drivers": vfio(pve2), "numa": HOST_NUMA},
        },
        "storages": {
            "local-lvm": {"type": "lvmthin", "content": "images,rootdir", "shared": 0},
            "ceph-vm": {"type": "rbd", "content": "images", "shared": 1},
        },
        "mappings": [
            {
                "id": "rtxpro-b0",
                "description": "pve2 GPU 0",
                "map": ["node=pve2,path=0000:c1:00.0,id=10de:2bb1,iommugroup=60"],
            },
            {
                "id": "rtxpro-b1",
                "description": "pve2 GPU 1",
                "map": ["node=pve2,path=0000:c2:00.0,id=10de:2bb1,iommugroup=61"],
            },
        ],
        "users": {"root@pam": PASSWORD},
        "tokens": {TOKEN_ID: TOKEN_SECRET},
        "vms": [
            {
                "vmid": 9000,
                "node": "pve1",
                "template": 1,
                "config": {
                    "name": "debian12-cloud",
                    "template": 1,
                    "ostype": "l26",
                    "scsihw": "virtio-scsi-single",
                    "scsi0": "ceph-vm:base-9000-disk-0,iothread=1,size=64G",
                    "ide2": "ceph-vm:vm-9000-cloudinit,media=cdrom",
                    "net0": "virtio=BC:24:11:00:90:00,bridge=vmbr0",
                    "boot": "order=scsi0",
                    "serial0": "socket",
                    "vga": "serial0",
                    "cores": 2,
                    "memory": "2048",
                    "agent": "1",
                },
            },
            {
                "vmid": 150,
                "node": "pve2",
                "status": "running",
                "config": {
                    "name": "db01",
                    "cores": 4,
                    "memory": "8192",
                    "tags": "database",
                    "scsi0": "local-lvm:vm-150-disk-0,size=32G",
                },
            },
        ],
    }


def inventory(port: int) -> dict:
    common = {
        "proxmox_gpu_vm_template": "debian12-cloud",
        "proxmox_gpu_vm_template_node": "pve1",
        "proxmox_gpu_vm_cores": 16,
        "proxmox_gpu_vm_memory_mib": 131072,
        "proxmox_gpu_vm_gpu_class": "rtx-pro-6000",
        "proxmox_gpu_vm_sshkeys": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpufleetTestKey ops@gpufleet",
    }
    return {
        "all": {
            "vars": {
                "proxmox_gpu_vm_api_host": "127.0.0.1",
                "proxmox_gpu_vm_api_port": port,
                "proxmox_gpu_vm_validate_certs": False,
                "proxmox_gpu_vm_task_timeout": 10,
                "proxmox_gpu_vm_agent_timeout": 10,
                "ansible_connection": "local",
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            },
            "children": {
                "proxmox_gpu_vms": {
                    "hosts": {
                        "gpu-a1": {
                            **common,
                            "proxmox_gpu_vm_node": "pve1",
                            "proxmox_gpu_vm_vmid": 201,
                            "proxmox_gpu_vm_model": "glm5",
                            "proxmox_gpu_vm_gpus": [{"bus": "0000:81:00.0"}, {"bus": "0000:82:00.0"}],
                        },
                        "gpu-a2": {
                            **common,
                            "proxmox_gpu_vm_node": "pve1",
                            "proxmox_gpu_vm_vmid": 202,
                            "proxmox_gpu_vm_model": "qwen3",
                            "proxmox_gpu_vm_gpus": [{"bus": "0000:a1:00.0"}],
                        },
                        "gpu-b1": {
                            **common,
                            "proxmox_gpu_vm_node": "pve2",
                            "proxmox_gpu_vm_vmid": 203,
                            "proxmox_gpu_vm_model": "glm5",
                            "proxmox_gpu_vm_numa_node": 1,
                            "proxmox_gpu_vm_storage": "ceph-vm",  # a clone to another node needs shared storage
                            "proxmox_gpu_vm_gpus": [{"mapping": "rtxpro-b0"}, {"mapping": "rtxpro-b1"}],
                        },
                    }
                }
            },
        }
    }
