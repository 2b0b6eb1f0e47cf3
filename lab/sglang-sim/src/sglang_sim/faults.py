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
    "partial-quality=SHARE",
    "partial-quality-arithmetic=SHARE",
    "partial-quality-facts=SHARE",
    "partial-quality-multilingual=SHARE",
    "partial-quality-tool-json=SHARE",
    "non-english-corruption",
    "kernel-perturbation=SIZE",
    "slow-step=SECONDS",
)
# The quality gate's item groups (roles/rollout/files/quality_eval/generate.py) a partial-quality fault can be
# confined to: partial-quality-<group>=SHARE
QUALITY_GROUPS = ("arithmetic", "facts", "multilingual", "tool-json")


# Faults the fault file may switch on while the server runs ("after a healthy start").
RUNTIME = (
    "wrong-answer",
    "nan-output",
    "hang-after-ready",
    "partial-quality=SHARE",
    *(f"partial-quality-{g}=SHARE" for g in QUALITY_GROUPS),
    "non-english-corruption",
    "kernel-perturbation=SIZE",
    "slow-step=SECONDS",
)
# Faults that take a number: name -> (field, what the number is, its check, the check's words)
VALUED = {
    "slow-start": ("slow_start", "a number of seconds (slow-start=SECONDS)", lambda v: v >= 0, "non-negative"),
    "partial-quality": ("partial_quality", "a share (partial-quality=SHARE)", lambda v: 0 < v <= 1, "in (0, 1]"),
    "slow-step": ("slow_step", "a number of seconds (slow-step=SECONDS)", lambda v: v >= 0, "non-negative"),
    "kernel-perturbation": (
        "kernel_perturbation",
        "a relative size (kernel-perturbation=SIZE, 0.01 = 1%)",
        lambda v: 0 < v <= 1,
        "in (0, 1]",
    ),
    **{
        f"partial-quality-{g}": (
            f"partial_quality_{g.replace('-', '_')}",
            f"a share (partial-quality-{g}=SHARE)",
            lambda v: 0 < v <= 1,
            "in (0, 1]",
        )
        for g in QUALITY_GROUPS
    },
}
VALUED_FIELDS = frozenset(field for field, *_ in VALUED.values())


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
    # share (0-1] of the answers the simulator computes (sglang_sim.quality) that come out wrong
    partial_quality: float = 0.0
    # the same, confined to one item group of the gate's evaluation set (sglang_sim.quality.GROUPS)
    partial_quality_arithmetic: float = 0.0
    partial_quality_facts: float = 0.0
    partial_quality_multilingual: float = 0.0
    partial_quality_tool_json: float = 0.0
    # an FP4-kernel-like corruption: answers in non-English text get a replacement character or a letter of another
    # script, tool-call JSON a broken token; English and numbers stay right
    non_english_corruption: bool = False
    # every logit off by about this share, the same way every run (sglang_sim.logprobs): the answers stay, the
    # token log-probabilities move
    kernel_perturbation: float = 0.0
    # seconds every forward step (the prefill and each decode step) takes longer: a GPU held at low clocks, a slow
    # kernel; time to first token and inter-token latency grow by as much
    slow_step: float = 0.0

    def names(self) -> list[str]:
        out = []
        for field, value in self.__dict__.items():
            if value:
                name = field.replace("_", "-")
                out.append(f"{name}={value:g}" if field in VALUED_FIELDS else name)
        return out


def parse_faults(text: str | None, source: str = "SGLANG_SIM_FAULT") -> Faults:
    kwargs: dict[str, object] = {}
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item:
            continue
        field, value = parse_item(item, source)
        kwargs[field] = value
    return Faults(**kwargs)  # type: ignore[arg-type]


def parse_item(item: str, source: str = "SGLANG_SIM_FAULT") -> tuple[str, object]:
    """``(field, value)`` of one fault item (``nan-output``, ``slow-start=2.5``, ``partial-quality=0.5``)."""
    name, sep, value = item.partition("=")
    name = name.strip().lower()
    if name in VALUED:
        field, what, check, words = VALUED[name]
        try:
            number = float(value)
        except ValueError as e:
            raise FaultError(f"{name} needs {what}, got {item!r}") from e
        if not sep or not check(number):
            raise FaultError(f"{name} needs {what} {words}, got {item!r}")
        return field, number
    field = name.replace("-", "_")
    if sep or field not in Faults.__dataclass_fields__ or field in VALUED_FIELDS:
        raise FaultError(f"unknown fault {item!r} in {source}; known faults: {', '.join(KNOWN)}")
    return field, True


def from_env() -> Faults:
    return parse_faults(os.environ.get("SGLANG_SIM_FAULT"))


def merge(a: Faults, b: Faults) -> Faults:
    """Either's fault; of two numbers the larger (a runtime partial-quality over a start-time one, say)."""
    out = {}
    for f in dataclasses.fields(Faults):
        x, y = getattr(a, f.name), getattr(b, f.name)
        out[f.name] = max(x, y) if isinstance(x, float) else (x or y)
    return Faults(**out)  # type: ignore[arg-type]


class FaultSource:
    """The faults in force for a request: the start-time ones (``SGLANG_SIM_FAULT``) merged with those of
    ``SGLANG_SIM_FAULT_FILE`` (re-read only when the file's mtime, size or inode changed: one stat per call)."""

    def __init__(self, start: Faults, path: str | None = None, quiet: bool = False):
        self.start = start
        self.quiet = quiet  # a second reader of the same file (sglang_sim.quality) logs nothing
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
        kwargs: dict[str, object] = {}
        runtime = [k.partition("=")[0] for k in RUNTIME]
        for raw in text.replace("\n", ",").split(","):
            item = raw.strip()
            if not item or item.startswith("#"):
                continue
            name = item.lower()
            why = ""
            if name.partition("=")[0].strip() not in runtime:
                why = (
                    "unknown fault"
                    if name.partition("=")[0] not in [k.partition("=")[0] for k in KNOWN]
                    else ("not a runtime fault")
                )
            else:
                try:
                    field, value = parse_item(item, f"SGLANG_SIM_FAULT_FILE={self.path}")
                    kwargs[field] = value
                except FaultError as e:
                    why = str(e)
            if why and not self.quiet:
                log(
                    f"sglang-sim: SGLANG_SIM_FAULT_FILE={self.path}: refused {item!r} ({why}; "
                    f"runtime faults: {', '.join(RUNTIME)})"
                )
        new = Faults(**kwargs)  # type: ignore[arg-type]
        if new != self._file and not self.quiet:
            names = ", ".join(new.names()) or "none"
            log(f"sglang-sim: runtime fault injection (SGLANG_SIM_FAULT_FILE={self.path}): {names}")
        self._file = new
        self._merged = merge(self.start, new)
