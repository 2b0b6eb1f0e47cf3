"""Fault injection via ``SGLANG_SIM_FAULT`` (comma-separated), so tests inject through a unit's env.

Runtime faults (lab equipment): ``SGLANG_SIM_FAULT_FILE=/path`` names a file in the same syntax, re-read when its
mtime (or size, inode) changes, at each request; the faults it names are merged with the start-time ones. Only
faults that can happen to a server that is already up may come from it (``RUNTIME``): a fault meant for the
start-up in the file is refused with a log line, and so is an unknown name (the server keeps running).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass

from .log import log

KNOWN = (
    "crash-on-start",
    "crash-after-load",
    "never-ready",
    "nan-output",
    "wrong-answer",
    "slow-start=SECONDS",
    "leak-gpu-memory",
    "port-taken",
    "hang-after-ready",
    "orphan-children",
)


# Faults the fault file may switch on while the server runs ("after a healthy start").
RUNTIME = ("wrong-answer", "nan-output", "hang-after-ready")


class FaultError(ValueError):
    pass


@dataclass(frozen=True)
class Faults:
    crash_on_start: bool = False
    crash_after_load: bool = False
    never_ready: bool = False
    nan_output: bool = False
    wrong_answer: bool = False
    slow_start: float = 0.0
    leak_gpu_memory: bool = False
    port_taken: bool = False
    hang_after_ready: bool = False
    orphan_children: bool = False

    def names(self) -> list[str]:
        out = []
        for field, value in self.__dict__.items():
            if value:
                name = field.replace("_", "-")
                out.append(f"{name}={value:g}" if field == "slow_start" else name)
        return out


def parse_faults(text: str | None, source: str = "SGLANG_SIM_FAULT") -> Faults:
    kwargs: dict[str, object] = {}
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if name == "slow-start":
            try:
                seconds = float(value)
            except ValueError as e:
                raise FaultError(f"slow-start needs a number of seconds (slow-start=SECONDS), got {item!r}") from e
            if not sep or seconds < 0:
                raise FaultError(f"slow-start needs a non-negative number of seconds, got {item!r}")
            kwargs["slow_start"] = seconds
            continue
        field = name.replace("-", "_")
        if sep or field not in Faults.__dataclass_fields__ or field == "slow_start":
            raise FaultError(f"unknown fault {item!r} in {source}; known faults: {', '.join(KNOWN)}")
        kwargs[field] = True
    return Faults(**kwargs)  # type: ignore[arg-type]


def from_env() -> Faults:
    return parse_faults(os.environ.get("SGLANG_SIM_FAULT"))


def merge(a: Faults, b: Faults) -> Faults:
    return Faults(**{f.name: getattr(a, f.name) or getattr(b, f.name) for f in dataclasses.fields(Faults)})


class FaultSource:
    """The faults in force for a request: the start-time ones (``SGLANG_SIM_FAULT``) merged with those of
    ``SGLANG_SIM_FAULT_FILE`` (re-read only when the file's mtime, size or inode changed: one stat per call)."""

    def __init__(self, start: Faults, path: str | None = None):
        self.start = start
        self.path = path if path is not None else (os.environ.get("SGLANG_SIM_FAULT_FILE") or None)
        self.lock = threading.Lock()
        self._stamp: tuple | None = None
        self._file = Faults()
        self._merged = start

    @property
    def file_faults(self) -> Faults:
        """The faults the file names (as of the last ``current()``)."""
        return self._file

    def current(self) -> Faults:
        if not self.path:
            return self.start
        try:
            st = os.stat(self.path)
            stamp: tuple | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        with self.lock:
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload(stamp is not None)
            return self._merged

    def _reload(self, exists: bool) -> None:
        text = ""
        if exists:
            try:
                with open(self.path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                log(f"sglang-sim: SGLANG_SIM_FAULT_FILE={self.path}: unreadable ({e}); no runtime fault")
        kwargs: dict[str, bool] = {}
        for raw in text.replace("\n", ",").split(","):
            item = raw.strip()
            if not item or item.startswith("#"):
                continue
            name = item.lower()
            if name not in RUNTIME:
                why = (
                    "unknown fault"
                    if name.partition("=")[0] not in [k.partition("=")[0] for k in KNOWN]
                    else ("not a runtime fault")
                )
                log(
                    f"sglang-sim: SGLANG_SIM_FAULT_FILE={self.path}: refused {item!r} ({why}; "
                    f"runtime faults: {', '.join(RUNTIME)})"
                )
                continue
            kwargs[name.replace("-", "_")] = True
        new = Faults(**kwargs)  # type: ignore[arg-type]
        if new != self._file:
            names = ", ".join(new.names()) or "none"
            log(f"sglang-sim: runtime fault injection (SGLANG_SIM_FAULT_FILE={self.path}): {names}")
        self._file = new
        self._merged = merge(self.start, new)
