"""A simulated SGLang scheduler process (one per TP rank): loads "weights", holds GPU memory.

Started by the main process as ``python -m sglang_sim.scheduler --tp-rank R``. Protocol:

* stdin, first line: a JSON spec (gpu, MiB, timings, faults). Later lines: ``stop`` -> release memory,
  exit 0 (test hook; the simulated server itself ends its children with SIGKILL, as 0.5.9 does).
* stdout: status lines for the parent: ``loaded``, ``ready``, ``error <text>``.
* stderr: SGLang-style log lines (shared with the parent, so journald sees them).
* Signals as in sglang 0.5.9 ``run_scheduler_process``: ``kill_itself_when_parent_died()``
  (PR_SET_PDEATHSIG = SIGKILL: we die with the main process, unless the ``orphan-children`` fault is set)
  and no SIGTERM handler (SIGTERM ends us at once, mid-request; the memory is freed with the process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from . import gpus
from .faults import FaultError, from_env
from .log import fake_traceback, log
from .proctitle import set_proc_title
from .procutil import kill_itself_when_parent_died

GB = 1024.0  # MiB per GiB (SGLang prints "GB" for GiB)


class Scheduler:
    def __init__(self, spec: dict):
        self.spec = spec
        self.tag = spec["tag"]
        self.rank = int(spec["tp_rank"])
        self.gpu_index = int(spec["gpu_index"])
        self.process_name = spec["process_name"]
        self.leak = bool(spec.get("leak"))
        self.held = False
        self.stop_event = threading.Event()
        self.exit_code = 0

    # -- helpers
    def verbose(self) -> bool:
        return self.rank == 0

    def say(self, msg: str) -> None:
        log(msg, self.tag)

    def status(self, text: str) -> None:
        try:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            pass  # parent gone: keep running (that's the leftover-process scenario)

    def register(self, mib: int) -> None:
        gpus.write_alloc(self.process_name, {self.gpu_index: mib}, leak=self.leak)
        self.held = True

    def release(self) -> None:
        if self.held and not self.leak:
            gpus.remove_alloc()
        self.held = False

    def sleep(self, seconds: float) -> bool:
        """Sleep; True if asked to stop meanwhile (short waits keep signal handlers responsive)."""
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return self.stop_event.is_set()
            if self.stop_event.wait(min(left, 0.5)):
                return True

    def phase(self, seconds: float, mib: int) -> bool:
        """A start-up phase (weights, CUDA graphs): ``seconds`` of work, then ``mib`` held on the GPU; False if
        asked to stop meanwhile (nothing more is held)."""
        if self.sleep(seconds):
            return False
        self.register(mib)
        return True

    def wait_for_stop(self) -> None:
        while not self.stop_event.wait(0.5):
            pass

    # -- phases
    def run(self) -> int:
        s = self.spec
        total = int(s["memory_total_mib"])
        usable = int(s["usable_mib"])
        budget = int(s["budget_mib"])
        weights = int(s["weights_mib"])
        graph = int(s["graph_mib"])
        kv = budget - weights - graph
        used_others, holders = gpus.used_by_others(exclude_pid=os.getpid())
        other = used_others.get(self.gpu_index, 0)
        free = usable - other
        self.say(f"Load weight begin. avail mem={free / GB:.2f} GB")
        if budget > free:
            self.fail_oom(total, free, budget, holders.get(self.gpu_index, []))
            return 1
        if not self.phase(float(s["load_seconds"]), weights):
            return self.finish()
        self.say(
            f"Load weight end. type={s['model_type']}, dtype={s['dtype']}, "
            f"avail mem={(free - weights) / GB:.2f} GB, mem usage={weights / GB:.2f} GB."
        )
        self.status("loaded")
        self.register(weights + kv)
        kv_gb = kv / GB
        self.say(
            f"KV Cache is allocated. #tokens: {s['kv_tokens']}, K size: {kv_gb / 2:.2f} GB, V size: {kv_gb / 2:.2f} GB"
        )
        if self.verbose():
            self.say(f"Memory pool end. avail mem={(free - weights - kv) / GB:.2f} GB")
        if not s["disable_cuda_graph"]:
            before = free - weights - kv
            self.say(f"Capture cuda graph begin. This can take up to several minutes. avail mem={before / GB:.2f} GB")
            if self.verbose():
                self.say(f"Capture cuda graph bs {s['cuda_graph_bs']}")
            if s.get("never_ready"):
                return self.hold("stuck")
            t0 = time.monotonic()
            if not self.phase(float(s["graph_seconds"]), budget):
                return self.finish()
            self.say(
                f"Capture cuda graph end. Time elapsed: {time.monotonic() - t0:.2f} s. "
                f"mem usage={graph / GB:.2f} GB. avail mem={(before - graph) / GB:.2f} GB."
            )
        else:
            self.register(budget)
            if s.get("never_ready"):
                return self.hold("stuck")
        if s.get("crash_after_load"):
            self.fail_cuda()
            return 1
        if self.verbose():
            self.say(
                f"max_total_num_tokens={s['kv_tokens']}, chunked_prefill_size={s['chunked_prefill_size']}, "
                f"max_prefill_tokens=16384, max_running_requests={s['max_running_requests']}, "
                f"context_len={s['context_len']}, available_gpu_mem={(usable - other - budget) / GB:.2f} GB"
            )
        return self.hold("ready")

    def hold(self, state: str) -> int:
        """Report ``state`` (``ready``, or ``stuck`` under the never-ready fault) and hold the memory until stopped."""
        self.status(state)
        self.wait_for_stop()
        return self.finish()

    def finish(self) -> int:
        self.release()
        return self.exit_code

    def fail_oom(self, total: int, free: int, budget: int, holders: list[tuple[int, int]]) -> None:
        procs = " ".join(f"Process {pid} has {mib / GB:.2f} GiB memory in use." for pid, mib in holders)
        fake_traceback(
            [
                (
                    "/sglang/srt/managers/scheduler.py",
                    2953,
                    "run_scheduler_process",
                    "scheduler = Scheduler(",
                ),
                ("/sglang/srt/model_executor/model_runner.py", 788, "load_model", "self.model = get_model("),
            ],
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {budget / GB:.2f} GiB. "
            f"GPU {self.gpu_index} has a total capacity of {total / GB:.2f} GiB of which "
            f"{max(free, 0) / GB:.2f} GiB is free. {procs}".rstrip(),
            tag=self.tag,
        )
        self.status("error torch.OutOfMemoryError: CUDA out of memory")

    def fail_cuda(self) -> None:
        if self.verbose():
            fake_traceback(
                [
                    (
                        "/sglang/srt/managers/scheduler.py",
                        2953,
                        "run_scheduler_process",
                        "scheduler.event_loop_overlap()",
                    ),
                    (
                        "/sglang/srt/model_executor/model_runner.py",
                        2121,
                        "forward",
                        "return self.cuda_graph_runner.replay(",
                    ),
                ],
                "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, "
                "so the stacktrace "
                "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                "[sglang-sim fault injection: crash-after-load]",
                tag=self.tag,
            )
        else:
            self.say("RuntimeError: CUDA error: an illegal memory access was encountered")
        self.status("error RuntimeError: CUDA error: an illegal memory access was encountered")
        self.release()


def _read_control(sched: Scheduler) -> None:
    for line in sys.stdin:
        if line.strip() == "stop":
            sched.stop_event.set()
            return
    # EOF: the parent is gone. PR_SET_PDEATHSIG has killed us already unless orphan-children is set: then
    # we keep running and keep our GPU memory until someone kills us (the leftover seen in the seed story).


def orphan_children() -> bool:
    try:
        return from_env().orphan_children
    except FaultError:
        return False


def main(argv: list[str] | None = None) -> int:
    line = sys.stdin.readline()
    if not line:
        return 1
    spec = json.loads(line)
    set_proc_title(spec["process_name"])
    if not orphan_children():
        kill_itself_when_parent_died()
    sched = Scheduler(spec)
    # No SIGTERM handler (0.5.9 installs none in the scheduler): the default action ends the process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C goes to the main process, which stops us
    threading.Thread(target=_read_control, args=(sched,), daemon=True).start()
    try:
        return sched.run()
    finally:
        sched.release()


if __name__ == "__main__":
    sys.exit(main())
