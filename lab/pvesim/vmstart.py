"""Starting a VM in pvesim: what qemu-server's vm_start refuses about PCI passthrough, hugepages and NUMA.

Sources (line numbers: qemu-server 41ffc59e 9.1.19 / 5ccd363e 8.4.10, installed as /usr/share/perl5/PVE/...):
- config_to_command (QemuServer.pm:3091) parses every hostpciN first (PCI.pm parse_hostpci_devices 497-540 /
  488-531): a mapping without a device on this node dies "PCI device mapping not found for '<id>'" (447 / 438), a
  bus id without a device "no PCI device found for '<id>'" (469 / 460), `pcie=1` without q35 dies "q35 machine
  model is not enabled" (510 / 501, no newline: Perl adds " at <file> line <n>."), one device in two hostpciN
  "device '<id>' assigned more than once" (556 / 585); a device a *running* VM holds: "PCI device '<id>' already
  in use by VMID '<vmid>'" (reserve_pci_usage, 832 / 853).
- Then the memory (QemuServer.pm:3430 Memory::config): hugepages without `numa: 1` die "numa needs to be enabled
  to use hugepages" (Memory.pm 388 / 405, no newline), a NUMA node without hostnodes with hugepages "numa
  hostnodes need to be defined to use hugepages" (430 / 447, no newline).
- prepare_pci_device (PCI.pm 711 / 733): without an IOMMU (the node lists iommugroup -1) "cannot prepare PCI
  pass-through, IOMMU not present".
- QEMU itself: a passed device whose IOMMU group holds a device still bound to a host driver fails in
  vfio_group_get (qemu hw/vfio/container-legacy.c, commit abe80c8a: "group %d is not viable" + "Please ensure
  all devices within the iommu_group are bound to their vfio bus driver."); qemu-server then dies "QEMU exited
  with code 1" (QemuServer.pm 5817 / 6307) wrapped as "start failed: ..." (5860 / 6350).
The task ends with the message as its exitstatus (like a real failed task); the VM stays stopped.
"""

from __future__ import annotations

import re

from pvesim.schema import parse_boolean

PERL_LINES = {  # release -> (file, line) of the dies without a trailing newline
    "9.1": {"q35": ("PCI.pm", 510), "hugepages": ("Memory.pm", 388), "hostnodes": ("Memory.pm", 430)},
    "8.4": {"q35": ("PCI.pm", 501), "hugepages": ("Memory.pm", 405), "hostnodes": ("Memory.pm", 447)},
}
VFIO_OK = {"vfio-pci", "pci-stub", None}  # drivers a viable group may have (no driver: fine too)


class StartError(Exception):
    def __init__(self, message: str, log: list[str] | None = None):
        super().__init__(message)
        self.message, self.log = message, log or []


def _props(value: str) -> dict:
    out = {}
    for part in value.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
        elif part:
            out["host"] = part
    return out


class StartMixin:
    def _perl_die(self, key: str, msg: str) -> str:
        file, line = PERL_LINES[self.schema.release][key]
        return f"{msg} at /usr/share/perl5/PVE/QemuServer/{file} line {line}."

    def _devices(self, node: str, host: str) -> list[dict]:
        """PVE::SysFSTools::lspci: a bus id without function names every function of the slot."""
        out = []
        for hid in host.split(";"):
            full = hid if hid.count(":") == 2 else "0000:" + hid
            out += [d for d in self.nodes[node]["pci"] if d["id"] == full or d["id"].startswith(full + ".")]
        return out

    def _hostpci_ids(self, vm: dict, conf: dict) -> dict[str, list[dict]]:
        """hostpciN -> the node's devices it names (parse_hostpci); raises StartError like vm_start."""
        node, out = vm["node"], {}
        q35 = re.match(r"^(?:type=)?(?:q35|pc-q35-)", str(conf.get("machine", ""))) is not None
        for i in range(self.schema.index_max["hostpci"]["count"]):
            key = f"hostpci{i}"
            if not conf.get(key):
                continue
            opts = _props(conf[key])
            if "host" in opts and "mapping" in opts:
                raise StartError("Cannot set both 'host' and 'mapping'.")
            if "mapping" in opts:
                mp = next((m for m in self.mappings if m["id"] == opts["mapping"]), None)
                paths = [dict(e.split("=", 1) for e in entry.split(",")) for entry in (mp or {}).get("map", [])]
                host = next((p["path"] for p in paths if p.get("node") == node), None)
                if host is None:
                    raise StartError(f"PCI device mapping not found for '{opts['mapping']}'")
            else:
                host = opts["host"]
            devs = []
            for hid in host.split(";"):
                found = self._devices(node, hid)
                if not found:
                    raise StartError(f"no PCI device found for '{hid}'")
                devs += found
            if parse_boolean(opts.get("pcie", "0")) and not q35:
                raise StartError(self._perl_die("q35", "q35 machine model is not enabled"))
            out[key] = devs
        used: set[str] = set()
        for devs in out.values():
            for d in devs:
                if d["id"] in used:
                    raise StartError(f"device '{d['id']}' assigned more than once")
                used.add(d["id"])
        return out

    def start_problem(self, vm: dict, conf: dict) -> StartError | None:
        try:
            self._start_checks(vm, conf)
        except StartError as e:
            return e
        return None

    def _start_checks(self, vm: dict, conf: dict) -> None:
        fault = self.faults.get("start_fails", {}).get(str(vm["vmid"]))
        devices = self._hostpci_ids(vm, conf)
        mine = {d["id"] for devs in devices.values() for d in devs}
        for other in self.vms.values():
            if other is vm or other["status"] != "running" or other["node"] != vm["node"]:
                continue
            theirs = {d["id"] for devs in self._hostpci_ids(other, other["config"]).values() for d in devs}
            for dev in sorted(mine & theirs):
                raise StartError(f"PCI device '{dev}' already in use by VMID '{other['vmid']}'")
        if conf.get("hugepages") and not parse_boolean(str(conf.get("numa", "0"))):
            raise StartError(self._perl_die("hugepages", "numa needs to be enabled to use hugepages"))
        if conf.get("hugepages"):
            for i in range(self.schema.index_max["numa"]["count"]):
                if conf.get(f"numa{i}") and "hostnodes" not in _props(conf[f"numa{i}"]):
                    raise StartError(self._perl_die("hostnodes", "numa hostnodes need to be defined to use hugepages"))
        if any(d["iommugroup"] == -1 for d in self.nodes[vm["node"]]["pci"]) and mine:
            raise StartError("cannot prepare PCI pass-through, IOMMU not present")
        drivers = self.nodes[vm["node"]].get("drivers", {})
        for key, devs in sorted(devices.items()):
            for dev in devs:
                group = [
                    d
                    for d in self.nodes[vm["node"]]["pci"]
                    if d["iommugroup"] == dev["iommugroup"] and d["id"] not in mine
                ]
                if any(drivers.get(d["id"]) not in VFIO_OK and not d["class"].startswith("0x0604") for d in group):
                    raise StartError(
                        "start failed: QEMU exited with code 1",
                        [
                            f"kvm: -device vfio-pci,host={dev['id']},id={key}: vfio {dev['id']}: group "
                            f"{dev['iommugroup']} is not viable",
                            "Please ensure all devices within the iommu_group are bound to their vfio bus driver.",
                        ],
                    )
        if fault:  # fault mode start_fails: the start task fails although the configuration is fine
            raise StartError(fault)
