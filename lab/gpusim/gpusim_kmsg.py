#!/usr/bin/python3
"""gpufleet lab simulator: this is not NVIDIA's kernel module.

``gpusim-kmsg`` writes lines into a lab host's kernel log, the way NVIDIA's kernel module reports a GPU fault
(an ``NVRM: Xid`` line). A lab host is a container on the controller's kernel: it has no NVIDIA module and no
kernel log of its own (``journalctl -k -b`` prints nothing there), so the lab writes the lines itself. The lab
tool installs this stdlib-only file as ``/usr/local/bin/gpusim-kmsg`` beside the simulated ``nvidia-smi``::

    gpusim-kmsg --boot                 # the kernel's first line: the host's kernel log can be read
    gpusim-kmsg --xid 79 --gpu 0       # GPU 0 fell off the bus (the boot line first, if not yet written)
    gpusim-kmsg --clear                # what a reboot does to this boot's kernel log

Each line becomes one journal entry with the fields the journal gives a kernel message (``_TRANSPORT=kernel``,
``SYSLOG_IDENTIFIER=kernel``, this boot's ``_BOOT_ID``), written with systemd's own ``systemd-journal-remote``
(Debian's ``systemd-journal-remote`` package, in the lab's base) into a journal file of its own under
``/run/log/journal/<machine-id>/``: ``journalctl -k -b`` reads it as it reads the kernel's messages, and it is
gone when the lab host restarts (``/run`` is a tmpfs), as a real boot's kernel log leaves ``-b``.

The Xid line is the format of NVIDIA's open kernel module (open-gpu-kernel-modules@df1c9a3,
src/nvidia/src/kernel/gpu/rc/kernel_rc.c:388-393): ``NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>',
name=<unknown>, GPU has fallen off the bus.``; the PCI address is the GPU's ``pci.bus_id`` from the
simulated ``nvidia-smi`` in the kernel's form (domain of 4 digits, no function).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

SIM_LINE = "gpufleet lab simulator: this is not NVIDIA's kernel module"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
FILE_NAME = "gpusim-kernel.journal"
# The message NVIDIA's module writes after the code, where the lab knows it (nverror.h's names: 79
# GPU_HAS_FALLEN_OFF_THE_BUS); other codes get the pid/name part only.
XID_TEXT = {79: "GPU has fallen off the bus."}


def journal_file() -> str:
    with open("/etc/machine-id", encoding="ascii") as fh:
        machine = fh.read().strip()
    return f"/run/log/journal/{machine}/{FILE_NAME}"


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
        return fh.read().strip().replace("-", "")


def kernel_address(bus_id: str) -> str:
    """``00000000:01:00.0`` (nvidia-smi's pci.bus_id) as NVIDIA's kernel module prints it: ``0000:01:00``."""
    domain, bus, rest = bus_id.strip().split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.split('.')[0].lower()}"


def xid_line(code: int, bus_id: str) -> str:
    text = XID_TEXT.get(code, "")
    return f"NVRM: Xid (PCI:{kernel_address(bus_id)}): {code}, pid='<unknown>', name=<unknown>, {text}".rstrip(" ,")


def gpu_bus_id(index: int) -> str:
    query = ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", str(index)]
    done = subprocess.run(query, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"gpusim-kmsg: no GPU {index}: {(done.stdout + done.stderr).strip()}")
    return done.stdout.strip()


def boot_line() -> str:
    return f"Linux version {platform.release()} ({SIM_LINE})"


def export_entries(lines: list[str], boot: str, host: str, now_us: int) -> bytes:
    """The journal export format (systemd's JOURNAL_EXPORT_FORMATS) of one kernel message per line."""
    out = []
    for i, line in enumerate(lines):
        fields = {
            "__REALTIME_TIMESTAMP": now_us + i,
            "__MONOTONIC_TIMESTAMP": time.monotonic_ns() // 1000 + i,
            "_BOOT_ID": boot,
            "_TRANSPORT": "kernel",
            "SYSLOG_FACILITY": 0,
            "SYSLOG_IDENTIFIER": "kernel",
            "PRIORITY": 3 if "Xid" in line else 5,
            "_HOSTNAME": host,
            "MESSAGE": line,
        }
        out.append("".join(f"{key}={value}\n" for key, value in fields.items()) + "\n")
    return "".join(out).encode()


def write(lines: list[str], path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o2755, exist_ok=True)
    entries = export_entries(lines, boot_id(), platform.node(), time.time_ns() // 1000)
    cmd = [JOURNAL_REMOTE, f"--output={path}", "--split-mode=none", "-"]
    done = subprocess.run(cmd, input=entries, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gpusim-kmsg: {JOURNAL_REMOTE} exited {done.returncode}: {done.stderr.decode().strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpusim-kmsg", description=SIM_LINE + ": writes the kernel log.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--boot", action="store_true", help="the kernel's first line (the log can be read)")
    what.add_argument("--xid", type=int, metavar="CODE", help="an NVRM: Xid line of this code")
    what.add_argument("--clear", action="store_true", help="this boot's planted lines gone (a reboot)")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU of the Xid (nvidia-smi index; default 0)")
    args = parser.parse_args(argv)
    path = journal_file()
    if args.clear:
        if os.path.exists(path):
            os.unlink(path)
        print(f"gpusim-kmsg: {path} removed ({SIM_LINE})")
        return 0
    lines = [] if os.path.exists(path) else [boot_line()]
    if args.xid is not None:
        lines.append(xid_line(args.xid, gpu_bus_id(args.gpu)))
    if lines:
        write(lines, path)
    for line in lines:
        print(f"gpusim-kmsg: kernel: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
