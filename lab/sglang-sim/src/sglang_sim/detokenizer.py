"""A simulated SGLang detokenizer process: holds no GPU memory, lives until told to stop.

Protocol as for the scheduler: ``stop`` on stdin -> exit 0 (test hook). As in sglang 0.5.9
``run_detokenizer_process``: ``kill_itself_when_parent_died()`` (PR_SET_PDEATHSIG = SIGKILL, skipped with the
``orphan-children`` fault) and no SIGTERM handler (SIGTERM ends it at once).
"""

from __future__ import annotations

import signal
import sys
import threading

from .proctitle import set_proc_title
from .procutil import kill_itself_when_parent_died
from .scheduler import orphan_children


def main() -> int:
    if not orphan_children():
        kill_itself_when_parent_died()
    set_proc_title("sglang::detokenizer")
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def control() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                stop.set()
                return

    threading.Thread(target=control, daemon=True).start()
    while not stop.wait(0.5):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
