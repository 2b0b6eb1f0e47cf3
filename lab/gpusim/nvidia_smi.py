#!/usr/bin/python3
"""gpufleet lab simulator: this is not NVIDIA's nvidia-smi.

A stand-in for ``nvidia-smi`` on gpufleet *lab* hosts, which have no GPU.  The lab tool
installs this single stdlib-only file as ``/usr/bin/nvidia-smi``.  It prints what the real
tool prints, in the real formats (tabs, ANSI underline, table widths, error texts and exit
codes), for a simulated machine described by a profile directory:

* ``$GPUSIM_PROFILE_DIR`` (default ``/etc/gpusim/profile``): ``profile.json`` plus optional
  ``captures/`` (real outputs replayed byte for byte while no GPU memory is allocated) and
  ``q-gpu-template.txt`` (the per-GPU body of ``nvidia-smi -q``).
* ``$GPUSIM_STATE_DIR`` (default ``/dev/shm/gpusim``): the live allocations registry, one
  ``alloc-<pid>.json`` per process holding simulated GPU memory (see lab/gpusim/README.md).

Simulated commands: plain ``nvidia-smi``, ``-q``, ``-L``, ``--query-gpu=...``,
``--query-compute-apps=...`` (``--format=csv[,noheader][,nounits]``, ``-i``), ``topo -m``,
``topo -mp``, ``topo -p2p r|w|n|a|p``, ``nvlink -s``, ``--version``, ``-h``.
``-r``/``--gpu-reset [-i ids]`` (the refusal while a process uses the device, and the release of leaked
allocations; see lab/gpusim/README.md). The one option the real tool lacks: ``--gpusim-reset`` clears the
allocations registry (leaked allocations included).

Environment for tests: ``GPUSIM_TIMESTAMP`` (a literal timestamp string to print instead
of the current time) and ``GPUSIM_NO_REPLAY=1`` (always render, never replay captures).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import sys
import time

SIM_LINE = "gpufleet lab simulator: this is not NVIDIA's nvidia-smi"
DEFAULT_PROFILE_DIR = "/etc/gpusim/profile"
DEFAULT_STATE_DIR = "/dev/shm/gpusim"

NO_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
NO_DEVICES = "No devices were found\n"

RC_INVALID_ARGS = 2
RC_NOT_FOUND = 6
RC_DRIVER = 9

TOPO_LEGEND = (
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
)
TOPO_LEGEND_NVLINK = "  NV#  = Connection traversing a bonded set of # NVLinks\n"
P2P_LEGEND = (
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  OK   = Status Ok\n"
    "  CNS  = Chipset not supported\n"
    "  GNS  = GPU not supported\n"
    "  TNS  = Topology not supported\n"
    "  NS   = Not supported\n"
    "  U    = Unknown\n"
)
UNDERLINE = "\x1b[4m"
RESET = "\x1b[0m"

Q_KEY_WIDTH = 55  # column of the ':' in `nvidia-smi -q` lines

# Real options the simulator does not model: fail loudly instead of pretending.
REAL_BUT_NOT_SIMULATED = {
    "-x",
    "--xml-format",
    "-d",
    "--display",
    "-l",
    "--loop",
    "-lms",
    "--loop-ms",
    "-f",
    "--filename",
    "-u",
    "--unit",
    "-B",
    "--list-excluded-gpus",
    "-pm",
    "--persistence-mode",
    "-pl",
    "--power-limit",
    "-c",
    "--compute-mode",
    "-e",
    "--ecc-config",
    "-p",
    "--reset-ecc-errors",
    "-mig",
    "--multi-instance-gpu",
    "-lgc",
    "--lock-gpu-clocks",
    "-rgc",
    "--reset-gpu-clocks",
    "-ac",
    "--applications-clocks",
    "-rac",
    "--reset-applications-clocks",
    "--query-supported-clocks",
    "--query-retired-pages",
    "--query-remapped-rows",
    "--query-accounted-apps",
}
REAL_SUBCOMMANDS_NOT_SIMULATED = {
    "dmon",
    "pmon",
    "mig",
    "vgpu",
    "clocks",
    "encodersessions",
    "fbcsessions",
    "conf-compute",
    "gpm",
    "drain",
    "c2c",
    "nvlink5",
}


class Invalid(Exception):
    """Bad command line: nvidia-smi's 'Invalid combination of input arguments'."""


class InvalidField(Exception):
    """Unknown --query-* field."""


class NotSimulated(Exception):
    """A real nvidia-smi option this simulator does not model."""


# --------------------------------------------------------------------------- profile


def load_profile(profile_dir):
    path = os.path.join(profile_dir, "profile.json")
    with open(path, encoding="utf-8") as fh:
        profile = json.load(fh)
    profile["_dir"] = profile_dir
    for pos, gpu in enumerate(profile.get("gpus", [])):
        gpu.setdefault("index", pos)
    return profile


def driver_major(profile):
    try:
        return int(str(profile.get("driver_version", "0")).split(".")[0])
    except ValueError:
        return 0


# --------------------------------------------------------------------------- registry


def _proc_starttime(pid):
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), state; None if no process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return None, None
    rest = data[data.rfind(")") + 2 :].split()
    if len(rest) < 20:
        return None, None
    return rest[19], rest[0]


def pid_alive(pid, starttime=None):
    """True if process ``pid`` exists, is not a zombie and (if given) started at ``starttime``."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    start, state = _proc_starttime(pid)
    if start is None:
        return False
    if state in ("Z", "X"):
        return False  # a zombie has released its GPU memory
    return not (starttime is not None and str(starttime) != start)


def load_allocations(state_dir, gpu_indices, prune=True):
    """Return the counted allocations as a list of dicts (one per process file).

    Each: ``{"pid", "process_name", "type", "gpus": {index(int): MiB(int)}, "leak"}``.
    Dead, non-leaked files are removed when ``prune`` (best effort).
    """
    allocations = []
    for path in sorted(glob.glob(os.path.join(state_dir, "alloc-*.json"))):
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue  # half-written or vanished: writers must rename into place
        if not isinstance(rec, dict):
            continue
        pid = rec.get("pid")
        leak = bool(rec.get("leak", False))
        if not leak and not pid_alive(pid, rec.get("starttime")):
            if prune:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            continue
        gpus = {}
        for key, mib in (rec.get("gpus") or {}).items():
            try:
                idx, mib = int(key), int(mib)
            except (TypeError, ValueError):
                continue
            if idx in gpu_indices and mib > 0:
                gpus[idx] = gpus.get(idx, 0) + mib
        if not gpus:
            continue
        allocations.append(
            {
                "pid": pid if isinstance(pid, int) else 0,
                "process_name": str(rec.get("process_name") or "python3"),
                "type": str(rec.get("type") or "C"),
                "gpus": gpus,
                "leak": leak,
                "starttime": rec.get("starttime"),
            }
        )
    return allocations


def reset_registry(state_dir):
    removed = 0
    for path in glob.glob(os.path.join(state_dir, "alloc-*.json")) + glob.glob(os.path.join(state_dir, ".tmp-alloc-*")):
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


# --------------------------------------------------------------------------- GPU reset

# Real texts (NVIDIA/gpu-operator#118, NVIDIA/NVSentinel#1690, cupy/cupy#1930): a refused reset lists the
# GPUs it could not reset, then the explanation below, exit 255; a reset that works prints one line per GPU.
RESET_IN_USE_TAIL = (
    "{n} device{s} {is_are} currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
    "application, graphics application such as an X server, or a monitoring application such as another "
    "instance of nvidia-smi). Please first kill all processes using this device and all compute applications "
    "running in the system.\n"
)
RC_RESET_REFUSED = 255
RC_NO_PERMISSION = 4  # NVML_ERROR_NO_PERMISSION


def _persistence_daemon_running(proc_root="/proc"):
    """nvidia-persistenced keeps every GPU open, so a reset is refused while it runs (NVSentinel#1690)."""
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, name, "comm"), encoding="utf-8", errors="replace") as fh:
                if fh.read().strip() == "nvidia-persiste":  # comm is cut at 15 characters
                    return True
        except OSError:
            continue
    return False


def gpu_reset(profile, state_dir, id_arg, out):
    """``nvidia-smi -r [-i ids]``: refused while a live process holds a chosen GPU (or nvidia-persistenced
    runs); else every allocation on those GPUs whose process is gone (a leak) is released."""
    indices = {g.get("index", pos) for pos, g in enumerate(profile.get("gpus", []))}
    machine = Machine(profile, load_allocations(state_dir, indices))
    gpus = select_gpus(machine, id_arg)
    if gpus is None or not machine.gpus:
        out.write(NO_DEVICES)
        return RC_NOT_FOUND
    if os.geteuid() != 0:
        out.write("The following GPUs could not be reset:\n")
        for gpu in gpus:
            out.write(f"  GPU {gpu['pci_bus_id']}: Insufficient Permissions\n")
        return RC_NO_PERMISSION
    daemon = _persistence_daemon_running()
    busy = []
    for gpu in gpus:
        held = [a for a in machine.allocations if gpu["index"] in a["gpus"]]
        if daemon or any(pid_alive(a["pid"], a.get("starttime")) for a in held):
            busy.append(gpu)
    if busy:
        out.write("The following GPUs could not be reset:\n")
        for gpu in busy:
            out.write(f"  GPU {gpu['pci_bus_id']}: In use by another client\n")
        n = len(busy)
        out.write("\n" + RESET_IN_USE_TAIL.format(n=n, s="s" if n > 1 else "", is_are="are" if n > 1 else "is"))
        return RC_RESET_REFUSED
    chosen = {str(g["index"]) for g in gpus}
    for path in glob.glob(os.path.join(state_dir, "alloc-*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
            left = {k: v for k, v in (rec.get("gpus") or {}).items() if str(k) not in chosen}
            if left:
                rec["gpus"] = left
                tmp = os.path.join(state_dir, f".tmp-alloc-reset-{os.getpid()}.part")
                with open(tmp, "w", encoding="utf-8") as fh:
                    json.dump(rec, fh)
                os.replace(tmp, path)
            else:
                os.unlink(path)
        except (OSError, ValueError, AttributeError):
            continue
    for gpu in gpus:
        out.write(f"GPU {gpu['pci_bus_id']} was successfully reset.\n")
    return 0


# --------------------------------------------------------------------------- machine state


class Machine:
    """The profile plus the live allocations: everything a command renders from."""

    def __init__(self, profile, allocations):
        self.profile = profile
        self.gpus = sorted(profile.get("gpus", []), key=lambda g: g["index"])
        self.allocations = allocations

    @property
    def idle(self):
        return not self.allocations

    def used_mib(self, gpu):
        return sum(a["gpus"].get(gpu["index"], 0) for a in self.allocations)

    def free_mib(self, gpu):
        total = int(gpu["memory_total_mib"])
        reserved = int(gpu.get("memory_reserved_mib", 0))
        return max(0, total - reserved - self.used_mib(gpu))

    def q_values(self, gpu):
        """{section path: value} of the GPU's ``-q`` body (its capture by bus id, else q-gpu-template.txt), as
        written there: the source of the --query-gpu fields the profile does not set (clocks, PCIe link, ...)."""
        cache = self.__dict__.setdefault("_q_cache", {})
        if gpu["index"] not in cache:
            pdir = self.profile.get("_dir", "")
            body = _q_blocks_from_capture(os.path.join(pdir, "captures", "nvidia-smi-q.txt")).get(gpu["pci_bus_id"])
            template = os.path.join(pdir, "q-gpu-template.txt")
            if body is None and os.path.exists(template):
                with open(template, encoding="utf-8") as fh:
                    body = fh.read().splitlines(keepends=True)
            cache[gpu["index"]] = _q_index(body or []) | q_overrides(gpu)
        return cache[gpu["index"]]

    def processes(self, gpu_indices=None):
        """(gpu, allocation, MiB) in nvidia-smi order: by GPU, then pid."""
        rows = []
        for gpu in self.gpus:
            if gpu_indices is not None and gpu["index"] not in gpu_indices:
                continue
            for alloc in sorted(self.allocations, key=lambda a: a["pid"]):
                mib = alloc["gpus"].get(gpu["index"])
                if mib:
                    rows.append((gpu, alloc, mib))
        return rows


def select_gpus(machine, id_arg):
    """Resolve ``-i``: comma-separated indices, UUIDs or PCI bus ids."""
    if id_arg is None:
        return list(machine.gpus)
    chosen = []
    for token in id_arg.split(","):
        token = token.strip()
        match = None
        for gpu in machine.gpus:
            bus = str(gpu.get("pci_bus_id", ""))
            if (
                token == str(gpu["index"])
                or token == gpu.get("uuid")
                or token.lower() == bus.lower()
                or (bus and token.lower() == bus[4:].lower())
            ):
                match = gpu
        if match is None:
            return None
        if match not in chosen:
            chosen.append(match)
    return chosen


def timestamp():
    fixed = os.environ.get("GPUSIM_TIMESTAMP")
    if fixed:
        return fixed
    t = time.localtime()
    return time.strftime("%a %b ", t) + f"{t.tm_mday:>2}" + time.strftime(" %H:%M:%S %Y", t)


# --------------------------------------------------------------------------- plain table


def _name_cell(name, width=27):
    return name if len(name) <= width else name[: width - 3] + "..."


def _on_off(value):
    return "On" if str(value).lower() in ("enabled", "on", "1", "true") else "Off"


def render_table(machine, gpus):
    p = machine.profile
    old_style = driver_major(p) < 580
    bar = "+" + "-" * 89 + "+\n"
    cols = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+\n"
    out = [timestamp() + "       \n", bar]
    drv = p["driver_version"]
    out.append(f"| NVIDIA-SMI {drv:<23}Driver Version: {drv:<15}CUDA Version: {p['cuda_version']:<9}|\n")
    # Before the 580 drivers this rule started with '|' (and still ended with '+').
    out.append(("|" + cols[1:]) if old_style else cols)
    out.append("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n")
    out.append("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n")
    out.append("|                                         |                        |               MIG M. |\n")
    out.append("|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|\n")
    for gpu in gpus:
        pm = _on_off(gpu.get("persistence_mode", "Enabled"))
        c1 = f"{gpu['index']:>4}  {_name_cell(gpu['name']):<27}    {pm:<3} "
        c2 = f"   {gpu['pci_bus_id']} {gpu.get('display_active', 'Off'):>3} "
        c3 = f"{ecc_table_cell(machine, gpu):>21} "
        out.append(f"|{c1}|{c2}|{c3}|\n")
        temp = gpu.get("temperature_c")
        temp = "N/A" if temp is None else f"{temp}C"
        left = f" {gpu.get('fan', 'N/A'):>3}   {temp:>3}    {gpu.get('pstate', 'P0'):<2}"
        draw = gpu.get("power_draw_w")
        draw = "N/A" if draw is None else f"{int(round(float(draw)))}W"
        cap = f"{int(round(float(gpu['power_limit_w'])))}W"
        power = f"{draw} / {cap:>5}"
        c1 = left + power.rjust(40 - len(left)) + " "
        used = f"{machine.used_mib(gpu)}MiB"
        total = f"{int(gpu['memory_total_mib'])}MiB"
        c2 = f" {used:>10} / {total:>9} "
        util = f"{gpu.get('utilization_gpu', 0)}%"
        c3 = f"{util:>8}{gpu.get('compute_mode', 'Default'):>13} "
        out.append(f"|{c1}|{c2}|{c3}|\n")
        mig = gpu.get("mig_mode", "Disabled")
        out.append("|" + " " * 41 + "|" + " " * 24 + "|" + f"{mig:>21} " + "|\n")
        out.append(cols)
    out.append((" " * 89 + "\n") if old_style else "\n")
    out.append(bar)
    out.append("| Processes:" + " " * 78 + "|\n")
    out.append("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n")
    out.append("|        ID   ID                                                               Usage      |\n")
    out.append("|" + "=" * 89 + "|\n")
    procs = machine.processes({g["index"] for g in gpus})
    if not procs:
        out.append("|  No running processes found" + " " * 61 + "|\n")
    for gpu, alloc, mib in procs:
        name = alloc["process_name"]
        if len(name) > 35:
            name = "..." + name[-32:]
        mem = f"{mib}MiB"
        ids = f"{gpu['index']:>5}{'N/A':>6}{'N/A':>5}{alloc['pid']:>16}{alloc['type']:>7}"
        out.append(f"|{ids}   {name:<36}{mem:>10} |\n")
    out.append(bar)
    return "".join(out)


# --------------------------------------------------------------------------- -q


def _q_line(indent, key, value):
    return (" " * indent + key).ljust(Q_KEY_WIDTH) + ": " + str(value) + "\n"


def _q_split(line):
    """(indent, key, value or None) for one `-q` line."""
    body = line.rstrip("\n")
    indent = len(body) - len(body.lstrip(" "))
    if len(body) > Q_KEY_WIDTH and body[Q_KEY_WIDTH : Q_KEY_WIDTH + 2] == ": ":
        return indent, body[:Q_KEY_WIDTH].strip(), body[Q_KEY_WIDTH + 2 :]
    if body.rstrip().endswith(":") and len(body) >= Q_KEY_WIDTH:
        return indent, body[:Q_KEY_WIDTH].strip(), ""
    return indent, body.strip(), None


def _q_blocks_from_capture(path):
    """{bus id: [lines]} from a captured `nvidia-smi -q` (block without its 'GPU ...' line)."""
    blocks = {}
    if not os.path.exists(path):
        return blocks
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines(keepends=True)
    current = None
    for line in lines:
        if line.startswith("GPU "):
            current = line[4:].strip()
            blocks[current] = []
            continue
        if current is not None:
            if line.strip() == "":
                current = None
                continue
            blocks[current].append(line)
    return blocks


def _q_substitute(lines, values):
    """Replace values at section paths.  ``values``: {("FB Memory Usage", "Used"): "0 MiB"}."""
    out = []
    stack = []  # (indent, name)
    for line in lines:
        indent, key, value = _q_split(line)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(name for _, name in stack) + (key,)
        if value is None:
            stack.append((indent, key))
            out.append(line)
            continue
        if path in values:
            new = values[path]
            if isinstance(new, list):  # replace a whole key line by several lines
                out.extend(new)
                continue
            line = _q_line(indent, key, new) if value != "" else line
        out.append(line)
    return out


def q_overrides(gpu):
    """The GPU's ``q`` key: values of its ``-q`` body set by the profile, ``{"Remapped Rows / Pending": "Yes",
    "PCI / GPU Link Info / Link Width / Current": "8x"}`` (a planted fault: a row remapping pending, a link
    trained below its maximum). ``-q`` prints them and the --query-gpu fields read from the body answer them."""
    return {tuple(part.strip() for part in key.split(" / ")): str(value) for key, value in gpu.get("q", {}).items()}


def _q_index(lines):
    """{section path: value} of a ``-q`` body: ``("Clocks", "SM"): "345 MHz"``."""
    values = {}
    stack = []  # (indent, name)
    for line in lines:
        indent, key, value = _q_split(line)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if value is None:
            stack.append((indent, key))
            continue
        values[tuple(name for _, name in stack) + (key,)] = value
    return values


def _q_processes(machine, gpu):
    procs = [(a, mib) for g, a, mib in machine.processes({gpu["index"]})]
    if not procs:
        return [_q_line(4, "Processes", "None")]
    lines = ["    Processes\n"]
    for alloc, mib in procs:
        lines += [
            _q_line(8, "GPU instance ID", "N/A"),
            _q_line(8, "Compute instance ID", "N/A"),
            _q_line(8, "Process ID", alloc["pid"]),
            _q_line(12, "Type", alloc["type"]),
            _q_line(12, "Name", alloc["process_name"]),
            _q_line(12, "Used GPU Memory", f"{mib} MiB"),
        ]
    return lines


def _q_watts(value):
    return "N/A" if value is None else f"{float(value):.2f} W"


def _q_temp(value):
    return "N/A" if value is None else f"{value} C"


def _bus_parts(bus_id):
    # 00000000:00:06.0 -> domain, bus, device
    m = re.match(r"^([0-9A-Fa-f]+):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.(\d)$", bus_id)
    if not m:
        return "0x0000", "0x00", "0x00"
    return f"0x{m.group(1)[-4:]}", f"0x{m.group(2)}", f"0x{m.group(3)}"


_Q_ECC_COUNTS = (
    "SRAM Correctable",
    "SRAM Uncorrectable Parity",
    "SRAM Uncorrectable SEC-DED",
    "DRAM Correctable",
    "DRAM Uncorrectable",
)


def _q_ecc_values(machine, gpu):
    """ECC Mode and error counts of ``-q`` consistent with --query-gpu: the counts go to DRAM (volatile and
    aggregate); without ECC enabled every count reads N/A."""
    mode = ecc_mode(machine, gpu)
    values = {("ECC Mode", "Current"): mode, ("ECC Mode", "Pending"): mode}
    if mode != "Enabled":
        for section in ("Volatile", "Aggregate"):
            for key in _Q_ECC_COUNTS:
                values[("ECC Errors", section, key)] = "N/A"
        return values
    for section in ("Volatile", "Aggregate"):
        values[("ECC Errors", section, "DRAM Correctable")] = ecc_volatile(machine, gpu, "corrected")
        values[("ECC Errors", section, "DRAM Uncorrectable")] = ecc_volatile(machine, gpu, "uncorrected")
    return values


def render_q(machine, gpus):
    p = machine.profile
    pdir = p["_dir"]
    captured = _q_blocks_from_capture(os.path.join(pdir, "captures", "nvidia-smi-q.txt"))
    template_path = os.path.join(pdir, "q-gpu-template.txt")
    template = None
    if os.path.exists(template_path):
        with open(template_path, encoding="utf-8") as fh:
            template = fh.read().splitlines(keepends=True)
    out = [
        "\n",
        "==============NVSMI LOG==============\n",
        "\n",
        _q_line(0, "Timestamp", timestamp()),
        _q_line(0, "Driver Version", p["driver_version"]),
        _q_line(0, "CUDA Version", p["cuda_version"]),
        "\n",
        _q_line(0, "Attached GPUs", len(machine.gpus)),
    ]
    for gpu in gpus:
        body = captured.get(gpu["pci_bus_id"]) or template
        if body is None:
            body = [_q_line(4, "Product Name", ""), _q_line(4, "GPU UUID", "")]
        domain, bus, dev = _bus_parts(gpu["pci_bus_id"])
        limit = f"{float(gpu['power_limit_w']):.2f} W"
        values = {
            ("Product Name",): gpu["name"],
            ("Persistence Mode",): gpu.get("persistence_mode", "Enabled"),
            ("MIG Mode", "Current"): gpu.get("mig_mode", "Disabled"),
            ("GPU UUID",): gpu["uuid"],
            ("Minor Number",): gpu.get("minor_number", gpu["index"]),
            ("GSP Firmware Version",): p["driver_version"],
            ("PCI", "Bus"): bus,
            ("PCI", "Device"): dev,
            ("PCI", "Domain"): domain,
            ("PCI", "Bus Id"): gpu["pci_bus_id"],
            ("FB Memory Usage", "Total"): f"{int(gpu['memory_total_mib'])} MiB",
            (
                "FB Memory Usage",
                "Reserved",
            ): f"{int(gpu.get('memory_reserved_q_mib', gpu.get('memory_reserved_mib', 0)))} MiB",
            ("FB Memory Usage", "Used"): f"{machine.used_mib(gpu)} MiB",
            ("FB Memory Usage", "Free"): f"{machine.free_mib(gpu)} MiB",
            ("Performance State",): gpu.get("pstate", "P0"),
            ("Temperature", "GPU Current Temp"): _q_temp(gpu.get("temperature_c")),
            ("GPU Power Readings", "Average Power Draw"): _q_watts(gpu.get("power_draw_w")),
            ("GPU Power Readings", "Current Power Limit"): limit,
            ("GPU Power Readings", "Requested Power Limit"): limit,
            ("Processes",): _q_processes(machine, gpu),
        }
        values.update(_q_ecc_values(machine, gpu))
        values.update(q_overrides(gpu))
        out.append(f"GPU {gpu['pci_bus_id']}\n")
        out.extend(_q_substitute(body, values))
        out.append("\n")
    return "".join(out)


# --------------------------------------------------------------------------- -L, nvlink


def render_list(machine, gpus):
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)


def render_nvlink_status(machine, gpus):
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n")
        links = int(g.get("nvlink_links", 0))
        if links == 0:
            out.append("\t NVML: Unable to retrieve NVLink information as all links are inActive\n")
        for k in range(links):
            out.append(f"\t Link {k}: {g.get('nvlink_speed', '26.562 GB/s')}\n")
    return "".join(out)


# --------------------------------------------------------------------------- CSV queries


def _mib(value, units):
    return f"{value} MiB" if units else str(value)


def _watts(value, units):
    if value is None:
        return "[N/A]"
    return f"{float(value):.2f} W" if units else f"{float(value):.2f}"


def _na(value):
    """A value as the CSV prints it: ``-q``'s ``N/A`` (or none at all) is ``[N/A]``."""
    return "[N/A]" if value in (None, "", "N/A", "[N/A]") else str(value)


def _q_number(machine, gpu, *path):
    """The number of a ``-q`` value (``345 MHz`` -> ``345``, ``16x`` -> ``16``), None for ``N/A``."""
    value = machine.q_values(gpu).get(path)
    m = re.match(r"^(-?\d+(?:\.\d+)?)", value or "")
    return m.group(1) if m else None


def _unit(value, unit, units):
    """``value`` with its unit as the real CSV prints it (``495 MHz``, ``0 %``), ``[N/A]`` for none."""
    if value is None or str(value) in ("N/A", "[N/A]"):
        return "[N/A]"
    return f"{value} {unit}" if units else str(value)


def _profile_or_q(gpu, key, machine, *path):
    return gpu[key] if key in gpu else _q_number(machine, gpu, *path)


def ecc_mode(machine, gpu):
    """``Enabled``, ``Disabled`` or ``N/A`` (a GPU without ECC, as consumer GPUs): the profile's ``ecc_mode``;
    else from ``ecc_errors`` (the table's Volatile Uncorr. ECC cell: ``N/A`` no ECC, ``Off`` disabled); else the
    ``-q`` body's ECC Mode (Enabled on both H200 and RTX PRO 6000 bodies)."""
    if "ecc_mode" in gpu:
        return str(gpu["ecc_mode"]).strip("[]")
    cell = str(gpu.get("ecc_errors", "0"))
    if cell in ("N/A", "[N/A]"):
        return "N/A"
    if cell == "Off":
        return "Disabled"
    return machine.q_values(gpu).get(("ECC Mode", "Current")) or "Enabled"


def ecc_volatile(machine, gpu, kind):
    """Volatile ECC error count (``corrected``/``uncorrected``) as an int, or None where ECC is not enabled
    (the real tool prints ``[N/A]`` then). Profile keys ``ecc_corrected_volatile``/``ecc_uncorrected_volatile``;
    uncorrected defaults to the numeric ``ecc_errors`` of the table, everything else to 0 (the H200 captures)."""
    if ecc_mode(machine, gpu) != "Enabled":
        return None
    key = f"ecc_{kind}_volatile"
    if key in gpu:
        return int(gpu[key])
    cell = str(gpu.get("ecc_errors", "0"))
    return int(cell) if kind == "uncorrected" and cell.isdigit() else 0


def ecc_table_cell(machine, gpu):
    """The table's Volatile Uncorr. ECC cell: the profile's ``ecc_errors``, else from the ECC mode."""
    if "ecc_errors" in gpu:
        return str(gpu["ecc_errors"])
    mode = ecc_mode(machine, gpu)
    if mode == "Enabled":
        return str(ecc_volatile(machine, gpu, "uncorrected"))
    return "Off" if mode == "Disabled" else "N/A"


# nvml.h clocks event reason bits, by their name in ``-q``'s Clocks Event Reasons section.
CLOCKS_EVENT_BITS = {
    "Idle": 0x1,
    "Applications Clocks Setting": 0x2,
    "SW Power Cap": 0x4,
    "HW Slowdown": 0x8,
    "Sync Boost": 0x10,
    "SW Thermal Slowdown": 0x20,
    "HW Thermal Slowdown": 0x40,
    "HW Power Brake Slowdown": 0x80,
    "Display Clock Setting": 0x100,
}


def clocks_event_reasons(machine, gpu):
    """``0x0000000000000001`` (idle) as the real tool prints it: the profile's ``clocks_event_reasons``
    (an int) or the Active entries of the ``-q`` body's Clocks Event Reasons."""
    if "clocks_event_reasons" in gpu:
        return f"0x{int(gpu['clocks_event_reasons']):016x}"
    mask = 0
    for path, value in machine.q_values(gpu).items():
        if path[0] == "Clocks Event Reasons" and value == "Active" and path[-1] in CLOCKS_EVENT_BITS:
            mask |= CLOCKS_EVENT_BITS[path[-1]]
    return f"0x{mask:016x}"


def _fan(gpu, units):
    fan = str(gpu.get("fan", "N/A")).rstrip("%").strip()
    return _unit(None if fan == "N/A" else fan, "%", units)


# name -> (canonical header name, unit or None, getter(machine, gpu, units)). As the real tool: the header
# shows the canonical name (``clocks.sm`` -> ``clocks.current.sm [MHz]``) and the unit of unit-bearing fields;
# ``temperature.*``, ECC counts, pstate and the like carry none, and ``nounits`` drops the value's unit.
GPU_FIELDS = {
    "timestamp": ("timestamp", None, lambda m, g, u: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "driver_version": ("driver_version", None, lambda m, g, u: m.profile["driver_version"]),
    "count": ("count", None, lambda m, g, u: str(len(m.gpus))),
    "name": ("name", None, lambda m, g, u: g["name"]),
    "gpu_name": ("name", None, lambda m, g, u: g["name"]),
    "serial": ("serial", None, lambda m, g, u: g.get("serial", "0000000000000")),
    "gpu_serial": ("serial", None, lambda m, g, u: g.get("serial", "0000000000000")),
    "uuid": ("uuid", None, lambda m, g, u: g["uuid"]),
    "gpu_uuid": ("uuid", None, lambda m, g, u: g["uuid"]),
    "index": ("index", None, lambda m, g, u: str(g["index"])),
    "pci.bus_id": ("pci.bus_id", None, lambda m, g, u: g["pci_bus_id"]),
    "gpu_bus_id": ("pci.bus_id", None, lambda m, g, u: g["pci_bus_id"]),
    "persistence_mode": ("persistence_mode", None, lambda m, g, u: g.get("persistence_mode", "Enabled")),
    "compute_cap": ("compute_cap", None, lambda m, g, u: g["compute_cap"]),
    "pstate": ("pstate", None, lambda m, g, u: g.get("pstate", "P0")),
    "temperature.gpu": (
        "temperature.gpu",
        None,
        lambda m, g, u: "[N/A]" if g.get("temperature_c") is None else str(g["temperature_c"]),
    ),
    "utilization.gpu": (
        "utilization.gpu",
        "%",
        lambda m, g, u: f"{g.get('utilization_gpu', 0)} %" if u else str(g.get("utilization_gpu", 0)),
    ),
    "memory.total": ("memory.total", "MiB", lambda m, g, u: _mib(int(g["memory_total_mib"]), u)),
    "memory.reserved": (
        "memory.reserved",
        "MiB",
        lambda m, g, u: _mib(int(g.get("memory_reserved_mib", 0)), u),
    ),
    "memory.used": ("memory.used", "MiB", lambda m, g, u: _mib(m.used_mib(g), u)),
    "memory.free": ("memory.free", "MiB", lambda m, g, u: _mib(m.free_mib(g), u)),
    "power.draw": ("power.draw", "W", lambda m, g, u: _watts(g.get("power_draw_w"), u)),
    "power.limit": ("power.limit", "W", lambda m, g, u: _watts(g.get("power_limit_w"), u)),
    "enforced.power.limit": ("enforced.power.limit", "W", lambda m, g, u: _watts(g.get("power_limit_w"), u)),
    "mig.mode.current": ("mig.mode.current", None, lambda m, g, u: _mig(g)),
    "mig.mode.pending": ("mig.mode.pending", None, lambda m, g, u: _mig(g)),
    "compute_mode": ("compute_mode", None, lambda m, g, u: g.get("compute_mode", "Default")),
    "utilization.memory": (
        "utilization.memory",
        "%",
        lambda m, g, u: _unit(_profile_or_q(g, "utilization_memory", m, "Utilization", "Memory"), "%", u),
    ),
    "temperature.memory": (
        "temperature.memory",
        None,
        lambda m, g, u: _na(_profile_or_q(g, "temperature_memory_c", m, "Temperature", "Memory Current Temp")),
    ),
    "fan.speed": ("fan.speed", "%", lambda m, g, u: _fan(g, u)),
    "ecc.mode.current": ("ecc.mode.current", None, lambda m, g, u: _na(ecc_mode(m, g))),
    "ecc.mode.pending": ("ecc.mode.pending", None, lambda m, g, u: _na(ecc_mode(m, g))),
    "ecc.errors.corrected.volatile.total": (
        "ecc.errors.corrected.volatile.total",
        None,
        lambda m, g, u: _na(ecc_volatile(m, g, "corrected")),
    ),
    "ecc.errors.uncorrected.volatile.total": (
        "ecc.errors.uncorrected.volatile.total",
        None,
        lambda m, g, u: _na(ecc_volatile(m, g, "uncorrected")),
    ),
    "retired_pages.pending": (
        "retired_pages.pending",
        None,
        lambda m, g, u: _na(m.q_values(g).get(("Retired Pages", "Pending Page Blacklist"))),
    ),
    "remapped_rows.pending": (
        "remapped_rows.pending",
        None,
        lambda m, g, u: _na(m.q_values(g).get(("Remapped Rows", "Pending"))),
    ),
    "remapped_rows.failure": (
        "remapped_rows.failure",
        None,
        lambda m, g, u: _na(m.q_values(g).get(("Remapped Rows", "Remapping Failure Occurred"))),
    ),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", None, lambda m, g, u: clocks_event_reasons(m, g)),
    "clocks_throttle_reasons.active": (
        "clocks_event_reasons.active",
        None,
        lambda m, g, u: clocks_event_reasons(m, g),
    ),
}

# PCIe link fields: (name, -q path under PCI > GPU Link Info), no unit; values from the GPU's -q body.
for _name, _path in (
    ("pcie.link.gen.current", ("PCIe Generation", "Current")),
    ("pcie.link.gen.max", ("PCIe Generation", "Max")),
    ("pcie.link.width.current", ("Link Width", "Current")),
    ("pcie.link.width.max", ("Link Width", "Max")),
):
    GPU_FIELDS[_name] = (_name, None, lambda m, g, u, _p=_path: _na(_q_number(m, g, "PCI", "GPU Link Info", *_p)))

# Clock fields: (canonical name, alias or None, -q path), unit MHz; values from the GPU's -q body.
for _name, _alias, _path in (
    ("clocks.current.graphics", "clocks.gr", ("Clocks", "Graphics")),
    ("clocks.current.sm", "clocks.sm", ("Clocks", "SM")),
    ("clocks.current.memory", "clocks.mem", ("Clocks", "Memory")),
    ("clocks.current.video", "clocks.video", ("Clocks", "Video")),
    ("clocks.max.graphics", "clocks.max.gr", ("Max Clocks", "Graphics")),
    ("clocks.max.sm", None, ("Max Clocks", "SM")),
    ("clocks.max.memory", "clocks.max.mem", ("Max Clocks", "Memory")),
):
    _field = (_name, "MHz", lambda m, g, u, _p=_path: _unit(_q_number(m, g, *_p), "MHz", u))
    GPU_FIELDS[_name] = _field
    if _alias:
        GPU_FIELDS[_alias] = _field

APP_FIELDS = {
    "timestamp": ("timestamp", None, lambda m, g, a, mib, u: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "gpu_name": ("gpu_name", None, lambda m, g, a, mib, u: g["name"]),
    "gpu_bus_id": ("gpu_bus_id", None, lambda m, g, a, mib, u: g["pci_bus_id"]),
    "gpu_serial": ("gpu_serial", None, lambda m, g, a, mib, u: g.get("serial", "0000000000000")),
    "gpu_uuid": ("gpu_uuid", None, lambda m, g, a, mib, u: g["uuid"]),
    "pid": ("pid", None, lambda m, g, a, mib, u: str(a["pid"])),
    "process_name": ("process_name", None, lambda m, g, a, mib, u: a["process_name"]),
    "name": ("process_name", None, lambda m, g, a, mib, u: a["process_name"]),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda m, g, a, mib, u: _mib(mib, u)),
    "used_memory": ("used_gpu_memory", "MiB", lambda m, g, a, mib, u: _mib(mib, u)),
}


def _mig(gpu):
    mode = gpu.get("mig_mode", "Disabled")
    return "[N/A]" if mode in (None, "N/A") else mode


def _parse_fields(spec, table):
    fields = [f.strip() for f in spec.split(",")]
    for f in fields:
        if f not in table:
            raise InvalidField(f)
    return fields


def _header(fields, table):
    names = []
    for f in fields:
        canonical, unit, _ = table[f][:3]
        names.append(f"{canonical} [{unit}]" if unit else canonical)
    return ", ".join(names) + "\n"


def render_query_gpu(machine, gpus, fields, header, units):
    out = [_header(fields, GPU_FIELDS)] if header else []
    for gpu in gpus:
        out.append(", ".join(GPU_FIELDS[f][2](machine, gpu, units) for f in fields) + "\n")
    return "".join(out)


def render_query_apps(machine, gpus, fields, header, units):
    out = [_header(fields, APP_FIELDS)] if header else []
    for gpu, alloc, mib in machine.processes({g["index"] for g in gpus}):
        out.append(", ".join(APP_FIELDS[f][2](machine, gpu, alloc, mib, units) for f in fields) + "\n")
    return "".join(out)


# --------------------------------------------------------------------------- topo


def render_topo(machine, pcie_only):
    p = machine.profile
    n = len(machine.gpus)
    links = p.get("topo_links_pcie" if pcie_only else "topo_links")
    if links is None:
        links = p.get("topo_links")
    names = [f"GPU{g['index']}" for g in machine.gpus]
    out = ["\t" + UNDERLINE + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + RESET + "\n"]
    for i, gpu in enumerate(machine.gpus):
        cells = []
        for j in range(n):
            cell = links[i][j] if links else ("X" if i == j else "PHB")
            cells.append(" X " if cell == "X" else cell)
        cpu = gpu.get("cpu_affinity", p.get("cpu_affinity", "0"))
        numa = gpu.get("numa_affinity", p.get("numa_affinity", "0"))
        gnuma = gpu.get("gpu_numa_id", p.get("gpu_numa_id", "N/A"))
        out.append(f"{names[i]}\t" + "\t".join(cells) + f"\t{cpu}\t{numa}\t\t{gnuma}\n")
    out.append(TOPO_LEGEND)
    if not pcie_only:
        out.append(TOPO_LEGEND_NVLINK)
    return "".join(out)


def render_p2p(machine, mode):
    p = machine.profile
    matrix = (p.get("p2p") or {}).get(mode)
    names = [f"GPU{g['index']}" for g in machine.gpus]
    out = [" \t" + UNDERLINE + "".join(f"{nm}\t" for nm in names) + RESET + "\n"]
    for i, nm in enumerate(names):
        cells = [(matrix[i][j] if matrix else ("X" if i == j else "NS")) for j in range(len(names))]
        out.append(f" {nm}\t" + "".join(f"{c}\t" for c in cells) + "\n")
    out.append(P2P_LEGEND)
    return "".join(out)


# --------------------------------------------------------------------------- replay


def replay(machine, argv):
    """The captured output for this exact command line, if the state matches the capture."""
    if os.environ.get("GPUSIM_NO_REPLAY") == "1" or not machine.idle:
        return None
    cap_dir = os.path.join(machine.profile["_dir"], "captures")
    index_path = os.path.join(cap_dir, "index.json")
    if not os.path.exists(index_path):
        return None
    with open(index_path, encoding="utf-8") as fh:
        index = json.load(fh)
    key = " ".join(["nvidia-smi"] + list(argv))
    entry = index.get(key)
    if entry is None:
        return None
    fname, _, section = entry.partition("#")
    with open(os.path.join(cap_dir, fname), encoding="utf-8", newline="") as fh:
        text = fh.read()
    if section:
        parts = re.split(r"^## (.*)\n", text, flags=re.M)
        sections = dict(zip(parts[1::2], parts[2::2], strict=False))
        text = sections.get(section)
        if text is None:
            return None
    # Only the timestamp is live.
    text = re.sub(
        r"^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}(?=       \n)",
        lambda _m: timestamp(),
        text,
        count=1,
    )
    text = re.sub(
        r"^(Timestamp {2,}: ).*$",
        lambda m: m.group(1) + timestamp(),
        text,
        count=1,
        flags=re.M,
    )
    return text


# --------------------------------------------------------------------------- command line


HELP = f"""{SIM_LINE}
It prints what NVIDIA's nvidia-smi prints, for a simulated machine (profile: {{profile}}).

Usage: nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
    --version                   Print version information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -i,   --id=                 Target a specific GPU (index, UUID or PCI bus id; comma list).
    -q,   --query               Display GPU info.
    --query-gpu=                Information about GPU (index, count, name, uuid, pci.bus_id,
                                memory.total, memory.used, memory.free, memory.reserved,
                                driver_version, compute_cap, persistence_mode, power.limit,
                                power.draw, mig.mode.current, temperature.gpu, utilization.gpu,
                                pstate, utilization.memory, temperature.memory, clocks.sm,
                                ecc.mode.current, ecc.errors.*.volatile.total, fan.speed, ...).
    --query-compute-apps=       List of active compute processes (pid, process_name,
                                used_memory, gpu_uuid, gpu_bus_id, gpu_name).
    --format=                   csv[,noheader][,nounits]
    topo -m | -mp | -p2p r|w|n|a|p
    nvlink -s
    -r,   --gpu-reset           Reset GPUs (root; refused while a process uses them); -i to choose.

Simulator extension (not in NVIDIA's tool):
    --gpusim-reset              Clear the simulated allocations registry ({{state}}),
                                leaked allocations included.
"""


def parse_args(argv):
    opts = {"ids": None, "query": False, "list": False, "query_gpu": None, "query_apps": None, "format": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, val = arg.partition("=")

        def value(name=name, eq=eq, val=val):
            nonlocal i
            if eq:
                return val
            i += 1
            if i >= len(argv):
                raise Invalid()
            return argv[i]

        if name in ("-i", "--id"):
            opts["ids"] = value()
        elif arg in ("-q", "--query"):
            opts["query"] = True
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        elif name == "--query-gpu":
            opts["query_gpu"] = value()
        elif name == "--query-compute-apps":
            opts["query_apps"] = value()
        elif name == "--format":
            opts["format"] = value()
        elif name in REAL_BUT_NOT_SIMULATED:
            raise NotSimulated(name)
        else:
            raise Invalid()
        i += 1
    modes = sum(bool(x) for x in (opts["query"], opts["list"], opts["query_gpu"], opts["query_apps"]))
    if modes > 1:
        raise Invalid()
    if (opts["query_gpu"] or opts["query_apps"]) and not opts["format"]:
        raise Invalid()
    if opts["format"] and not (opts["query_gpu"] or opts["query_apps"]):
        raise Invalid()
    return opts


def parse_format(fmt):
    tokens = [t.strip() for t in fmt.split(",")]
    if "csv" not in tokens or any(t not in ("csv", "noheader", "nounits") for t in tokens):
        raise Invalid()
    return "noheader" not in tokens, "nounits" not in tokens


def run(argv, out):
    """Run one command; write to ``out`` (a text stream); return the exit code."""
    profile_dir = os.environ.get("GPUSIM_PROFILE_DIR", DEFAULT_PROFILE_DIR)
    state_dir = os.environ.get("GPUSIM_STATE_DIR", DEFAULT_STATE_DIR)

    if argv and argv[0] == "--gpusim-reset":
        if len(argv) > 1:
            out.write(INVALID_ARGS)
            return RC_INVALID_ARGS
        removed = reset_registry(state_dir)
        out.write(f"{SIM_LINE}\nallocations registry {state_dir} cleared ({removed} file(s) removed)\n")
        return 0
    if argv and argv[0] in ("-h", "--help"):
        out.write(HELP.format(profile=profile_dir, state=state_dir))
        return 0

    try:
        profile = load_profile(profile_dir)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"{SIM_LINE}: cannot read profile {profile_dir}/profile.json: {exc}\n")
        out.write(NO_DRIVER_MESSAGE)
        return RC_DRIVER

    failure = profile.get("failure")
    if argv and argv[0] == "--version":
        if len(argv) > 1:
            out.write(INVALID_ARGS)
            return RC_INVALID_ARGS
        if failure:
            out.write(f"{SIM_LINE} (profile {profile.get('name')})\n")
            out.write(failure.get("message", NO_DRIVER_MESSAGE))
            return int(failure.get("rc", RC_DRIVER))
        drv = profile["driver_version"]
        out.write(
            f"NVIDIA-SMI version  : {drv}\n"
            f"NVML version        : {'.'.join(drv.split('.')[:2])}\n"
            f"DRIVER version      : {drv}\n"
            f"CUDA Version        : {profile['cuda_version']}\n"
            f"{SIM_LINE} (profile {profile.get('name')})\n"
        )
        return 0
    if failure:
        out.write(failure.get("message", NO_DRIVER_MESSAGE))
        return int(failure.get("rc", RC_DRIVER))

    if "-r" in argv or "--gpu-reset" in argv:
        rest = [a for a in argv if a not in ("-r", "--gpu-reset")]
        id_arg = None
        if len(rest) == 2 and rest[0] in ("-i", "--id"):
            id_arg = rest[1]
        elif len(rest) == 1 and rest[0].startswith("--id="):
            id_arg = rest[0].partition("=")[2]
        elif rest:
            out.write(INVALID_ARGS)
            return RC_INVALID_ARGS
        return gpu_reset(profile, state_dir, id_arg, out)

    indices = {g.get("index", pos) for pos, g in enumerate(profile.get("gpus", []))}
    machine = Machine(profile, load_allocations(state_dir, indices))

    try:
        if argv and argv[0] in ("topo", "nvlink") or (argv and argv[0] in REAL_SUBCOMMANDS_NOT_SIMULATED):
            text = run_subcommand(machine, argv)
        else:
            text = run_main(machine, argv)
    except Invalid:
        out.write(INVALID_ARGS)
        return RC_INVALID_ARGS
    except InvalidField as exc:
        out.write(f'Field "{exc.args[0]}" is not a valid field to query.\n\n')
        return RC_INVALID_ARGS
    except NotSimulated as exc:
        sys.stderr.write(f"{SIM_LINE}: '{exc.args[0]}' is a real nvidia-smi option that is not simulated\n")
        return RC_INVALID_ARGS
    except LookupError:
        out.write(NO_DEVICES)
        return RC_NOT_FOUND
    out.write(text)
    return 0


def run_subcommand(machine, argv):
    sub, rest = argv[0], argv[1:]
    if sub in REAL_SUBCOMMANDS_NOT_SIMULATED:
        raise NotSimulated(sub)
    cached = replay(machine, argv)
    if sub == "topo":
        if rest == ["-m"] or rest == ["--matrix"]:
            return cached if cached is not None else render_topo(machine, pcie_only=False)
        if rest == ["-mp"] or rest == ["--matrix_pci"]:
            return cached if cached is not None else render_topo(machine, pcie_only=True)
        if len(rest) == 2 and rest[0] in ("-p2p", "--p2pstatus") and rest[1] in ("r", "w", "n", "a", "p"):
            return cached if cached is not None else render_p2p(machine, rest[1])
        raise Invalid()
    if sub == "nvlink":
        if rest in (["-s"], ["--status"]):
            return cached if cached is not None else render_nvlink_status(machine, machine.gpus)
        raise Invalid()
    raise Invalid()


def run_main(machine, argv):
    opts = parse_args(argv)
    gpus = select_gpus(machine, opts["ids"])
    if gpus is None or not machine.gpus:
        raise LookupError()
    cached = replay(machine, argv)
    if cached is not None:
        return cached
    if opts["list"]:
        return render_list(machine, gpus)
    if opts["query"]:
        return render_q(machine, gpus)
    if opts["query_gpu"]:
        fields = _parse_fields(opts["query_gpu"], GPU_FIELDS)
        header, units = parse_format(opts["format"])
        return render_query_gpu(machine, gpus, fields, header, units)
    if opts["query_apps"]:
        fields = _parse_fields(opts["query_apps"], APP_FIELDS)
        header, units = parse_format(opts["format"])
        return render_query_apps(machine, gpus, fields, header, units)
    return render_table(machine, gpus)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        rc = run(argv, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        rc = 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
