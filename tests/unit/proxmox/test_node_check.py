"""playbooks/proxmox_node_check.yml: the read-only check of the Proxmox VE nodes' passthrough prerequisites, against
pvesim (the API: IOMMU groups) and a copy of a node's procfs/sysfs (over the node's connection: here local, with
proxmox_node_check_root pointing at the copy). Asserts what a user reads, and that nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

from cluster import PASSWORD, PVE1_GPUS
from proxmox_runner import Runner

GIB_KB = 1048576
SOCKET = {"0000:81:00": 0, "0000:82:00": 0, "0000:a1:00": 1, "0000:a2:00": 1}  # sysfs numa_node of each card


def node_tree(
    root: Path,
    *,
    cmdline: str,
    modules: list[str],
    drivers: dict[str, str],
    pages: dict[int, int],
    extra: dict[str, tuple[str, int, str]] | None = None,
) -> Path:
    """The files proxmox_node_facts reads, shaped as on a Proxmox VE 8 node with two sockets; extra: other devices,
    bus id -> (class, IOMMU group, driver)."""
    (root / "proc").mkdir(parents=True)
    (root / "proc/cmdline").write_text(cmdline + "\n")
    (root / "proc/modules").write_text("".join(f"{m} 65536 0 - Live 0x0000000000000000\n" for m in modules))
    for m in modules:
        (root / "sys/module" / m).mkdir(parents=True)
    for i, bus in enumerate(PVE1_GPUS):
        group = 40 + i
        (root / f"sys/kernel/iommu_groups/{group}/devices").mkdir(parents=True)
        for fn, cls, dev in ((0, "0x030000", "0x2bb1"), (1, "0x040300", "0x22e8")):
            d = root / f"sys/bus/pci/devices/{bus}.{fn}"
            d.mkdir(parents=True)
            (d / "class").write_text(cls + "\n")
            (d / "vendor").write_text("0x10de\n")
            (d / "device").write_text(dev + "\n")
            (d / "numa_node").write_text(f"{SOCKET[bus]}\n")
            os.symlink(f"../../../../kernel/iommu_groups/{group}", d / "iommu_group")
            driver = drivers.get(f"{bus}.{fn}", "vfio-pci")
            if driver:
                os.symlink(f"../../../../bus/pci/drivers/{driver}", d / "driver")
    for bus, (cls, group, driver) in (extra or {}).items():
        (root / f"sys/kernel/iommu_groups/{group}/devices").mkdir(parents=True, exist_ok=True)
        d = root / f"sys/bus/pci/devices/{bus}"
        d.mkdir(parents=True)
        (d / "class").write_text(cls + "\n")
        (d / "vendor").write_text("0x15b3\n")
        (d / "numa_node").write_text("0\n")
        os.symlink(f"../../../../kernel/iommu_groups/{group}", d / "iommu_group")
        os.symlink(f"../../../../bus/pci/drivers/{driver}", d / "driver")
    for n, cpus in ((0, "0-31,64-95"), (1, "32-63,96-127")):
        d = root / f"sys/devices/system/node/node{n}"
        (d / f"hugepages/hugepages-{GIB_KB}kB").mkdir(parents=True)
        (d / "hugepages/hugepages-2048kB").mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / f"hugepages/hugepages-{GIB_KB}kB/nr_hugepages").write_text(f"{pages.get(n, 0)}\n")
        (d / f"hugepages/hugepages-{GIB_KB}kB/free_hugepages").write_text(f"{pages.get(n, 0)}\n")
        (d / "hugepages/hugepages-2048kB/nr_hugepages").write_text("0\n")
        (d / "hugepages/hugepages-2048kB/free_hugepages").write_text("0\n")
    return root


def with_node(runner: Runner, root: Path) -> None:
    runner.inventory["all"]["children"]["proxmox_nodes"] = {
        "hosts": {"pve1": {"ansible_connection": "local", "proxmox_node_check_root": str(root)}}
    }


def test_a_node_without_the_prerequisites_is_reported_with_each_fix_and_nothing_written(runner: Runner, tmp_path):
    for d in runner.server.sim.nodes["pve2"]["pci"]:
        d["iommugroup"] = -1  # pve2: IOMMU off, seen through the API only (it is not in proxmox_nodes)
    root = node_tree(
        tmp_path / "pve1",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet intel_iommu=on",
        modules=["vfio", "vfio_iommu_type1"],  # vfio_pci missing
        drivers={"0000:a1:00.1": "snd_hda_intel", "0000:81:00.0": "nvidia"},
        pages={0: 64, 1: 0},  # gpu-a1 and gpu-a2 (128 GiB each) are bound to NUMA node 0
        # a host NIC and a root port in gpu-a2's IOMMU group (42)
        extra={"0000:01:00.0": ("0x020000", 42, "mlx5_core"), "0000:a0:01.1": ("0x060400", 42, "pcieport")},
    )
    with_node(runner, root)
    runner.hosts()["gpu-a2"]["proxmox_gpu_vm_numa_node"] = 0  # a1:00 sits on socket 1
    runner.hosts()["gpu-a1"]["proxmox_gpu_vm_gpus"][1]["numa_node"] = 1  # 82:00 sits on socket 0
    p = runner.run("playbooks/proxmox_node_check.yml")
    assert p.returncode != 0
    out = " ".join(p.stdout.split())
    assert "Node prerequisites not met (nothing was changed):" in out
    assert "pve1: vfio modules not loaded: vfio_pci: add vfio, vfio_iommu_type1 and vfio_pci to /etc/modules" in out
    assert (
        "pve1: 0000:01:00.0 (class 0x020000, driven by mlx5_core) shares IOMMU group 42 with 0000:a1:00.0 (gpu-a2): "
        "Proxmox VE binds every device of a passed device's IOMMU group to vfio-pci when the VM starts (qemu-server "
        "PCI.pm prepare_pci_device, pve-common SysFSTools.pm pci_dev_group_bind_to_vfio; bridges are left), so the "
        "node loses 0000:01:00.0 (mlx5_core is unbound: a NIC takes the node's network on it along); put the GPU or "
        "the device in a slot with an IOMMU group of its own" in out
    )
    # the card's own audio function is rebound with it (nothing the host needs), the root port is left alone
    verdict = out.split("Node prerequisites not met (nothing was changed):", 1)[1]
    assert "0000:a1:00.1" not in verdict and "0000:a0:01.1" not in verdict
    assert "pve1: 0000:81:00.0 (gpu-a1) is held by the host driver nvidia: blacklist it" in out
    # gpu-a1 has a GPU on each node (as configured): 64 GiB on each; gpu-a2 128 GiB on node 0
    assert (
        "pve1: NUMA node 0 reserves 64 1 GiB hugepages, the VMs bound to it (gpu-a1 65536 MiB, gpu-a2) need 192: "
        "reserve them at boot" in out
    )
    assert "pve1: NUMA node 1 reserves 0 1 GiB hugepages, the VMs bound to it (gpu-a1 65536 MiB) need 64" in out
    assert (
        "pve1: 0000:a1:00.0 (gpu-a2, proxmox_gpu_vm_gpus[0]) is on NUMA node 1 (sysfs numa_node), but the VM binds it "
        "to node 0 (proxmox_gpu_vm_numa_node): its memory and vCPUs would sit on another node than the GPU; set "
        "proxmox_gpu_vm_numa_node: 1" in out
    )
    assert (
        "pve1: 0000:82:00.0 (gpu-a1, proxmox_gpu_vm_gpus[1]) is on NUMA node 0 (sysfs numa_node), but the VM binds it "
        "to node 1 (proxmox_gpu_vm_gpus[1].numa_node)" in out
    )
    assert "0000:81:00.0 (gpu-a1, proxmox_gpu_vm_gpus[0]) is on" not in out  # right as it is
    assert (
        "pve2: the IOMMU is off (0000:c1:00.0, 0000:c2:00.0 without an IOMMU group): Intel: add intel_iommu=on" in out
    )
    assert "pve2: read through the API only (IOMMU); add the node to group proxmox_nodes" in out
    assert runner.writes() == []
    # GET only, and the login (POST /access/ticket)
    assert {e["endpoint"] for e in runner.server.sim.exchanges if not e["endpoint"].startswith("GET ")} <= {
        "POST /access/ticket"
    }
    assert PASSWORD not in p.stdout + p.stderr


def test_a_ready_node_passes(runner: Runner, tmp_path):
    root = node_tree(
        tmp_path / "pve1",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve ro quiet intel_iommu=on iommu=pt hugepagesz=1G hugepages=512",
        modules=["vfio", "vfio_iommu_type1", "vfio_pci"],
        drivers={},
        pages={0: 256, 1: 256},
    )
    with_node(runner, root)
    runner.inventory["all"]["children"]["proxmox_gpu_vms"]["hosts"].pop("gpu-b1")  # pve2 is not read over SSH
    p = runner.run("playbooks/proxmox_node_check.yml")
    assert p.returncode == 0, p.stdout[-4000:]
    assert "pve1: prerequisites met for the VMs planned on them" in p.stdout
    assert runner.writes() == []


def test_a_device_in_a_gpus_iommu_group_is_named_from_the_api_alone():
    """A node not read over SSH: the API's PCI list shows the group (the drivers it does not show)."""
    from ansible_collections.gpufleet.fleet.plugins.filter.proxmox_node_check import proxmox_node_problems
    from pvesim.hardware import gpu_cards, nic

    pci = [*gpu_cards(["0000:c1:00"], 60), nic("0000:41:00.0", 60)]
    vms = [{"name": "gpu-b1", "node": "pve2", "gpus": [{"mapping": "rtxpro-b0"}], "numa_node": 1}]
    mappings = [{"id": "rtxpro-b0", "map": ["node=pve2,path=0000:c1:00.0,id=10de:2bb1,iommugroup=60"]}]
    (problem,) = proxmox_node_problems("pve2", vms, pci, None, mappings)
    assert problem.startswith(
        "pve2: 0000:41:00.0 (class 0x020000, Mellanox Technologies) shares IOMMU group 60 with 0000:c1:00.0 (gpu-b1) "
        "in the API's PCI list: Proxmox VE binds every device of a passed device's IOMMU group to vfio-pci"
    )
    assert proxmox_node_problems("pve2", vms, pci[:2], None, mappings) == []  # the card alone in its group


def test_a_two_socket_vm_needs_half_its_hugepages_on_each_node():
    """The role binds memory / 2 to each host node of a VM with GPUs on both sockets (numa0, numa1)."""
    from ansible_collections.gpufleet.fleet.plugins.filter.proxmox_node_check import proxmox_node_problems

    vm = {"name": "gpu-a1", "node": "pve1", "memory": 262144, "hugepages": "1024", "numa_node": 0}
    vm["gpus"] = [{"bus": "0000:81:00.0"}, {"bus": "0000:a1:00.0", "numa_node": 1}]
    node = {"hugepages": {str(GIB_KB): {"total": 128, "free": 128}}}
    pci = {
        bus: {"class": "0x030000", "vendor": "0x10de", "driver": "vfio-pci", "iommu_group": group, "numa_node": n}
        for bus, group, n in (("0000:81:00.0", 40, 0), ("0000:a1:00.0", 42, 1))
    }
    facts = {"cmdline": "", "modules": ["vfio", "vfio_iommu_type1", "vfio_pci"], "iommu_groups": 2, "pci": pci}
    assert proxmox_node_problems("pve1", [vm], [], facts | {"numa": {"0": node, "1": node}}) == []
    (short,) = proxmox_node_problems("pve1", [vm], [], facts | {"numa": {"0": node, "1": {"hugepages": {}}}})
    assert short.startswith(
        "pve1: NUMA node 1 reserves 0 1 GiB hugepages, the VMs bound to it (gpu-a1 131072 MiB) need 128"
    )


def test_an_offline_node_and_an_unknown_one_are_named(runner: Runner):
    runner.server.sim.nodes["pve2"]["status"] = "offline"
    runner.hosts()["gpu-a2"]["proxmox_gpu_vm_node"] = "pve9"
    p = runner.run("playbooks/proxmox_node_check.yml")
    assert p.returncode != 0
    out = " ".join(p.stdout.split())
    assert "pve2: the node is offline (GET /nodes), so nothing of it was checked; bring it back online" in out
    assert "pve9: not a node of the cluster (GET /nodes; proxmox_gpu_vm_node of gpu-a2)" in out
    assert runner.writes() == []
