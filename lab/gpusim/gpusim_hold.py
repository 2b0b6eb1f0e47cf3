#!/usr/bin/python3
"""gpufleet lab simulator: this is not a CUDA program.

``gpusim-hold`` is the lab's stand-in for "some other program holds GPU memory": a user's notebook or
training script that took the GPUs (PyTorch ``torch.empty(..., device="cuda")`` and then waits). The lab
tool installs this stdlib-only file as ``/usr/local/bin/gpusim-hold`` beside the simulated
``/usr/bin/nvidia-smi``; any user may run it (the registry directory is mode 1777)::

    gpusim-hold --gpus 0,1 --mib 20000 [--seconds S]

It asks the simulated ``nvidia-smi`` for each GPU's ``memory.free`` (what ``cudaMemGetInfo`` gives a
real program), fails like PyTorch's allocator when the memory is not there
(``torch.OutOfMemoryError: CUDA out of memory ...``, exit 1) or when a GPU index does not exist
(``CUDA error: invalid device ordinal``, exit 1), then registers one allocation entry in the gpusim
registry (``$GPUSIM_STATE_DIR/alloc-<pid>.json``, lab/gpusim/README.md) with its own pid, start time and
process name, prints one ``holding`` line and waits. It lets go the way a real process does: on
SIGTERM/SIGINT (no handler in the real script: the process dies of the signal; here the entry is
removed first, then the signal's default action ends it), after ``--seconds``, or by any death at all
(SIGKILL: the entry no longer counts once the pid is gone, as real GPU memory follows the process's
death within a fraction of a second, /work/shared/fixtures/gpu-hosts/h200x2-vm/busy/release-times.txt).

The process name registered is argv[0] of ``/proc/self/cmdline``, which is what the real
``nvidia-smi`` shows (``python3`` in the busy H200 capture for ``python3 script.py``;
``/usr/bin/python3`` when started through this file's ``#!/usr/bin/python3`` line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

SIM_LINE = "gpufleet lab simulator: this is not a CUDA program"
DEFAULT_STATE_DIR = "/dev/shm/gpusim"
GIB = 1024


def state_dir() -> str:
    return os.environ.get("GPUSIM_STATE_DIR", DEFAULT_STATE_DIR)


def own_process_name() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        argv0 = ""
    return argv0 or "python3"


def own_starttime() -> int | None:
    try:
        with open("/proc/self/stat", encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) >= 20 else None


def free_memory(nvidia_smi: str) -> dict[int, tuple[int, int]]:
    """GPU index -> (total MiB, free MiB), as the (simulated) driver reports it."""
    proc = subprocess.run(
        [nvidia_smi, "--query-gpu=index,memory.total,memory.free", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        sys.stderr.write("RuntimeError: No CUDA GPUs are available\n")
        raise SystemExit(1)
    result = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and all(c.isdigit() for c in cells):
            result[int(cells[0])] = (int(cells[1]), int(cells[2]))
    return result


def register(gpus_mib: dict[int, int]) -> str:
    directory = state_dir()
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o1777)
    pid = os.getpid()
    entry = {
        "pid": pid,
        "process_name": own_process_name(),
        "gpus": {str(k): int(v) for k, v in gpus_mib.items()},
        "leak": False,
        "starttime": own_starttime(),
    }
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-alloc-{pid}-", suffix=".part", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(entry, fh)
    os.chmod(tmp, 0o644)
    path = os.path.join(directory, f"alloc-{pid}.json")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpusim-hold", description=SIM_LINE + ": holds simulated GPU memory.")
    parser.add_argument("--gpus", required=True, help="GPU indices, comma separated (e.g. 0,1)")
    parser.add_argument("--mib", type=int, required=True, help="MiB to hold on each GPU")
    parser.add_argument("--seconds", type=float, default=0, help="let go after this many seconds (0: never)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        indices = sorted({int(g) for g in args.gpus.split(",") if g.strip()})
    except ValueError:
        parser.error(f"--gpus: not a list of GPU indices: {args.gpus!r}")
    if not indices or args.mib <= 0:
        parser.error("--gpus needs at least one index and --mib a positive number")

    memory = free_memory(args.nvidia_smi)
    for idx in indices:
        if idx not in memory:
            sys.stderr.write(
                "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
                f"(GPU {idx}; this machine has {len(memory)} GPU(s))\n"
            )
            return 1
        total, free = memory[idx]
        if args.mib > free:
            sys.stderr.write(
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {args.mib / GIB:.2f} GiB. "
                f"GPU {idx} has a total capacity of {total / GIB:.2f} GiB of which {free / GIB:.2f} GiB is free.\n"
            )
            return 1

    path = register({idx: args.mib for idx in indices})

    def let_go(signum, _frame):
        with contextlib.suppress(OSError):
            os.unlink(path)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, let_go)
    signal.signal(signal.SIGINT, let_go)
    print(
        f"gpusim-hold: holding {args.mib} MiB on GPU(s) {','.join(map(str, indices))} as pid {os.getpid()} "
        f"({SIM_LINE})",
        flush=True,
    )
    started = time.monotonic()
    while not args.seconds or time.monotonic() - started < args.seconds:
        time.sleep(0.5 if not args.seconds else min(0.5, max(0.0, args.seconds - (time.monotonic() - started))))
    with contextlib.suppress(OSError):
        os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
