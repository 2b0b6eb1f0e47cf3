"""Starting a VM in pvesim: what qemu-server's vm_start refuses about PCI passthrough, hugepages and NUMA.

Sources (line numbers: qemu-server 41ffc59e 9.1.19 / 5ccd363e 8.4.10, installed as /usr/share/perl5/PVE/...):
- config_to_command (QemuServer.pm:3091) parses every hostpciN first (PCI.pm parse_hostpci_devices 497-540 /
  488-531): a mapping without a device on this node dies "PCI device mapping not found for '<id>'" (447 / 438), a
  bus id without a device "no PCI device found for '<id>'" (469 / 460), `pcie=1` without q35 dies "q35 machine
  model is not enabled" (510 / 501, no newline: Perl adds " at <file> line <n>."), one device in two hostpciN
  "device '<id>' assigned more than once" (556 / 585); a device a *running* VM holds: "PCI device '<id>' already
  in use by VMID '<vmid>'" (reserve_pci_usage, 832 / 853).
- A mapping is a pool when it has several entries for the node (each entry's `path` one device or `a;b`, devices
  passed together): parse_hostpci (PCI.pm 431-485 / 422-476) makes one alternative per entry, and
  choose_hostpci_devices (547-616 / 573-638) takes, per hostpciN in order, the first alternative none of whose
  devices an earlier hostpciN of the VM took nor a running VM holds (reserve_pci_usage), else dies "could not find
  a free device for 'hostpciN'" (613 / 635). A single alternative is taken as is (and a running VM holding it
  fails the start below). What a running VM holds is what its start chose (`pci_chosen`), as PVE's reservation
  file records it.
- Then the memory (QemuServer.pm:3430 Memory::config): hugepages without `numa: 1` die "numa needs to be enabled
  to use hugepages" (Memory.pm 388 / 405, no newline), a NUMA node without hostnodes with hugepages "numa
  hostnodes need to be defined to use hugepages" (430 / 447, no newline), a host node the host lacks "host NUMA
  node<N> doesn't exist" (print_numa_hostnodes 513 / 530; the host's nodes are the cluster's per-node `numa`,
  {node: cpu list}, from sysfs, not in the API; default one node 0 with CPUs 0-63), NUMA memory not summing to
  the VM's "total memory for NUMA nodes must be equal to vm static memory" (437 / 454); with hugepages, a NUMA
  node bound to more than one host node "more than 1 hostnode value in numa node is not supported when hugepages
  are enabled" (hugepages_topology 629 / 646, no newline).
- `affinity` runs QEMU under `taskset --cpu-list --all-tasks <affinity>` (QemuServer.pm 3188-3189 / 3697): a set
  with none of the host's CPUs fails (sched_setaffinity EINVAL: util-linux taskset "failed to set pid 0's
  affinity: Invalid argument"), a set with some of them is cut to those, as the kernel does.
- prepare_pci_device (PCI.pm 707-730 / 729-751): without an IOMMU (the node lists iommugroup -1) "cannot prepare
  PCI pass-through, IOMMU not present" (711 / 733); otherwise, unless the entry has `mdev` or `driver=keep`
  (9.1 only), it binds **every device of the passed device's IOMMU group** to vfio-pci (722-723 / 743-744,
  pve-common src/PVE/SysFSTools.pm pci_dev_group_bind_to_vfio, 5054082 (9.1.21) 370-399 / stable-bookworm
  9196280 (8.3.8) 344-373: each device of iommu_group/devices but bridges, `next if -e .../pci_bus`, unbound from
  its driver and bound to vfio-pci). So a NIC in a GPU's group loses its host driver and the start goes on: here
  the node's `drivers` entry of each such device becomes vfio-pci (bridges, class 0x0604, are left).
- QEMU itself, for a `driver=keep` entry (nothing rebound): a passed device whose IOMMU group holds a device still
  bound to a host driver fails in vfio_group_get (qemu hw/vfio/container-legacy.c, commit abe80c8a: "group %d is
  not viable" + "Please ensure all devices within the iommu_group are bound to their vfio bus driver.");
  qemu-server then dies "QEMU exited with code 1" (QemuServer.pm 5817 / 6307) wrapped as "start failed: ..."
  (5860 / 6350).
The task ends with the message as its exitstatus (like a real failed task); the VM stays stopped.
"""

from __future__ import annotations

import re

from pvesim.schema import parse_boolean

PERL_LINES = {  # release -> (file, line) of the dies without a trailing newline
    "9.1": {
        "q35": ("PCI.pm", 510),
        "hugepages": ("Memory.pm", 388),
        "hostnodes": ("Memory.pm", 430),
        "one_hostnode": ("Memory.pm", 629),
    },
    "8.4": {
        "q35": ("PCI.pm", 501),
        "hugepages": ("Memory.pm", 405),
        "hostnodes": ("Memory.pm", 447),
        "one_hostnode": ("Memory.pm", 646),
    },
}
VFIO_OK = {"vfio-pci", "pci-stub", None}  # drivers a viable group may have (no driver: fine too)
DEFAULT_HOST_NUMA = {0: "0-63"}  # a node without `numa` in the cluster: one NUMA node, 64 CPUs


def _cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in str(text).split(","):
        a, _, b = part.strip().partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


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

    def host_numa(self, node: str) -> dict[int, set[int]]:
        """The host's NUMA nodes and their CPUs (sysfs /sys/devices/system/node/nodeN/cpulist)."""
        topo = self.nodes[node].get("numa") or DEFAULT_HOST_NUMA
        return {int(k): _cpus(v) for k, v in topo.items()}

    def _held(self, vm: dict) -> dict[str, int]:
        """Device id -> vmid of what the other running VMs of the node hold (their start's choice)."""
        held: dict[str, int] = {}
        for other in self.vms.values():
            if other is vm or other["status"] != "running" or other["node"] != vm["node"]:
                continue
            chosen = other.get("pci_chosen")
            if chosen is None:
                chosen = [d["id"] for devs in self._hostpci_ids(other, other["config"], {}).values() for d in devs]
            held.update({d: other["vmid"] for d in chosen})
        return held

    def _hostpci_ids(self, vm: dict, conf: dict, held: dict[str, int]) -> dict[str, list[dict]]:
        """hostpciN -> the node's devices it gets (parse_hostpci + choose_hostpci_devices); raises StartError."""
        node, out, used = vm["node"], {}, set()
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
                entries = [dict(e.split("=", 1) for e in entry.split(",")) for entry in (mp or {}).get("map", [])]
                hosts = [e["path"] for e in entries if e.get("node") == node and e.get("path")]
                if not hosts:
                    raise StartError(f"PCI device mapping not found for '{opts['mapping']}'")
            else:
                hosts = [opts["host"]]
            alternatives = []
            for host in hosts:
                devs = []
                for hid in host.split(";"):
                    found = self._devices(node, hid)
                    if not found:
                        raise StartError(f"no PCI device found for '{hid}'")
                    devs += found
                alternatives.append(devs)
            if parse_boolean(opts.get("pcie", "0")) and not q35:
                raise StartError(self._perl_die("q35", "q35 machine model is not enabled"))
            if len(alternatives) == 1:
                chosen = alternatives[0]
            else:
                chosen = next((a for a in alternatives if not any(d["id"] in used or d["id"] in held for d in a)), None)
                if chosen is None:
                    raise StartError(f"could not find a free device for '{key}'")
            for d in chosen:
                if d["id"] in used:
                    raise StartError(f"device '{d['id']}' assigned more than once")
                used.add(d["id"])
            out[key] = chosen
        return out

    def _numa_checks(self, vm: dict, conf: dict) -> None:
        """Memory::config's NUMA checks (Memory.pm 386-460 / 403-477) and hugepages_topology's (629 / 646)."""
        if not parse_boolean(str(conf.get("numa", "0"))):
            return
        host = self.host_numa(vm["node"])
        total = 0
        for i in range(self.schema.index_max["numa"]["count"]):
            if not conf.get(f"numa{i}"):
                continue
            numa = _props(conf[f"numa{i}"])
            if not numa.get("memory"):
                raise StartError(f"missing NUMA node{i} memory value")
            total += int(float(numa["memory"]))
            nodes = sorted(_cpus(numa["hostnodes"].replace(";", ","))) if numa.get("hostnodes") else []
            for n in nodes:
                if n not in host:
                    raise StartError(f"host NUMA node{n} doesn't exist")
            if nodes and not numa.get("policy"):
                raise StartError(f"you need to define a policy for hostnode {numa['hostnodes']}")
            # hugepages_topology: print_numa_hostnodes' string must match /^(\d)$/ (one host node, one digit)
            if conf.get("hugepages") and not re.fullmatch(r"\d", ",".join(numa.get("hostnodes", "").split(";"))):
                msg = "more than 1 hostnode value in numa node is not supported when hugepages are enabled"
                raise StartError(self._perl_die("one_hostnode", msg))
        memory = int(str(conf.get("memory", "512")).split(",")[0].replace("current=", ""))
        if total and total != memory:
            raise StartError("total memory for NUMA nodes must be equal to vm static memory")

    def _affinity_check(self, vm: dict, conf: dict) -> None:
        if not conf.get("affinity"):
            return
        cpus = _cpus(conf["affinity"])
        if not cpus & set().union(*self.host_numa(vm["node"]).values()):
            raise StartError(
                f"start failed: command '/usr/bin/taskset --cpu-list --all-tasks {conf['affinity']} /usr/bin/kvm "
                f"-id {vm['vmid']} ...' failed: exit code 1",
                ["taskset: failed to set pid 0's affinity: Invalid argument"],
            )

    def start_problem(self, vm: dict, conf: dict) -> StartError | None:
        try:
            self._start_checks(vm, conf)
        except StartError as e:
            return e
        return None

    def _start_checks(self, vm: dict, conf: dict) -> None:
        fault = self.faults.get("start_fails", {}).get(str(vm["vmid"]))
        held = self._held(vm)
        devices = self._hostpci_ids(vm, conf, held)
        mine = {d["id"] for devs in devices.values() for d in devs}
        for dev in sorted(mine & set(held)):
            raise StartError(f"PCI device '{dev}' already in use by VMID '{held[dev]}'")
        if conf.get("hugepages") and not parse_boolean(str(conf.get("numa", "0"))):
            raise StartError(self._perl_die("hugepages", "numa needs to be enabled to use hugepages"))
        if conf.get("hugepages"):
            for i in range(self.schema.index_max["numa"]["count"]):
                if conf.get(f"numa{i}") and "hostnodes" not in _props(conf[f"numa{i}"]):
                    raise StartError(self._perl_die("hostnodes", "numa hostnodes need to be defined to use hugepages"))
        self._numa_checks(vm, conf)
        if any(d["iommugroup"] == -1 for d in self.nodes[vm["node"]]["pci"]) and mine:
            raise StartError("cannot prepare PCI pass-through, IOMMU not present")
        drivers = self.nodes[vm["node"]].setdefault("drivers", {})
        rebind = set()
        for key, devs in sorted(devices.items()):
            opts = _props(conf[key])
            for dev in devs:
                group = [
                    d
                    for d in self.nodes[vm["node"]]["pci"]
                    if d["iommugroup"] == dev["iommugroup"] and not d["class"].startswith("0x0604")
                ]
                if not opts.get("mdev") and opts.get("driver", "vfio") != "keep":
                    rebind.update(d["id"] for d in group)  # pci_dev_group_bind_to_vfio: the whole group
                    continue
                group = [d for d in group if d["id"] not in mine]
                if any(drivers.get(d["id"]) not in VFIO_OK for d in group):
                    raise StartError(
                        "start failed: QEMU exited with code 1",
                        [
                            f"kvm: -device vfio-pci,host={dev['id']},id={key}: vfio {dev['id']}: group "
                            f"{dev['iommugroup']} is not viable",
                            "Please ensure all devices within the iommu_group are bound to their vfio bus driver.",
                        ],
                    )
        for dev in sorted(rebind):  # prepare_pci_device runs before QEMU: the host's drivers are unbound for good
            drivers[dev] = "vfio-pci"
        self._affinity_check(vm, conf)
        vm["_pci_next"] = sorted(mine)
        if fault:  # fault mode start_fails: the start task fails although the configuration is fine
            raise StartError(fault)
