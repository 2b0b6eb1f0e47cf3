"""Progress of a staging run (a JSON file the job_wait action prints) and hub resume warnings."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import (
    HF_META_DIR,
    PARTIAL,
    write_json,
)


class Progress:
    """Writes progress (bytes, rate, ETA) of the files being fetched to a JSON file, from a thread."""

    def __init__(self, path: str | None, dest: Path, interval: float = 1.0):
        self.path = Path(path) if path else None
        self.dest = dest
        self.interval = interval
        self.files: dict[str, int] = {}
        self.done: set[str] = set()
        self.phase = "plan"
        self.message = ""
        self.started = time.monotonic()
        self._samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def set(self, phase: str, message: str = "", files: dict[str, int] | None = None) -> None:
        with self._lock:
            self.phase = phase
            self.message = message
            if files is not None:
                self.files = dict(files)
                self.done = set()
                self.started = time.monotonic()
                self._samples = []
        self.write()

    def mark_done(self, name: str) -> None:
        with self._lock:
            self.done.add(name)

    def _partial_bytes(self, name: str) -> int:
        total = 0
        for base in (self.dest / HF_META_DIR / "download", self.dest / PARTIAL):
            parent = (base / name).parent
            stem = Path(name).name
            if parent.is_dir():
                for entry in parent.iterdir():
                    if entry.name.startswith(stem + ".") and entry.name.endswith((".incomplete", ".part")):
                        with contextlib.suppress(OSError):
                            total = max(total, entry.stat().st_size)
        return total

    def snapshot(self) -> dict:
        with self._lock:
            files, done, phase, message = dict(self.files), set(self.done), self.phase, self.message
        total = sum(files.values())
        current = [n for n in files if n not in done]
        done_bytes = sum(files[n] for n in done) + sum(min(self._partial_bytes(n), files[n]) for n in current)
        now = time.monotonic()
        self._samples = [s for s in self._samples if now - s[0] <= 10] + [(now, done_bytes)]
        t0, b0 = self._samples[0]
        rate = (done_bytes - b0) / (now - t0) if now - t0 >= 1.0 else 0.0
        if rate <= 0 and now - self.started >= 2.0:
            rate = done_bytes / (now - self.started)
        # No ETA from the first second's trickle (metadata, connection set-up): it would be wildly off.
        eta = (total - done_bytes) / rate if rate > 0 and now - self.started >= 2.0 else None
        return {
            "phase": phase,
            "message": message,
            "files_total": len(files),
            "files_done": len(done),
            "bytes_total": total,
            "bytes_done": done_bytes,
            "rate_bps": round(rate, 1),
            "eta_s": round(eta, 1) if eta is not None else None,
            "elapsed_s": round(now - self.started, 1),
            "current": sorted(current)[:4],
            "updated": time.time(),
            "pid": os.getpid(),
        }

    def write(self) -> None:
        if not self.path:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, self.snapshot())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.write()


class ResumeLog(logging.Handler):
    """Collects huggingface_hub's warnings about resumed downloads."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "resume" in msg.lower() or "error while downloading" in msg.lower():
            self.messages.append(msg.splitlines()[0][:300])
