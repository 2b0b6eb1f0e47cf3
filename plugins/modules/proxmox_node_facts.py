#!/usr/bin/python
"""Read-only facts of a Proxmox VE node for GPU passthrough: kernel command line, vfio modules, IOMMU groups,
GPU drivers and hugepages per NUMA node (procfs and sysfs; nothing is written)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_node_facts
short_description: Read a Proxmox VE node's GPU passthrough prerequisites (read-only)
description:
  - Reads, on the node, what the Proxmox VE API does not expose - C(/proc/cmdline), the loaded and built-in
    modules (C(/sys/module), C(/proc/modules)), the IOMMU groups (C(/sys/kernel/iommu_groups)), the driver bound to
    each PCI device (C(/sys/bus/pci/devices/*/driver)) and its NUMA node
    (C(/sys/bus/pci/devices/*/numa_node), which the Proxmox VE API does not expose), and per NUMA node its CPUs and
    hugepages of each size (C(/sys/devices/system/node/node*/)).
  - Writes nothing; check mode safe.
options:
  root:
    description: Root of the file system to read (tests point it at a copy of procfs and sysfs).
    type: path
    default: /
  pci_classes:
    description: >-
      PCI class prefixes whose devices are read (0x03 display, 0x02 network, ...); empty (the default) - every device,
      since a GPU's IOMMU group may hold any device (a NIC, a storage controller) and Proxmox VE takes all of them
      from the host when the VM starts.
    type: list
    elements: str
    default: []
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the node's passthrough prerequisites
  gpufleet.fleet.proxmox_node_facts:
  register: node
"""

RETURN = r"""
node:
  description: >-
    cmdline (str), modules (loaded module names), iommu_groups (count), pci (bus id -> {class, vendor, driver,
    iommu_group, numa_node (-1: the firmware does not say; null: not readable)}), numa ({node: {cpus, hugepages:
    {size_kb: {total, free}}}}).
  returned: always
  type: dict
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def node_facts(root: str, pci_classes: list[str]) -> dict:
    def p(*parts: str) -> str:
        return os.path.join(root, *parts)

    # loaded modules and built-in ones (both have /sys/module/<name>), and /proc/modules for a tree without sysfs
    modules = {line.split()[0] for line in (_read(p("proc/modules")) or "").splitlines() if line.strip()}
    modules = sorted(modules | set(os.listdir(p("sys/module")) if os.path.isdir(p("sys/module")) else []))
    groups_dir = p("sys/kernel/iommu_groups")
    iommu_groups = len(os.listdir(groups_dir)) if os.path.isdir(groups_dir) else 0
    pci = {}
    devices = p("sys/bus/pci/devices")
    for dev in sorted(os.listdir(devices)) if os.path.isdir(devices) else []:
        cls = _read(os.path.join(devices, dev, "class")) or ""
        if pci_classes and not any(cls.startswith(c) for c in pci_classes):
            continue
        driver = os.path.join(devices, dev, "driver")
        group = os.path.join(devices, dev, "iommu_group")
        pci[dev] = {
            "class": cls,
            "vendor": _read(os.path.join(devices, dev, "vendor")) or "",
            "driver": os.path.basename(os.readlink(driver)) if os.path.islink(driver) else "",
            "iommu_group": int(os.path.basename(os.readlink(group))) if os.path.islink(group) else -1,
            "numa_node": _int(_read(os.path.join(devices, dev, "numa_node"))),
        }
    numa = {}
    nodes = p("sys/devices/system/node")
    for name in sorted(os.listdir(nodes)) if os.path.isdir(nodes) else []:
        m = re.fullmatch(r"node(\d+)", name)
        if not m:
            continue
        pages = {}
        hp = os.path.join(nodes, name, "hugepages")
        for size in sorted(os.listdir(hp)) if os.path.isdir(hp) else []:
            sm = re.fullmatch(r"hugepages-(\d+)kB", size)
            if sm:
                total = _read(os.path.join(hp, size, "nr_hugepages"))
                free = _read(os.path.join(hp, size, "free_hugepages"))
                pages[sm.group(1)] = {"total": int(total or 0), "free": int(free or 0)}
        numa[m.group(1)] = {"cpus": _read(os.path.join(nodes, name, "cpulist")) or "", "hugepages": pages}
    return {
        "cmdline": _read(p("proc/cmdline")) or "",
        "modules": modules,
        "iommu_groups": iommu_groups,
        "pci": pci,
        "numa": numa,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            pci_classes=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, node=node_facts(module.params["root"], module.params["pci_classes"]))


if __name__ == "__main__":
    main()
