"""Small process, file and prerequisite helpers shared by the lab tool."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


class LabError(RuntimeError):
    """A lab operation failed; the message says what, where and how to fix it."""


def run(cmd: Sequence[str], *, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess:
    """Run a command, capturing output; raise LabError naming the command on failure."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, input=input_text, check=False)
    if check and proc.returncode != 0:
        raise LabError(
            f"command failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def require_prerequisites() -> None:
    """Fail with a clear message when something the lab needs is missing."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, overlay mounts, nspawn): run it as root")
    missing = [
        tool
        for tool in ("systemd-nspawn", "mmdebstrap", "iptables", "ip", "nsenter", "zstd", "ssh-keygen")
        if shutil.which(tool) is None
    ]
    if missing:
        raise LabError(
            f"missing tools: {', '.join(missing)}. Install them with: "
            "apt-get install -y systemd-container mmdebstrap iptables iproute2 util-linux zstd openssh-client"
        )
    filesystems = Path("/proc/filesystems").read_text()
    if "overlay" not in filesystems:
        proc = run(["modprobe", "overlay"], check=False)
        if proc.returncode != 0 or "overlay" not in Path("/proc/filesystems").read_text():
            raise LabError("this kernel has no overlayfs (not in /proc/filesystems and modprobe overlay failed)")


def proc_starttime(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    state = fields[0]
    if state == "Z":
        return None
    return int(fields[19])


def pid_is(pid: int | None, starttime: int | None) -> bool:
    """True when the process PID is alive and is the same process that was recorded (no PID reuse)."""
    if not pid or starttime is None:
        return False
    return proc_starttime(pid) == starttime


def kill_recorded(pid: int | None, starttime: int | None, timeout: float = 10.0) -> None:
    """SIGTERM a recorded process, then SIGKILL it after timeout. Never kills a reused PID."""
    if not pid_is(pid, starttime):
        return
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_is(pid, starttime):
            return
        _reap(pid)
        time.sleep(0.05)
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while pid_is(pid, starttime) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def pids_in_netns(netns_path: str) -> list[int]:
    """PIDs of every process whose network namespace is the one bound at netns_path."""
    try:
        target = os.stat(netns_path)
    except FileNotFoundError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            found.append(int(entry))
    return found


def mounted_under(path: Path) -> list[str]:
    """Mount points at or below path, deepest first."""
    prefix = str(path.resolve())
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def port_open(address: str, port: int) -> bool:
    """True when something accepts TCP connections on address:port (half a second to answer)."""
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def spawn_detached(argv: Sequence[str], log) -> subprocess.Popen:
    """Start a long-lived child in its own session, output to the open binary file ``log`` (closed here)."""
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    finally:
        log.close()
