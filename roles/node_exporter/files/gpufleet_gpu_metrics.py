#!/usr/bin/python3
"""gpufleet: per-GPU metrics for node-exporter's textfile collector (installed by roles/node_exporter).

A systemd timer runs this script every few seconds (15 s by default). It asks ``nvidia-smi`` for each GPU's
utilisation, memory, temperature, power, volatile ECC error counts, row remapping state, clock event reasons and
PCIe link (current and maximum generation and width), splits the memory in use into what the inference engine's
processes hold (their ``/proc/<pid>/cgroup`` names one of the engine's systemd units) and what anything else holds
(another program, an orphaned scheduler, memory leaked by a process that is gone), counts the ``NVRM: Xid`` lines
in the kernel log since boot (in all, and per GPU and Xid code), and writes it all in the Prometheus text format
to one ``*.prom`` file, which node-exporter's textfile collector reads at every scrape.

Why a textfile collector: there is no DCGM (nor dcgm-exporter) on these hosts, and ``nvidia-smi`` answers the
same quantities from NVML. Run from a timer, one nvidia-smi process per period serves every scrape (no process
per scrape, and a hung nvidia-smi, as on a GPU that fell off the bus, never blocks node-exporter). When
nvidia-smi fails, the file says so (``gpufleet_gpu_collector_success 0``, the error on stderr, i.e. in the
journal) instead of keeping stale numbers; ``gpufleet_gpu_collector_last_run_timestamp_seconds`` shows a timer
that stopped.

  gpufleet_gpu_metrics.py --output /var/lib/prometheus/node-exporter/gpufleet_gpu.prom \\
      --engine-unit sglang-server.service [--engine-unit ...] [--nvidia-smi /usr/bin/nvidia-smi]

Exit status: 0 when the file was written (also when it reports a failed reading), 1 when it could not be
written, 2 for a bad command line. Standard library only (it runs with the host's python3, 3.11).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    # health: a row remapping that waits for a GPU reset, one that failed (the GPU's memory has no spare rows
    # left); why the clocks are held down; the PCIe link as trained against its maximum (nvidia-smi
    # --help-query-gpu: "These may be reduced when the GPU is not in use")
    "pci.bus_id",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_event_reasons.active",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)
# nvml.h's clocks event reason bits (nvmlClocksEventReason*, the names of nvidia-smi --query-gpu's
# clocks_event_reasons.<name> fields), read from clocks_event_reasons.active's mask.
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# An Xid line of NVIDIA's kernel module (open-gpu-kernel-modules kernel_rc.c): "NVRM: Xid (PCI:0000:3b:00): 79,
# pid=..., ..."; MIG adds " GPU-I:NN" inside the parentheses.
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)[^)]*\): (\d+)\b")
APP_FIELDS = ("pid", "used_memory", "gpu_uuid")
GPU_QUERY = ["--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]
JOURNAL_KERNEL = ["journalctl", "-k", "-b", "-o", "cat", "--no-pager"]
XID_MARK = "NVRM: Xid"
# journalctl exits 0 but sees no kernel messages: not root nor in adm/systemd-journal, or no journal at all.
# With -o cat, systemd 252 prints neither hint: its output is just empty. A booted host's kernel log is never
# empty (the kernel's own start-up lines), so empty output means "cannot read", not "no Xid".
JOURNAL_BLIND = ("not seeing messages from other users and the system", "No journal files were")

MIB = 1048576
COMMAND_TIMEOUT_S = 10  # nvidia-smi can hang on a GPU that fell off the bus; the timer period is 15 s

# Metric families in output order: name -> help. The *_total ones are counters (the Prometheus naming rule),
# the others gauges.
FAMILIES = {
    "gpufleet_gpu_info": "GPU identity (always 1): gpu is nvidia-smi's index, with its UUID and product name.",
    "gpufleet_gpu_utilization_ratio": (
        "Fraction of the last sample period (1/6 s to 1 s) in which a kernel ran on the GPU (0..1)."
    ),
    "gpufleet_gpu_memory_used_bytes": "GPU memory in use (nvidia-smi memory.used).",
    "gpufleet_gpu_memory_total_bytes": "GPU memory installed (nvidia-smi memory.total).",
    "gpufleet_gpu_memory_engine_bytes": (
        "GPU memory held by the inference engine's processes (their cgroup is one of the engine's systemd units)."
    ),
    "gpufleet_gpu_memory_foreign_bytes": (
        "GPU memory in use that the engine's processes do not hold: other programs, processes outside the engine's "
        "units, memory leaked by processes that are gone (memory used minus engine, at least 0)."
    ),
    "gpufleet_gpu_temperature_celsius": "GPU core temperature in degrees Celsius.",
    "gpufleet_gpu_power_watts": "Board power draw in watts (a 1 s average on Ampere and newer).",
    "gpufleet_gpu_ecc_errors_corrected_total": (
        "Corrected ECC errors since the driver was loaded (volatile); absent where the GPU reports none."
    ),
    "gpufleet_gpu_ecc_errors_uncorrected_total": (
        "Uncorrected ECC errors since the driver was loaded (volatile); absent where the GPU reports none."
    ),
    "gpufleet_gpu_remapped_rows_pending": "1 when a row remapping waits for the GPU's next reset (nvidia-smi).",
    "gpufleet_gpu_remapped_rows_failure": "1 when a row remapping failed in the GPU's lifespan (nvidia-smi).",
    "gpufleet_gpu_clock_event_active": (
        "1 while the clock event reason (nvml.h bit of clocks_event_reasons.active) holds the clocks down, else 0."
    ),
    "gpufleet_gpu_pcie_link_generation": "PCIe link generation: link=current as trained now, link=max possible.",
    "gpufleet_gpu_pcie_link_width": "PCIe link width in lanes: link=current as trained now, link=max possible.",
    "gpufleet_gpu_xid_errors_total": (
        "NVRM: Xid lines in the kernel log since boot (all GPUs); absent when the kernel log cannot be read."
    ),
    "gpufleet_gpu_xid_code_errors_total": (
        "NVRM: Xid lines of one Xid code since boot, by GPU (gpu empty: a PCI address no GPU of nvidia-smi has)."
    ),
    "gpufleet_gpu_collector_success": "1 when nvidia-smi answered, 0 when it failed (error in the journal).",
    "gpufleet_gpu_collector_last_run_timestamp_seconds": "Unix time of the collector's last run.",
}

_NUMBER_RE = re.compile(r"^(-?\d+(?:\.\d+)?)(?: ?(?:%|MiB|W|C))?$")


class CollectError(Exception):
    """nvidia-smi failed or printed something this script cannot read."""


# --------------------------------------------------------------------------- parsing nvidia-smi


def parse_number(value):
    """A float from one CSV cell (``114.79``; a unit such as ``114.79 W`` is tolerated), or None for what
    nvidia-smi prints where it has no value (``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ...)."""
    match = _NUMBER_RE.match(value.strip())
    return float(match.group(1)) if match else None


def _cells(line, count, text_column=None):
    """The ``count`` cells of one nvidia-smi CSV line (``", "``-separated, never quoted). Extra cells are
    commas inside the text column ``text_column`` (a product name), joined back."""
    cells = [c.strip() for c in line.split(",")]
    extra = len(cells) - count
    if extra < 0 or (extra > 0 and text_column is None):
        raise CollectError(f"nvidia-smi printed {len(cells)} columns where {count} were asked for: {line!r}")
    if extra:
        cells[text_column : text_column + extra + 1] = [", ".join(cells[text_column : text_column + extra + 1])]
    return cells


def parse_gpu_csv(text):
    """One dict per GPU from ``--query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits``.

    Keys: index, uuid, name (strings), utilization (0..1), memory_used_bytes, memory_total_bytes, temperature,
    power, ecc_corrected, ecc_uncorrected; a value nvidia-smi does not give (``[N/A]``) is None.
    """
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        c = dict(zip(GPU_FIELDS, _cells(line, len(GPU_FIELDS), text_column=2), strict=True))
        if not c["index"].isdigit():
            raise CollectError(f"not a GPU line of nvidia-smi --query-gpu: {line!r}")
        util = parse_number(c["utilization.gpu"])
        used = parse_number(c["memory.used"])
        total = parse_number(c["memory.total"])
        ecc_c = parse_number(c["ecc.errors.corrected.volatile.total"])
        ecc_u = parse_number(c["ecc.errors.uncorrected.volatile.total"])
        mask = c["clocks_event_reasons.active"]
        gpus.append(
            {
                "index": c["index"],
                "uuid": c["uuid"],
                "name": c["name"],
                "utilization": None if util is None else util / 100.0,
                "memory_used_bytes": None if used is None else int(used) * MIB,
                "memory_total_bytes": None if total is None else int(total) * MIB,
                "temperature": parse_number(c["temperature.gpu"]),
                "power": parse_number(c["power.draw"]),
                "ecc_corrected": None if ecc_c is None else int(ecc_c),
                "ecc_uncorrected": None if ecc_u is None else int(ecc_u),
                "pci": pci_address(c["pci.bus_id"]),
                "remap_pending": yes_no(c["remapped_rows.pending"]),
                "remap_failure": yes_no(c["remapped_rows.failure"]),
                "clock_events": int(mask, 16) if re.fullmatch(r"0x[0-9A-Fa-f]+", mask) else None,
                "pcie_gen": (parse_number(c["pcie.link.gen.current"]), parse_number(c["pcie.link.gen.max"])),
                "pcie_width": (parse_number(c["pcie.link.width.current"]), parse_number(c["pcie.link.width.max"])),
            }
        )
    return gpus


def yes_no(value):
    """1 for nvidia-smi's ``Yes``, 0 for ``No``, None for what it has no value for (``[N/A]``)."""
    return {"Yes": 1, "No": 0}.get(value.strip())


def pci_address(bus_id):
    """``00000000:3B:00.0`` (nvidia-smi's pci.bus_id) as the kernel module's Xid lines name it: ``0000:3b:00``."""
    m = re.fullmatch(r"([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)(?:\.[0-9A-Fa-f]+)?", bus_id.strip())
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}"


def parse_apps_csv(text):
    """One dict per (process, GPU) from ``--query-compute-apps=pid,used_memory,gpu_uuid
    --format=csv,noheader,nounits``: pid (int), used_bytes (int, None for ``[N/A]``), gpu_uuid. Empty output
    (no compute process) is an empty list."""
    apps = []
    for line in text.splitlines():
        if not line.strip():
            continue
        pid, used, uuid = _cells(line, len(APP_FIELDS))
        if not pid.isdigit():
            raise CollectError(f"not a process line of nvidia-smi --query-compute-apps: {line!r}")
        mib = parse_number(used)
        apps.append({"pid": int(pid), "used_bytes": None if mib is None else int(mib) * MIB, "gpu_uuid": uuid})
    return apps


# --------------------------------------------------------------------------- which processes are the engine's


def unit_name(name):
    """``sglang-server`` -> ``sglang-server.service`` (as systemctl reads it); full unit names unchanged."""
    return name if name.endswith((".service", ".scope", ".slice")) else name + ".service"


def _read_proc(proc_root, pid, name):
    with open(os.path.join(proc_root, str(pid), name), encoding="utf-8", errors="replace") as fh:
        return fh.read()


def pid_in_units(pid, units, proc_root="/proc"):
    """True when process ``pid`` is alive (not a zombie) and a component of its cgroup path is one of
    ``units`` (``0::/system.slice/sglang-server.service``; also a process in a sub-cgroup of the unit)."""
    try:
        status = _read_proc(proc_root, pid, "status")
        cgroup = _read_proc(proc_root, pid, "cgroup")
    except OSError:
        return False  # gone: its memory is no process's of the engine (a leak, or released a moment ago)
    state = re.search(r"^State:\s*(\S)", status, re.M)
    if state and state.group(1) in ("Z", "X"):
        return False
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        if any(part in units for part in path.split("/")):
            return True
    return False


def engine_pids(pids, engine_units, proc_root="/proc"):
    """The subset of ``pids`` that belong to the engine (see :func:`pid_in_units`)."""
    units = {unit_name(u) for u in engine_units}
    if not units:
        return set()
    return {pid for pid in set(pids) if pid_in_units(pid, units, proc_root)}


def engine_memory(gpus, apps, engine):
    """Bytes held by the engine's processes (pids in ``engine``) per GPU index; 0 where none."""
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    held = {g["index"]: 0 for g in gpus}
    for app in apps:
        index = by_uuid.get(app["gpu_uuid"])
        if index is not None and app["pid"] in engine and app["used_bytes"] is not None:
            held[index] += app["used_bytes"]
    return held


# --------------------------------------------------------------------------- Xid errors


def count_xid(text):
    """Lines of the kernel log that report an Xid (``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ...``)."""
    return sum(1 for line in text.splitlines() if XID_MARK in line)


def xid_codes(text):
    """{(PCI address, code): lines} of the kernel log's Xid lines (address as pci_address gives it)."""
    counts = {}
    for match in XID_LINE.finditer(text):
        domain, bus, device = match.group(1).split(":")
        key = (f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}", int(match.group(2)))
        counts[key] = counts.get(key, 0) + 1
    return counts


def read_xid_errors(run=subprocess.run):
    """Xid lines in the kernel log since boot, or None when it cannot be read (read_kernel_log)."""
    text = read_kernel_log(run)
    return None if text is None else count_xid(text)


def read_kernel_log(run=subprocess.run):
    """The kernel log since boot, or None when it cannot be read (no journalctl, an error, no permission, no
    journal: nothing at all since boot): then the Xid metrics are left out rather than reported as 0."""
    try:
        done = run(
            JOURNAL_KERNEL, capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        sys.stderr.write(f"gpufleet_gpu_metrics: kernel log not read ({exc}); Xid metric left out\n")
        return None
    lines = [ln for ln in (done.stdout or "").splitlines() if ln.strip() and ln.strip() != "-- No entries --"]
    if done.returncode != 0 or not lines or any(mark in (done.stderr or "") for mark in JOURNAL_BLIND):
        said = " ".join((done.stderr or "").split())[:200] or "no kernel messages"
        sys.stderr.write(
            f"gpufleet_gpu_metrics: journalctl -k exited {done.returncode} ({said}); Xid metric left out\n"
        )
        return None
    return done.stdout


# --------------------------------------------------------------------------- output


def escape_label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(number):
    if isinstance(number, float) and number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return repr(number) if isinstance(number, float) else str(number)


def render(gpus, engine_bytes, xid_errors, timestamp, xids=None):
    """The textfile's content. ``gpus``: from :func:`parse_gpu_csv`, or None when nvidia-smi failed (then only
    the success and timestamp metrics). ``engine_bytes``: from :func:`engine_memory`. ``xid_errors``: int or
    None (left out). ``xids``: from :func:`xid_codes` (None: the kernel log was not read)."""
    samples = {name: [] for name in FAMILIES}

    def add(metric, value, gpu=None, extra=None):
        if value is None:
            return
        labels = {} if gpu is None else {"gpu": gpu["index"], **(extra or {})}
        text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
        samples[metric].append(f"{metric}{{{text}}} {_value(value)}" if text else f"{metric} {_value(value)}")

    for gpu in sorted(gpus or [], key=lambda g: int(g["index"])):
        add("gpufleet_gpu_info", 1, gpu, {"uuid": gpu["uuid"], "name": gpu["name"]})
        add("gpufleet_gpu_utilization_ratio", gpu["utilization"], gpu)
        add("gpufleet_gpu_memory_used_bytes", gpu["memory_used_bytes"], gpu)
        add("gpufleet_gpu_memory_total_bytes", gpu["memory_total_bytes"], gpu)
        engine = (engine_bytes or {}).get(gpu["index"], 0)
        add("gpufleet_gpu_memory_engine_bytes", engine, gpu)
        used = gpu["memory_used_bytes"]
        add("gpufleet_gpu_memory_foreign_bytes", None if used is None else max(0, used - engine), gpu)
        add("gpufleet_gpu_temperature_celsius", gpu["temperature"], gpu)
        add("gpufleet_gpu_power_watts", gpu["power"], gpu)
        add("gpufleet_gpu_ecc_errors_corrected_total", gpu["ecc_corrected"], gpu)
        add("gpufleet_gpu_ecc_errors_uncorrected_total", gpu["ecc_uncorrected"], gpu)
        add("gpufleet_gpu_remapped_rows_pending", gpu.get("remap_pending"), gpu)
        add("gpufleet_gpu_remapped_rows_failure", gpu.get("remap_failure"), gpu)
        if gpu.get("clock_events") is not None:
            for reason, bit in CLOCK_EVENT_REASONS.items():
                add("gpufleet_gpu_clock_event_active", 1 if gpu["clock_events"] & bit else 0, gpu, {"reason": reason})
        for which, gen, width in zip(
            ("current", "max"), gpu.get("pcie_gen", ()), gpu.get("pcie_width", ()), strict=True
        ):
            add("gpufleet_gpu_pcie_link_generation", gen, gpu, {"link": which})
            add("gpufleet_gpu_pcie_link_width", width, gpu, {"link": which})
    if gpus is not None:
        add("gpufleet_gpu_xid_errors_total", xid_errors)
        by_pci = {g.get("pci"): g for g in gpus}
        for (pci, code), count in sorted((xids or {}).items()):
            gpu = by_pci.get(pci, {"index": ""})
            add("gpufleet_gpu_xid_code_errors_total", count, gpu, {"code": str(code)})
    add("gpufleet_gpu_collector_success", 0 if gpus is None else 1)
    add("gpufleet_gpu_collector_last_run_timestamp_seconds", round(float(timestamp), 3))

    out = []
    for name, help_text in FAMILIES.items():
        if samples[name]:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}")
            out.extend(samples[name])
    return "\n".join(out) + "\n"


def write_atomic(path, text):
    """Write ``text`` to ``path`` through a temporary file in the same folder and rename() (node-exporter
    never reads half a file; it only reads ``*.prom``, so the temporary name ends otherwise); mode 0644."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), 0o644)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------- running it


def run_nvidia_smi(nvidia_smi, args, run=subprocess.run):
    """nvidia-smi's stdout, or CollectError (it prints its own errors on stdout, e.g. no driver, exit 9)."""
    try:
        argv = [nvidia_smi, *args]
        done = run(argv, capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CollectError(f"{nvidia_smi} {args[0]} did not answer within {COMMAND_TIMEOUT_S} s") from exc
    except OSError as exc:
        raise CollectError(f"{nvidia_smi}: {exc}") from exc
    if done.returncode != 0:
        said = " ".join(((done.stdout or "") + " " + (done.stderr or "")).split())
        raise CollectError(f"{nvidia_smi} {args[0]} exited {done.returncode}: {said[:500]}")
    return done.stdout


def collect(nvidia_smi, engine_units, proc_root="/proc", run=subprocess.run, now=time.time):
    """Everything for one run: the textfile content; nvidia-smi's failure goes to stderr."""
    try:
        gpus = parse_gpu_csv(run_nvidia_smi(nvidia_smi, GPU_QUERY, run))
        apps = parse_apps_csv(run_nvidia_smi(nvidia_smi, APPS_QUERY, run))
    except CollectError as exc:
        sys.stderr.write(f"gpufleet_gpu_metrics: {exc}\n")
        return render(None, None, None, now())
    engine = engine_pids([a["pid"] for a in apps], engine_units, proc_root)
    kernel_log = read_kernel_log(run)
    xids = None if kernel_log is None else xid_codes(kernel_log)
    count = None if kernel_log is None else count_xid(kernel_log)
    return render(gpus, engine_memory(gpus, apps, engine), count, now(), xids)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Per-GPU metrics from nvidia-smi for node-exporter's textfile.")
    parser.add_argument("--output", required=True, help="the *.prom file to write (atomically)")
    parser.add_argument(
        "--engine-unit",
        action="append",
        default=[],
        help="systemd unit of the inference engine (repeatable); its processes' GPU memory is the engine's",
    )
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi to run (default: from PATH)")
    parser.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)  # tests: a fake /proc
    args = parser.parse_args(argv)
    text = collect(args.nvidia_smi, args.engine_unit, args.proc_root)
    try:
        write_atomic(args.output, text)
    except OSError as exc:
        sys.stderr.write(f"gpufleet_gpu_metrics: cannot write {args.output}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
