"""Process-tree helpers that mirror sglang 0.5.9 (``sglang/srt/utils/common.py``).

* ``kill_itself_when_parent_died()``: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, called first thing by the
  scheduler (``managers/scheduler.py: run_scheduler_process``) and the detokenizer
  (``managers/detokenizer_manager.py: run_detokenizer_process``): they die by SIGKILL when the main process
  dies, however it dies. The ``orphan-children`` fault skips it (children outlive a SIGKILLed parent).
* ``kill_process_tree(pid, include_parent)``: SIGKILL to every descendant, then (include_parent) to the
  process itself, as psutil does in the real one. Called on the own pid it never returns: the process ends
  "killed by signal 9" (exit status 137 to a shell or a launcher).
"""

from __future__ import annotations

import contextlib
import os
import signal

PR_SET_PDEATHSIG = 1


def kill_itself_when_parent_died() -> None:
    with contextlib.suppress(Exception):
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (psutil's ``children(recursive=True)``), parents before children."""
    by_parent: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = _ppid(int(name))
            if ppid is not None:
                by_parent.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_process_tree(parent_pid: int, include_parent: bool = True) -> None:
    for child in descendants(parent_pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    if include_parent:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(parent_pid, signal.SIGKILL)
        if parent_pid == os.getpid():  # SIGKILL is delivered before kill(2) returns; never reached
            os._exit(0)
