"""The simulated GPUs: the host's GPU profile and the shared memory registry.

Contract shared with the simulated nvidia-smi (gpusim):

* profile: ``$GPUSIM_PROFILE_DIR/profile.json`` (default dir ``/etc/gpusim/profile``)::

    {"name": ..., "driver_version": ..., "gpus": [{"index", "name", "uuid", "pci_bus_id",
     "memory_total_mib", "memory_reserved_mib", "compute_cap"}, ...]}

* registry: directory ``$GPUSIM_STATE_DIR`` (default ``/dev/shm/gpusim``, mode 1777). Each process that
  holds GPU memory writes ``alloc-<pid>.json`` atomically (tmp file + rename)::

    {"pid", "process_name", "gpus": {"<index>": MiB}, "leak": bool, "starttime": <field 22 of stat>}

  An entry counts while its pid is alive (same starttime) or while ``leak`` is true.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass

DEFAULT_PROFILE_DIR = "/etc/gpusim/profile"
DEFAULT_STATE_DIR = "/dev/shm/gpusim"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int
    memory_reserved_mib: int
    compute_cap: str

    @property
    def usable_mib(self) -> int:
        return max(0, self.memory_total_mib - self.memory_reserved_mib)


@dataclass(frozen=True)
class Profile:
    name: str
    driver_version: str
    gpus: tuple[Gpu, ...]

    def gpu(self, index: int) -> Gpu | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None


def profile_path() -> str:
    return os.path.join(os.environ.get("GPUSIM_PROFILE_DIR") or DEFAULT_PROFILE_DIR, "profile.json")


def state_dir() -> str:
    return os.environ.get("GPUSIM_STATE_DIR") or DEFAULT_STATE_DIR


def load_profile(path: str | None = None) -> Profile | None:
    """The host's GPUs, or None when there is no (usable) profile: no CUDA GPUs."""
    path = path or profile_path()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    gpus = []
    for i, g in enumerate(data.get("gpus") or []):
        gpus.append(
            Gpu(
                index=int(g.get("index", i)),
                name=str(g.get("name", "Simulated GPU")),
                uuid=str(g.get("uuid", f"GPU-sim-{i}")),
                pci_bus_id=str(g.get("pci_bus_id", "")),
                memory_total_mib=int(g.get("memory_total_mib", 0)),
                memory_reserved_mib=int(g.get("memory_reserved_mib", 0)),
                compute_cap=str(g.get("compute_cap", "")),
            )
        )
    if not gpus:
        return None
    return Profile(
        name=str(data.get("name", "unknown")),
        driver_version=str(data.get("driver_version", "")),
        gpus=tuple(gpus),
    )


def proc_stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (after the parenthesised comm), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    rparen = text.rfind(")")
    if rparen < 0:
        return None
    return text[rparen + 2 :].split()


def proc_starttime(pid: int) -> int | None:
    fields = proc_stat_fields(pid)
    if not fields or len(fields) < 20:
        return None
    try:
        return int(fields[19])  # field 22 overall: fields[0] is field 3 (state)
    except ValueError:
        return None


def pid_alive(pid: int, starttime: int | None = None) -> bool:
    fields = proc_stat_fields(pid)
    if fields is None:
        return False
    if fields[0] in ("Z", "X"):  # zombie/dead: its GPU memory is gone
        return False
    if starttime is not None and len(fields) >= 20:
        try:
            if int(fields[19]) != int(starttime):
                return False  # pid reused
        except ValueError:
            pass
    return True


def ensure_state_dir(path: str | None = None) -> str:
    path = path or state_dir()
    if not os.path.isdir(path):
        try:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o1777)
        except OSError:
            pass
    return path


def alloc_path(pid: int, path: str | None = None) -> str:
    return os.path.join(path or state_dir(), f"alloc-{pid}.json")


def write_alloc(process_name: str, gpus_mib: dict[int, int], leak: bool = False, pid: int | None = None) -> str:
    """Write (atomically replace) this process's allocation entry."""
    pid = pid or os.getpid()
    d = ensure_state_dir()
    entry = {
        "pid": pid,
        "process_name": process_name,
        "gpus": {str(k): int(v) for k, v in gpus_mib.items()},
        "leak": bool(leak),
        "starttime": proc_starttime(pid),
    }
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-alloc-{pid}-", suffix=".part", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, alloc_path(pid, d))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return alloc_path(pid, d)


def remove_alloc(pid: int | None = None) -> None:
    with contextlib.suppress(OSError):
        os.unlink(alloc_path(pid or os.getpid()))


def used_by_others(exclude_pid: int | None = None) -> tuple[dict[int, int], dict[int, list[tuple[int, int]]]]:
    """MiB in use per GPU index by live (or leaked) registry entries, and (pid, MiB) holders per GPU."""
    used: dict[int, int] = {}
    holders: dict[int, list[tuple[int, int]]] = {}
    d = state_dir()
    try:
        names = os.listdir(d)
    except OSError:
        return used, holders
    for name in names:
        if not (name.startswith("alloc-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(d, name), encoding="utf-8") as f:
                entry = json.load(f)
            pid = int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid == exclude_pid:
            continue
        if not (entry.get("leak") or pid_alive(pid, entry.get("starttime"))):
            continue
        for idx, mib in (entry.get("gpus") or {}).items():
            try:
                i, m = int(idx), int(mib)
            except (TypeError, ValueError):
                continue
            used[i] = used.get(i, 0) + m
            holders.setdefault(i, []).append((pid, m))
    return used, holders
