"""Fault injection via ``SGLANG_SIM_FAULT`` (comma-separated), so tests inject through a unit's env."""

from __future__ import annotations

import os
from dataclasses import dataclass

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


def parse_faults(text: str | None) -> Faults:
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
            raise FaultError(f"unknown fault {item!r} in SGLANG_SIM_FAULT; known faults: {', '.join(KNOWN)}")
        kwargs[field] = True
    return Faults(**kwargs)  # type: ignore[arg-type]


def from_env() -> Faults:
    return parse_faults(os.environ.get("SGLANG_SIM_FAULT"))
