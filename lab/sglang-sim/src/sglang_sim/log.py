"""SGLang-style log lines, written whole with one write(2) so processes sharing stderr do not interleave."""

from __future__ import annotations

import os
import sys
import time
import traceback


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def log(msg: str, tag: str | None = None) -> None:
    prefix = f"[{_stamp()} {tag}]" if tag else f"[{_stamp()}]"
    write_raw(f"{prefix} {msg}\n")


def write_raw(text: str) -> None:
    data = text.encode("utf-8", "replace")
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return
        data = data[n:]


def fake_traceback(frames: list[tuple[str, int, str, str]], exc_line: str, tag: str | None = None) -> None:
    """Print a Python-traceback-looking error block (one write), optionally after a tagged log line."""
    lines = []
    if tag:
        lines.append(f"[{_stamp()} {tag}] Scheduler hit an exception: Traceback (most recent call last):\n")
    else:
        lines.append("Traceback (most recent call last):\n")
    for path, lineno, func, code in frames:
        lines.append(f'  File "{path}", line {lineno}, in {func}\n    {code}\n')
    lines.append(exc_line.rstrip("\n") + "\n")
    write_raw("".join(lines))


def real_traceback_text() -> str:
    return traceback.format_exc()
