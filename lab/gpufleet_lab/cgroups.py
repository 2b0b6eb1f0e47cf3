"""One cgroup subtree per lab host, so the host's systemd can kill a whole control group.

Why: systemd-nspawn started with ``--register=no --keep-unit`` makes no scope for the container; it takes
the cgroup its caller runs in (``cg_pid_get_path`` of itself) and puts the container's init into
``<that>/payload`` and itself into ``<that>/supervisor``. On a machine whose PID 1 is not systemd the
caller sits in the root cgroup, so every lab host of every lab shared ``/payload``: two hosts running the
same unit (two ``sglang.service``, say) had one and the same ``/payload/system.slice/<unit>`` cgroup. In
cgroup v2 a process of another PID namespace reads as ``0`` in ``cgroup.procs``; systemd's
``cg_read_pid`` answers such an entry with ``-EIO``, so ``systemctl stop`` logged "Failed to kill control
group ... Input/output error" and only the processes it had signalled by PID (the main process) got the
signal: KillMode=control-group and the final SIGKILL of KillMode=mixed did not reach the rest.

Here each host gets ``<hierarchy>/gpufleet-lab/<lab>/<host>`` in every hierarchy nspawn uses (the
cgroup v2 one and the v1 ``name=systemd`` one of a hybrid host; the v2 one alone on a unified host), and
nspawn is started inside it, so the container's cgroup tree (``.../payload``, delegated to its systemd
through a cgroup namespace) holds that host's processes only. The directories are recorded with the host
and removed by ``down``/``prune`` after the processes in them are killed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

from gpufleet_lab.sysutil import LabError

BASE = "gpufleet-lab"
MOUNTS = Path("/proc/self/mounts")


def hierarchies() -> list[Path]:
    """Mount points of the cgroup hierarchies systemd-nspawn places a container in (v2, v1 name=systemd)."""
    found: list[Path] = []
    for line in MOUNTS.read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, options = Path(fields[1].replace("\\040", " ")), fields[2], fields[3].split(",")
        if (fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options)) and point not in found:
            found.append(point)
    return found


def lab_dirs(lab: str) -> list[Path]:
    """The lab's directory in each hierarchy: <hierarchy>/gpufleet-lab/<lab>."""
    return [mount / BASE / lab for mount in hierarchies()]


def host_dirs(lab: str, host: str) -> list[Path]:
    """The host's cgroup in each hierarchy: <hierarchy>/gpufleet-lab/<lab>/<host>."""
    return [d / host for d in lab_dirs(lab)]


def create(dirs: list[Path]) -> None:
    if not dirs:
        raise LabError(
            "no cgroup hierarchy found (no cgroup2 and no name=systemd mount in /proc/self/mounts): "
            "mount cgroup2 on /sys/fs/cgroup (or /sys/fs/cgroup/unified) before bringing up a lab"
        )
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)


def enter(dirs: list[Path]) -> None:
    """Move the calling process into dirs (used between fork and exec of systemd-nspawn)."""
    for d in dirs:
        with open(d / "cgroup.procs", "w") as procs:
            procs.write("0\n")


def pids(dirs: list[Path]) -> set[int]:
    """Every process in dirs and their descendant cgroups."""
    found: set[int] = set()
    for d in dirs:
        for sub, _, _ in os.walk(d):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, OSError):
                found.update(int(p) for p in Path(sub, "cgroup.procs").read_text().split() if int(p) > 0)
    return found


def kill(dirs: list[Path], timeout: float = 10.0) -> None:
    """SIGKILL every process in dirs (whole subtrees) and wait until they are gone."""
    deadline = time.monotonic() + timeout
    while True:
        left = pids(dirs)
        if not left:
            return
        for d in dirs:
            # cgroup v2 (Linux 5.14+) kills a whole subtree at once; v1 is done PID by PID below.
            with contextlib.suppress(FileNotFoundError, OSError):
                Path(d, "cgroup.kill").write_text("1\n")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        if time.monotonic() > deadline:
            raise LabError(f"processes {sorted(left)} are still in cgroup {dirs[0]} after SIGKILL")
        time.sleep(0.05)


def remove(dirs: list[Path], timeout: float = 10.0) -> None:
    """Kill what runs in dirs, then remove them and every cgroup below them (deepest first)."""
    dirs = [d for d in dirs if d.is_dir()]
    kill(dirs, timeout)
    deadline = time.monotonic() + timeout
    for d in dirs:
        for sub, _, _ in sorted(os.walk(d), key=lambda w: len(w[0]), reverse=True):
            while True:
                try:
                    os.rmdir(sub)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    # EBUSY: a process that was just killed is not yet out of the cgroup.
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise LabError(f"cannot remove cgroup {sub}: {exc}") from exc
                    time.sleep(0.05)


def remove_empty_parents(lab: str) -> None:
    """Remove <hierarchy>/gpufleet-lab/<lab> and <hierarchy>/gpufleet-lab when nothing is left in them."""
    for d in lab_dirs(lab):
        for parent in (d, d.parent):
            with contextlib.suppress(FileNotFoundError, OSError):
                os.rmdir(parent)
