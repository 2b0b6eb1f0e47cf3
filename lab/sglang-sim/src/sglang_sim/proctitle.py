"""Best-effort process naming (like SGLang's setproctitle "sglang::scheduler_TP0").

Only the kernel "comm" name is set (prctl PR_SET_NAME, 15 bytes: "sglang::schedul"); the command line
stays ``python -m sglang_sim.scheduler ...`` so ``pgrep -f sglang`` still finds us, as with real SGLang.
"""

from __future__ import annotations

import contextlib

PR_SET_NAME = 15


def set_proc_title(title: str) -> None:
    with contextlib.suppress(Exception):
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
