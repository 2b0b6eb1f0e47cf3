"""sglang-sim shutdown as sglang 0.5.9 does it (tokenizer_manager.py sigterm_handler/sigterm_watchdog,
utils/common.py kill_process_tree, kill_itself_when_parent_died), and the named fault modes that differ."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time

from sglang_sim_helpers import GPU_RESERVED_MIB, GPU_TOTAL_MIB, pid_alive

KILLED = -signal.SIGKILL  # Popen.returncode of a process that ended by SIGKILL ("killed by signal 9")


class Stream:
    """A streaming /v1/completions request read chunk by chunk in a thread: tokens, finish, [DONE], cut."""

    def __init__(self, sim, max_tokens: int):
        self.tokens: list[str] = []
        self.finish_reason = None
        self.done = False
        self.error: str | None = None
        self.last_token_at = 0.0
        body = {"prompt": "tell me a long story", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        self.conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            resp = self.conn.getresponse()
            assert resp.status == 200, resp.status
            while True:
                line = resp.readline()
                if not line:
                    self.error = self.error or "connection closed before [DONE]"
                    return
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                payload = line[len(b"data: ") :]
                if payload == b"[DONE]":
                    self.done = True
                    return
                choice = json.loads(payload)["choices"][0]
                if choice.get("text"):
                    self.tokens.append(choice["text"])
                    self.last_token_at = time.monotonic()
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        except (OSError, http.client.HTTPException) as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def wait_tokens(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.tokens) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.tokens) >= n, (self.tokens, self.error)


def _wait_dead(pids, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_sigterm_drains_then_kills_the_tree_by_sigkill(make_sim):
    s = make_sim(["--tp", "2"], env={"SGLANG_SIM_TOKENS_PER_S": "40"}).wait_ready()
    kids = s.children()
    assert len(kids) == 3 and len(s.registry()) == 2
    stream = Stream(s, 60)
    stream.wait_tokens(3)
    loads = s.get("/v1/loads").json()  # what the role reads right before its stop
    assert loads["aggregate"]["total_reqs"] == 1 and loads["loads"][0]["num_running_reqs"] == 1
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)  # to the main process only (KillMode=mixed)
    s.wait_log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
    assert s.status("/health") == 503
    s.wait_log("Gracefully exiting... Remaining number of requests 1. Remaining requests remaining_rids=['")
    # the in-flight request is served in full while the server drains
    stream.thread.join(timeout=10)
    assert (len(stream.tokens), stream.finish_reason, stream.done, stream.error) == (60, "length", True, None)
    assert s.wait_exit() == KILLED  # kill_process_tree(os.getpid(), include_parent=True)
    assert time.monotonic() - t0 >= 60 / 40 - 0.2
    assert "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in s.log()
    assert _wait_dead(kids)  # the children were SIGKILLed first
    assert not any(pid_alive(p) for p in s.registry())


def test_drain_log_follows_the_watchdog_period(make_sim):
    # sigterm_watchdog polls every 5 s (here SGLANG_SIM_DRAIN_LOG_INTERVAL=0.5): an idle server exits at
    # the next tick, not at once
    s = make_sim(env={"SGLANG_SIM_DRAIN_LOG_INTERVAL": "0.5"}).wait_ready()
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    assert s.wait_exit() == KILLED
    assert 0.0 < time.monotonic() - t0 < 1.5
    assert s.log().count("Gracefully exiting...") == 1


def test_cgroup_wide_sigterm_kills_schedulers_and_cuts_the_request(make_sim):
    """KillMode=control-group: SIGTERM reaches the schedulers too; they have no handler and die at once,
    the main process drains forever (its requests never finish) until systemd's final SIGKILL."""
    s = make_sim(["--tp", "2"], env={"SGLANG_SIM_TOKENS_PER_S": "40"}).wait_ready()
    kids = s.children()
    stream = Stream(s, 60)
    stream.wait_tokens(3)
    for pid in [s.pid, *kids]:
        os.kill(pid, signal.SIGTERM)
    assert _wait_dead(kids, 2.0)
    s.wait_log("Gracefully exiting... Remaining number of requests 1.")
    got = len(stream.tokens)
    time.sleep(1.0)
    assert s.proc.poll() is None  # still draining
    assert len(stream.tokens) <= got + 1 and not stream.done  # no more tokens: the ranks are gone
    assert s.log().count("Remaining number of requests 1.") >= 3
    s.signal(signal.SIGKILL)  # TimeoutStopSec: systemd kills what is left
    s.wait_exit()
    stream.thread.join(timeout=5)
    assert not stream.done and stream.error and len(stream.tokens) < 60


def test_scheduler_killed_after_start_goes_unnoticed(make_sim):
    # 0.5.9's main process learns of a dead child only by its SIGQUIT (sent after an exception)
    s = make_sim(["--tp", "2"]).wait_ready()
    sched = s.registry_pids()[0]
    os.kill(sched, signal.SIGKILL)
    time.sleep(0.5)
    assert s.proc.poll() is None and s.status("/v1/models") == 200
    stream = Stream(s, 5)
    time.sleep(0.8)
    assert stream.tokens == [] and not stream.done


def test_sigkill_of_the_main_process_takes_the_children_along(make_sim):
    # PR_SET_PDEATHSIG (kill_itself_when_parent_died) in the scheduler and the detokenizer
    s = make_sim(["--tp", "2"]).wait_ready()
    kids = s.children()
    s.signal(signal.SIGKILL)
    s.wait_exit()
    assert _wait_dead(kids, 2.0)
    assert not any(pid_alive(p) for p in s.registry())
    s2 = make_sim(["--tp", "2"], start=False)  # the GPUs are free for the next server
    s2.env.update({"GPUSIM_PROFILE_DIR": str(s.profile_dir), "GPUSIM_STATE_DIR": str(s.state_dir)})
    s2.start().wait_ready()


def test_fault_orphan_children_outlive_a_sigkilled_parent(make_sim):
    s = make_sim(["--tp", "2"], env={"SGLANG_SIM_FAULT": "orphan-children"}).wait_ready()
    kids = s.children()
    s.signal(signal.SIGKILL)
    s.wait_exit()
    time.sleep(0.3)
    reg = s.registry()
    assert len(reg) == 2 and all(pid_alive(p) for p in reg)  # leftovers still "using" GPU memory
    assert all(pid_alive(p) for p in kids)
    s2 = make_sim(["--tp", "2"], start=False)
    s2.env.update({"GPUSIM_PROFILE_DIR": str(s.profile_dir), "GPUSIM_STATE_DIR": str(s.state_dir)})
    s2.start()
    assert s2.wait_exit() == KILLED  # the OOM is an exception: SIGQUIT to the parent, which kills its tree
    assert "torch.OutOfMemoryError: CUDA out of memory." in s2.log()
    assert "Received sigquit from a child process. It usually means the child failed." in s2.log()
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
    assert _wait_dead(kids, 2.0)


def test_force_shutdown_skips_drain(make_sim):
    s = make_sim(env={"SGLANG_SIM_TOKENS_PER_S": "10", "SGL_FORCE_SHUTDOWN": "1"}).wait_ready()
    stream = Stream(s, 50)
    stream.wait_tokens(1)
    s.signal(signal.SIGTERM)
    assert s.wait_exit() == KILLED
    assert "Signal SIGTERM received while force shutdown flag set. Force exiting." in s.log()
    assert "Gracefully exiting" not in s.log()
    stream.thread.join(timeout=5)
    assert not stream.done


def test_sigterm_while_loading_ends_the_server_at_once(make_sim):
    # before the tokenizer manager's handle loop exists nothing handles SIGTERM: default action
    s = make_sim(["--tp", "2"], env={"SGLANG_SIM_FAULT": "never-ready"})
    s.wait_log("Capture cuda graph begin.")
    time.sleep(0.3)
    assert s.status("/health") is None  # uvicorn binds only after the load (0.5.9): nothing listens yet
    kids = s.children()
    s.signal(signal.SIGTERM)
    assert s.wait_exit() == -signal.SIGTERM
    assert "Draining requests" not in s.log() and "fired up" not in s.log()
    assert _wait_dead(kids, 2.0)


def test_sigterm_before_the_first_request_is_uvicorns(make_sim):
    s = make_sim(["--skip-server-warmup"]).wait_ready()
    kids = s.children()
    s.signal(signal.SIGTERM)
    assert s.wait_exit() == -signal.SIGTERM
    log = s.log()
    assert "INFO:     Shutting down" in log and f"INFO:     Finished server process [{s.pid}]" in log
    assert "Draining requests" not in log
    assert _wait_dead(kids, 2.0)


def test_fault_crash_after_load(make_sim):
    s = make_sim(["--tp", "2"], env={"SGLANG_SIM_FAULT": "crash-after-load"})
    assert s.wait_exit() == KILLED
    log = s.log()
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    assert log.index("Capture cuda graph end") < log.index("illegal memory access")
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "fired up" not in log
    assert _wait_dead(s.known_pids | set(s.registry()), 2.0)


def test_fault_leak_gpu_memory(make_sim):
    s = make_sim(["--tp", "2"], env={"SGLANG_SIM_FAULT": "leak-gpu-memory"}).wait_ready()
    kids = s.children()
    s.signal(signal.SIGTERM)
    assert s.wait_exit() == KILLED
    assert _wait_dead(kids, 2.0)
    reg = s.registry()
    assert len(reg) == 2 and all(e["leak"] is True for e in reg.values())  # processes gone, memory "used"
    # no --mem-fraction-static: 0.5.9's own on 16 GiB GPUs, tp 2 (server_args.py:1020-1063): 0.765
    assert all(sum(e["gpus"].values()) == int(0.765 * (GPU_TOTAL_MIB - GPU_RESERVED_MIB)) for e in reg.values())
