"""A simulated SGLang detokenizer process: holds no GPU memory, lives until told to stop.

Protocol as for the scheduler: ``stop`` on stdin -> exit 0; EOF (parent died) -> keep living (orphan);
SIGTERM -> exit 0.
"""

from __future__ import annotations

import signal
import sys
import threading

from .proctitle import set_proc_title


def main() -> int:
    set_proc_title("sglang::detokenizer")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda s, f: stop.set())
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
