"""The simulated cluster of the proxmox tests: two GPU nodes, a template on shared storage, a VM owned by someone else.

The devices and the template are pvesim.hardware's (lab/pvesim/hardware.py, which `make proxmox-demo` builds on too);
local-lvm is each node's own storage, ceph-vm is shared.
"""

from __future__ import annotations

from pvesim.hardware import HOST_NUMA, cloud_template, gpu_cards, host_bridge, nic, vfio_bound

PVE1_GPUS = ["0000:81:00", "0000:82:00", "0000:a1:00", "0000:a2:00"]
PVE2_GPUS = ["0000:c1:00", "0000:c2:00"]

TOKEN_ID = "root@pam!gpufleet"
TOKEN_SECRET = "5e5c2e7a-token-secret-must-never-show"
PASSWORD = "pw-must-never-show-7f3a"


def cluster(version: str = "8.4.1") -> dict:
    pve1, pve2 = gpu_cards(PVE1_GPUS, 40), gpu_cards(PVE2_GPUS, 60)
    return {
        "version": version,
        "nodes": {
            "pve1": {
                "pci": [host_bridge(), *pve1, nic("0000:01:00.0", 10)],
                "drivers": vfio_bound(pve1) | {"0000:01:00.0": "mlx5_core"},
                "numa": HOST_NUMA,
            },
            "pve2": {"pci": [host_bridge(), *pve2], "drivers": vfio_bound(pve2), "numa": HOST_NUMA},
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
            cloud_template("ceph-vm"),
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
                            "proxmox_gpu_vm_numa_node": 0,  # 81:00 and 82:00 sit on socket 0
                            "proxmox_gpu_vm_gpus": [{"bus": "0000:81:00.0"}, {"bus": "0000:82:00.0"}],
                        },
                        "gpu-a2": {
                            **common,
                            "proxmox_gpu_vm_node": "pve1",
                            "proxmox_gpu_vm_vmid": 202,
                            "proxmox_gpu_vm_model": "qwen3",
                            "proxmox_gpu_vm_numa_node": 1,  # a1:00 and a2:00 sit on socket 1
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
