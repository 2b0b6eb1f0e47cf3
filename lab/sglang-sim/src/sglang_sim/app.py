"""The main ("tokenizer manager") process: HTTP server, child processes, readiness and shutdown."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from . import EMULATED_SGLANG_VERSION, SERVER_VERSION, SIM_HEADER_VALUE, cli, engines, gpus
from .engine import Engine, env_float
from .faults import Faults, FaultSource
from .http_api import SimHTTPServer, access_log_default, bind_error_message
from .log import log
from .metrics import SglangMetrics
from .multinode import Rendezvous, RendezvousError, launch_dummy_health_check_server
from .procutil import kill_process_tree
from .resolve import ModelConfig, server_args_dict

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KV_BYTES_PER_TOKEN = 80 * 1024
WARMUP_PROMPT = "The capital city of France is"


def _env_bool(name: str, default: bool) -> bool:
    """sglang 0.5.9 ``environ.EnvBool``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    raise ValueError(f'"{value}" is not a valid boolean value')


def cuda_graph_bs_list(args: argparse.Namespace) -> list[int]:
    """``model_executor/cuda_graph_runner.py:190 get_batch_sizes_to_capture``: ``server_args.cuda_graph_bs`` (as
    ``resolve`` set it: server_args.py:1000-1004), plus the request pool size when the list goes past it, then
    capped at it (the pool: ``--max-running-requests``, else 4096 in the simulator)."""
    capture = [int(b) for b in (args.cuda_graph_bs or [])]
    if not capture:
        max_bs = int(args.cuda_graph_max_bs or 160)
        capture = [b for b in [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16)] if b <= max_bs]
    pool = int(args.max_running_requests or 4096)
    if max(capture) > pool:
        capture.append(pool)
    return sorted({b for b in capture if 0 < b <= pool})


def scheduler_metric_labels(args: argparse.Namespace) -> list[dict[str, object]]:
    """The label sets of the schedulers of this node that log metrics (``current_scheduler_metrics_enabled``:
    ``attn_tp_rank == 0`` or ``--enable-metrics-for-all-schedulers``, managers/scheduler_metrics_mixin.py:100),
    each with 0.5.9's labels (scheduler_metrics_mixin.py:114; ranks: entrypoints/engine.py:939-969)."""
    tp, pp = cli.tp_size(args), cli.pp_size(args)
    nnodes, node_rank = int(args.nnodes or 1), int(args.node_rank or 0)
    local = tp * pp // nnodes
    dp = int(args.data_parallel_size or 1)
    attn_tp = max(1, tp // (dp if args.enable_dp_attention else 1) // int(args.attention_context_parallel_size or 1))
    moe_dp = int(args.moe_data_parallel_size or 1)
    ep = int(args.expert_parallel_size or 1)
    mode = str(args.disaggregation_mode or "null")
    engine_type = {"prefill": "prefill", "decode": "decode"}.get(mode, "unified")
    out = []
    for i in range(local):
        g = node_rank * local + i
        tp_rank, pp_rank = g % tp, g // tp
        if tp_rank % attn_tp != 0 and not args.enable_metrics_for_all_schedulers:
            continue
        moe_ep_rank = tp_rank % (tp // moe_dp) // max(1, tp // moe_dp // ep)
        labels: dict[str, object] = {
            "model_name": args.served_model_name,
            "engine_type": engine_type,
            "tp_rank": tp_rank,
            "pp_rank": pp_rank,
            "moe_ep_rank": moe_ep_rank,
        }
        if isinstance(args.extra_metric_labels, dict):
            labels.update(args.extra_metric_labels)
        out.append(labels)
    return out


def tokenizer_metric_labels(args: argparse.Namespace) -> dict[str, object]:
    """managers/tokenizer_manager.py:433-441."""
    labels: dict[str, object] = {"model_name": args.served_model_name}
    for label in args.tokenizer_metrics_allowed_custom_labels or []:
        labels[label] = ""
    if isinstance(args.extra_metric_labels, dict):
        labels.update(args.extra_metric_labels)
    return labels


def proc_cpu_seconds(pid: int) -> float | None:
    fields = gpus.proc_stat_fields(pid)
    if not fields or len(fields) < 13:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def launch_command(argv: list[str]) -> str:
    """0.5.23 ``ServerArgs.launch_command``: the command line asked for, secrets redacted (server_args.py:303)."""
    import shlex

    words, hide = [], False
    for word in argv:
        words.append("<redacted>" if hide else word)
        hide = word in ("--api-key", "--admin-api-key")
    return shlex.join(["python", "-m", "sglang.launch_server", *words])


class Child:
    def __init__(self, kind: str, popen: subprocess.Popen, tag: str = "", rank: int = 0):
        self.kind = kind
        self.popen = popen
        self.tag = tag
        self.rank = rank
        self.status: str | None = None
        self.error: str | None = None
        self.dead_since: float | None = None
        self.silent = False  # seen stopped (App.rank_silence)

    @property
    def pid(self) -> int:
        return self.popen.pid


class App:
    def __init__(self, args: argparse.Namespace, faults: Faults, profile: gpus.Profile, model: ModelConfig):
        self.args = args
        self.faults = faults
        self.profile = profile
        self.started_at = time.time()
        self.state = "starting"  # starting -> ready -> draining; or failed
        self.lock = threading.Condition()
        self.inflight: dict[str, float] = {}
        self.children: list[Child] = []
        self.events: queue.Queue = queue.Queue()
        self.sigterm = False
        self.sigint = False
        # 0.5.9 TokenizerManager.auto_create_handle_loop (first generation request, the warm-up in practice)
        # installs sigterm_handler and starts sigterm_watchdog; before that SIGTERM is not drained.
        self.handle_loop_at: float | None = None
        self.uvicorn_exit = False
        self.unhealthy = False  # ServerStatus.UnHealthy (a failed /health generation): SIGTERM force-exits
        self.model_config = model  # read before the start (launch_server.main, hf_config.py)
        self.model_type = self.model_config.arch or "SimulatedForCausalLM"
        self.context_len = int(args.context_length or 131072)
        self.access_log = access_log_default()
        self.exclude_prefixes = list(args.uvicorn_access_log_exclude_prefixes or [])
        self.drain_interval = env_float("SGLANG_SIM_DRAIN_LOG_INTERVAL", 5.0, 0.01)
        self.load_seconds = env_float("SGLANG_SIM_LOAD_SECONDS", 2.0, 0.0) + faults.slow_start
        self.graph_seconds = env_float("SGLANG_SIM_GRAPH_SECONDS", 2.0, 0.0)
        self.weights_share = min(0.95, env_float("SGLANG_SIM_WEIGHTS_SHARE", 0.55, 0.0))
        # per-GPU memory plan (from the first local GPU; profiles are homogeneous in practice)
        self.world = cli.tp_size(args) * cli.pp_size(args)
        self.nnodes = int(args.nnodes or 1)
        self.node_rank = int(args.node_rank or 0)
        self.rendezvous: Rendezvous | None = None
        self.local = self.world // self.nnodes
        first = profile.gpu(int(args.base_gpu_id or 0)) or profile.gpus[0]
        self.mem_fraction = float(args.mem_fraction_static or cli.DEFAULT_MEM_FRACTION)
        self.budget_mib = int(self.mem_fraction * first.usable_mib)
        self.graph_mib = 0 if args.disable_cuda_graph else min(int(self.budget_mib * 0.015), 4096)
        self.weights_mib = int(self.budget_mib * self.weights_share)
        kv_mib = max(0, self.budget_mib - self.weights_mib - self.graph_mib)
        self.kv_tokens = int(kv_mib * 1024 * 1024 // KV_BYTES_PER_TOKEN)
        self.page_size = int(args.page_size or 1)
        self.detok_started: float | None = None
        self.metrics: SglangMetrics | None = None
        if args.enable_metrics and self.node_rank == 0:
            self.metrics = SglangMetrics(
                tokenizer_labels=tokenizer_metric_labels(args),
                scheduler_labels=scheduler_metric_labels(args),
                bucket_time_to_first_token=args.bucket_time_to_first_token,
                bucket_inter_token_latency=args.bucket_inter_token_latency,
                bucket_e2e_request_latency=args.bucket_e2e_request_latency,
                collect_tokens_histogram=bool(args.collect_tokens_histogram),
                prompt_tokens_buckets=args.prompt_tokens_buckets,
                generation_tokens_buckets=args.generation_tokens_buckets,
                page_size=self.page_size,
                max_total_num_tokens=self.kv_tokens,
                detokenizer_cpu=self._detokenizer_cpu,
                engine_version=EMULATED_SGLANG_VERSION,
            )
        self.fault_source = FaultSource(faults)
        self.engine = Engine(
            args.served_model_name,
            self.fault_source,
            max_running_requests=args.max_running_requests,
            kv_tokens=self.kv_tokens,
            cuda_graph=not args.disable_cuda_graph,
            cuda_graph_max_bs=args.cuda_graph_max_bs,
            nan_mode=engines.nan_mode(EMULATED_SGLANG_VERSION, bool(args.enable_nan_detection)),
            metrics=self.metrics,
            page_size=self.page_size,
            decode_log_interval=int(args.decode_log_interval or 40),
        )
        self._silence_read_at, self._silence = 0.0, None
        self.engine.rank_silence = self.rank_silence
        self.engine.fatal = self._scheduler_exception
        # TokenizerManager.server_status of 0.5.9: Starting -> Up (warm-up done / health check passed),
        # UnHealthy after a failed health check
        self.server_status = "Starting"
        self.health_check_timeout = int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
        self.warmup_tries = int(env_float("SGLANG_SIM_WARMUP_TRIES", 120.0, 1.0))
        self.httpd: SimHTTPServer | None = None
        self._was_ready = False
        self.decode_log_interval = env_float("SGLANG_SIM_DECODE_LOG_INTERVAL", 10.0, 0.05)
        self._next_decode_log = 0.0

    # ------------------------------------------------------------------ state used by HTTP handlers
    def healthy(self) -> bool:
        return self.state == "ready" and not self.sigterm  # health_generate: 503 once gracefully_exit is set

    def health_check(self, path: str) -> int:
        """sglang 0.5.9 ``http_server.health_generate`` (``/health`` and ``/health_generate``).

        503 while shutting down or starting; else a one-token generation is submitted and the answer is
        polled every second for up to SGLANG_HEALTH_CHECK_TIMEOUT (20) s: any output of the engine since
        the check began (``last_receive_tstamp > tic``) is a pass. ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``
        false makes ``/health`` (not ``/health_generate``) a plain 200.
        """
        if self.sigterm or self.state == "draining":
            log("Health check request received during shutdown. Returning 503.")
            return 503
        if self.server_status == "Starting" or self.state != "ready":
            return 503
        if not _env_bool("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True) and path == "/health":
            return 200
        tic = time.time()
        threading.Thread(
            target=self.engine.generate,
            args=("0", 1),
            kwargs={"prompt_tokens": 1, "log_metrics": False, "rid": f"HEALTH_CHECK_{tic}"},
            daemon=True,
        ).start()
        while time.time() < tic + self.health_check_timeout:
            time.sleep(1)
            if self.engine.last_receive_tstamp > tic:
                self.server_status = "Up"
                return 200
        log(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"{self.health_check_timeout} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            "last_heartbeat time: "
            f"{time.strftime('%H:%M:%S', time.localtime(self.engine.last_receive_tstamp))}"
        )
        self.server_status = "UnHealthy"
        return 503

    def server_info(self) -> dict:
        """0.5.9 ``/server_info`` (entrypoints/http_server.py:593-610): ``dataclasses.asdict(server_args)``, then
        ``scheduler_info`` (the first scheduler's ready message, managers/scheduler.py:3141), ``internal_states``
        (one per DP rank: ``Scheduler.get_internal_state``, managers/scheduler.py:2650) and ``version``; the
        simulator adds ``simulator``, ``simulator_name``, ``simulator_faults``, ``gpu_profile``."""
        a = self.args
        args = server_args_dict(a)
        max_req_len = min(self.context_len - 1, self.kv_tokens - 1)
        state = dict(args)
        state.update(
            {
                "last_gen_throughput": self.engine.last_gen_throughput,
                "memory_usage": {
                    "weight": round(self.weights_mib / 1024, 2),
                    "kvcache": round(max(0, self.budget_mib - self.weights_mib - self.graph_mib) / 1024, 2),
                    "token_capacity": int(self.kv_tokens),
                    "graph": round(self.graph_mib / 1024, 2),
                },
                "effective_max_running_requests_per_dp": int(a.max_running_requests or 4096),
            }
        )
        extra = {}
        if "launch_command" in engines.SERVER_INFO_EXTRA.get(EMULATED_SGLANG_VERSION, ()):
            # 0.5.23 build_server_info (utils/common.py:3584-3593) and server_info (http_server.py:863-892)
            extra = {
                "launch_command": launch_command(sys.argv[1:]),
                "kv_events": None,  # describe_kv_events_publisher: None without --kv-events-config
                "startup_time": None,  # TokenizerManager.startup_time (phases not modelled: unset)
                "frontend": "python",
            }
        return {
            **args,
            **extra,
            "status": "ready",
            "max_total_num_tokens": self.kv_tokens,
            "max_req_input_len": max_req_len - 5,
            "internal_states": [state],
            "version": SERVER_VERSION,
            "simulator": True,
            "simulator_name": SIM_HEADER_VALUE,
            "simulator_faults": self.engine.faults.names(),
            "gpu_profile": self.profile.name,
        }

    def accepting_generation(self) -> bool:
        return self.state in ("ready", "draining")

    def access_log_enabled(self, path: str) -> bool:
        return self.access_log and not any(path.startswith(p) for p in self.exclude_prefixes)

    def request_begin(self, rid: str) -> None:
        with self.lock:
            if self.handle_loop_at is None:
                self.handle_loop_at = time.monotonic()
            self.inflight[rid] = time.monotonic()

    def request_end(self, rid: str) -> None:
        with self.lock:
            self.inflight.pop(rid, None)
            self.lock.notify_all()

    # ------------------------------------------------------------------ signals
    def _on_sigterm(self, signum, frame) -> None:
        if self.node_rank >= 1:
            # node rank >= 1 (_launch_subprocesses joins its schedulers): no handler, the default action
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.handle_loop_at is not None:
            # SignalHandler.sigterm_handler (run by loop.add_signal_handler, so no signum/frame are passed)
            if not self.sigterm:
                log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
            self.sigterm = True
        elif self._was_ready and self.httpd is not None:
            self.uvicorn_exit = True  # uvicorn's own handle_exit: graceful HTTP shutdown, then re-raise
        else:
            # still in _launch_subprocesses: no handler at all, the default action ends the process
            # (the children follow by PR_SET_PDEATHSIG)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _on_sigint(self, signum, frame) -> None:
        self.sigint = True

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            if self.nnodes > 1:
                # init_distributed_environment (in the schedulers of 0.5.9): every node of the world joins the
                # TCPStore at --dist-init-addr before any weight is loaded; node 0's engine stalls when one leaves
                lost = self.engine.hung.set if self.node_rank == 0 else (lambda: None)
                try:
                    self.rendezvous = Rendezvous(self.args, lost)  # kept: its connections are the world's
                    self.rendezvous.join()
                except RendezvousError as e:
                    log(f"Scheduler hit an exception: Traceback (most recent call last):\n{e}")
                    log("Received sigquit from a child process. It usually means the child failed.")
                    kill_process_tree(os.getpid(), include_parent=True)
            self._spawn_children()
            rc = self._main_loop()
        finally:
            self._kill_children()
            if self.httpd is not None:
                self.httpd.shutdown()
                self.httpd.server_close()
        return rc

    def _start_http(self) -> int | None:
        """uvicorn.run() in 0.5.9's ``launch_server``: only after ``_launch_subprocesses`` returned, i.e. after
        the weights, KV cache and CUDA graphs are loaded. None when serving, else the exit status."""
        host, port = self.args.host, int(self.args.port)
        log(f"INFO:     Started server process [{os.getpid()}]")
        log("INFO:     Waiting for application startup.")
        log("INFO:     Application startup complete.")
        error = None
        if self.faults.port_taken:
            error = bind_error_message(host, port)
        else:
            try:
                self.httpd = SimHTTPServer((host, port), self)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    error = bind_error_message(host, port)
                else:
                    error = bind_error_message(host, port, e.errno or 0, (e.strerror or str(e)).lower())
        if error is None:
            threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
            log(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
            return None
        return self._bind_failed(error)

    def _bind_failed(self, error: str) -> int:
        """uvicorn logs the error and shuts the lifespan down, whose ``finally`` joins the warm-up thread that
        0.5.9's lifespan had already started: ``_execute_server_warmup`` polls GET {url}/model_info once a
        second, 120 times (SGLANG_SIM_WARMUP_TRIES), against whatever holds the port. If nothing there answers
        200 it logs ``Initialization failed. warmup error`` and ``kill_process_tree(os.getpid())`` SIGKILLs
        the children and the main process. If another server answers, the warm-up runs against it and
        uvicorn then exits 1."""
        log(error)
        log("INFO:     Waiting for application shutdown.")
        url = f"http://{self.args.host}:{int(self.args.port)}"
        headers = {"Authorization": f"Bearer {self.args.api_key}"} if self.args.api_key else {}
        last = "no attempt"
        for _ in range(self.warmup_tries):
            time.sleep(1)
            try:
                req = urllib.request.Request(url + "/model_info", headers=headers)
                with urllib.request.urlopen(req, timeout=5) as res:
                    status = res.status
            except urllib.error.HTTPError as e:
                status, last = e.code, f"AssertionError: res=<Response [{e.code}]>"
            except (OSError, ValueError) as e:
                status, last = 0, f"requests.exceptions.ConnectionError: {e}"
            if status == 200:
                break
        else:
            log(f"Initialization failed. warmup error: Traceback (most recent call last):\n{last}")
            self._kill_process_tree()
        body = json.dumps({"text": WARMUP_PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
        try:
            req = urllib.request.Request(
                url + "/generate", data=body.encode(), headers={**headers, "Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=600):
                pass
        except (OSError, ValueError) as e:
            log(f"Initialization failed. warmup error: Traceback (most recent call last):\n{e}")
            self._kill_process_tree()
        log("The server is fired up and ready to roll!")
        log("INFO:     Application shutdown complete.")
        return 1

    def _kill_process_tree(self) -> None:
        """utils.common.kill_process_tree(os.getpid()): SIGKILL to every child, then to this process."""
        for c in self.children:
            with contextlib.suppress(OSError):
                c.popen.kill()
        os.kill(os.getpid(), signal.SIGKILL)

    # ------------------------------------------------------------------ children
    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        pp = env.get("PYTHONPATH")
        env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + pp if pp else "")
        return env

    def _spawn_children(self) -> None:
        a = self.args
        tp = cli.tp_size(a)
        pp = cli.pp_size(a)
        env = self._child_env()
        for i in range(self.local):
            global_rank = int(a.node_rank or 0) * self.local + i
            tp_rank, pp_rank = global_rank % tp, global_rank // tp
            if pp > 1:
                tag, name = f"PP{pp_rank} TP{tp_rank}", f"sglang::scheduler_PP{pp_rank}_TP{tp_rank}"
            else:
                tag, name = f"TP{tp_rank}", f"sglang::scheduler_TP{tp_rank}"
            gpu_index = int(a.base_gpu_id or 0) + i
            gpu = self.profile.gpu(gpu_index)
            assert gpu is not None  # checked in launch_server.check_gpus
            budget = int(self.mem_fraction * gpu.usable_mib)
            weights = int(budget * self.weights_share)
            graph = 0 if a.disable_cuda_graph else min(int(budget * 0.015), 4096)
            spec = {
                "tag": tag,
                "tp_rank": i if pp > 1 else tp_rank,
                "process_name": name,
                "gpu_index": gpu_index,
                "memory_total_mib": gpu.memory_total_mib,
                "usable_mib": gpu.usable_mib,
                "budget_mib": budget,
                "weights_mib": weights,
                "graph_mib": graph,
                "kv_tokens": int(max(0, budget - weights - graph) * 1024 * 1024 // KV_BYTES_PER_TOKEN),
                "load_seconds": self.load_seconds,
                "graph_seconds": self.graph_seconds,
                "disable_cuda_graph": bool(a.disable_cuda_graph),
                "cuda_graph_bs": cuda_graph_bs_list(a),
                "model_type": self.model_type,
                "dtype": "torch.bfloat16",
                "leak": self.faults.leak_gpu_memory,
                "never_ready": self.faults.never_ready,
                "crash_after_load": self.faults.crash_after_load,
                "chunked_prefill_size": a.chunked_prefill_size or 8192,
                "max_running_requests": a.max_running_requests or 4096,
                "context_len": self.context_len,
            }
            popen = subprocess.Popen(
                [sys.executable, "-m", "sglang_sim.scheduler", "--tp-rank", str(tp_rank)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                bufsize=1,
                close_fds=True,
            )
            child = Child("scheduler", popen, tag, tp_rank)
            popen.stdin.write(json.dumps(spec) + "\n")
            popen.stdin.flush()
            self.children.append(child)
            threading.Thread(target=self._read_status, args=(child,), daemon=True).start()
        if self.node_rank >= 1:
            return  # node rank >= 1 runs no detokenizer (_launch_subprocesses)
        detok = subprocess.Popen(
            [sys.executable, "-m", "sglang_sim.detokenizer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            text=True,
            close_fds=True,
        )
        self.children.append(Child("detokenizer", detok))
        self.detok_started = time.monotonic()
        if self.metrics is not None:
            first = next((c for c in self.schedulers()), None)
            if first is not None:
                self.metrics.set_scheduler_pid(first.pid)

    def _detokenizer_cpu(self) -> tuple[float, float] | None:
        """(start, CPU seconds) of the detokenizer, for metrics/cpu_monitor.py's counter."""
        detok = next((c for c in self.children if c.kind == "detokenizer"), None)
        if detok is None or self.detok_started is None:
            return None
        seconds = proc_cpu_seconds(detok.pid)
        return None if seconds is None else (self.detok_started, seconds)

    def _read_status(self, child: Child) -> None:
        assert child.popen.stdout is not None
        for line in child.popen.stdout:
            self.events.put((child, line.strip()))

    def rank_silence(self) -> int | None:
        """The TP rank of a ready scheduler process that is stopped (SIGSTOP, a debugger: state T or t in
        /proc/<pid>/stat), else None. In SGLang 0.5.9 every token comes out of the scheduler processes
        (Scheduler.event_loop_normal: recv_requests, run_batch, process_batch_result -> the detokenizer) and the
        TP ranks run in lockstep through NCCL collectives: one stopped rank stops every request while the main
        process goes on answering HTTP. Read at most every 0.1 s."""
        now = time.monotonic()
        if now - self._silence_read_at < 0.1:
            return self._silence
        self._silence_read_at, silent = now, None
        for c in self.schedulers():
            try:
                with open(f"/proc/{c.pid}/stat", encoding="ascii", errors="replace") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            quiet = c.status == "ready" and state in ("T", "t")
            if quiet != c.silent:  # a simulator line (0.5.9 itself logs nothing: its ranks wait in NCCL)
                c.silent = quiet
                log(f"sglang-sim: TP rank {c.rank}'s scheduler (pid {c.pid}) "
                    + ("is stopped: no token for any request" if quiet else "runs again"))  # fmt: skip
            if quiet and silent is None:
                silent = c.rank
        self._silence = silent
        return silent

    def schedulers(self) -> list[Child]:
        return [c for c in self.children if c.kind == "scheduler"]

    def _kill_children(self) -> None:
        """The main process returns (exit 1, SIGINT): its children die with it by PR_SET_PDEATHSIG (SIGKILL)."""
        if self.faults.orphan_children:
            return
        for c in self.children:
            if c.popen.poll() is None:
                with contextlib.suppress(OSError):
                    c.popen.kill()
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(timeout=5.0)

    def _uvicorn_shutdown(self) -> None:
        """uvicorn's Server.capture_signals: graceful HTTP shutdown, then the captured SIGTERM is re-raised."""
        log("INFO:     Shutting down")
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        log("INFO:     Waiting for application shutdown.")
        log("INFO:     Application shutdown complete.")
        log(f"INFO:     Finished server process [{os.getpid()}]")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # not reached

    # ------------------------------------------------------------------ main loop
    def _next_watchdog_tick(self, after: float) -> float:
        """sigterm_watchdog wakes every 5 s (asyncio.sleep(5)) from the moment the handle loop was created."""
        start = self.handle_loop_at if self.handle_loop_at is not None else after
        n = int((after - start) // self.drain_interval) + 1
        return start + n * self.drain_interval

    def _drain_step(self) -> None:
        """One pass of 0.5.9 TokenizerManager.sigterm_watchdog's drain loop (called at each watchdog tick)."""
        with self.lock:
            rids = list(self.inflight)
        if self.unhealthy:
            log("Signal SIGTERM received while health check failed. Force exiting.")
            kill_process_tree(os.getpid(), include_parent=True)
        if os.environ.get("SGL_FORCE_SHUTDOWN", "false").lower() in ("true", "1"):  # get_bool_env_var
            log("Signal SIGTERM received while force shutdown flag set. Force exiting.")
            kill_process_tree(os.getpid(), include_parent=True)
        log(
            f"Gracefully exiting... Remaining number of requests {len(rids)}. Remaining requests remaining_rids={rids}."
        )
        if not rids:
            # kill_process_tree(os.getpid(), include_parent=True): the children, then this process, by SIGKILL
            kill_process_tree(os.getpid(), include_parent=True)

    def _main_loop(self) -> int:
        drain_tick = 0.0
        while True:
            if self.sigint and self.state != "draining":
                log("KeyboardInterrupt: shutting down (SIGINT).")
                return 0
            if self.uvicorn_exit:
                self._uvicorn_shutdown()
            if self.sigterm and self.state != "draining":
                self.state = "draining"
                drain_tick = self._next_watchdog_tick(time.monotonic())
            if self.state == "draining":
                self._watch_running_children()
                now = time.monotonic()
                if now >= drain_tick:
                    self._drain_step()
                    drain_tick = now + self.drain_interval
                time.sleep(min(0.1, max(0.0, drain_tick - time.monotonic())))
                continue
            # starting / ready: watch the children
            try:
                child, line = self.events.get(timeout=0.1)
            except queue.Empty:
                child, line = None, None
            if child is not None:
                if line.startswith("error"):
                    child.error = line[len("error") :].strip()
                else:
                    child.status = line
            if self._was_ready:
                self._watch_running_children()
            else:
                failed = self._dead_child()
                if failed is not None:
                    return self._fail(failed)
            if self.state == "ready":
                self._maybe_log_decode()
            if self.state == "starting" and self.node_rank >= 1 and all(c.status == "ready" for c in self.schedulers()):
                # entrypoints/engine.py _launch_subprocesses, node_rank >= 1: no tokenizer manager, no warm-up;
                # a health server that answers 200 without asking the engine, then proc.join() forever
                launch_dummy_health_check_server(self.args.host, int(self.args.port))
                self._was_ready = True
                self.state = "ready"
                continue
            if self.state == "starting" and all(c.status == "ready" for c in self.schedulers()):
                self.engine.start_scheduler_loop()
                rc = self._start_http()
                if rc is not None:
                    return rc
                self._warmup()
                if self.sigterm or self.sigint:
                    continue
                self.state = "ready"
                self.server_status = "Up"
                log("The server is fired up and ready to roll!")
                if self.faults.hang_after_ready:
                    self.engine.hung.set()

    def _dead_child(self) -> Child | None:
        """During start-up (_launch_subprocesses): a scheduler that reported an exception, or that died."""
        for c in self.children:
            if c.error is not None:
                return c
            if c.kind == "scheduler" and c.popen.poll() is not None:
                return c
        if any(c.kind == "detokenizer" and c.popen.poll() is not None for c in self.children):
            self.engine.stalled.set()  # 0.5.9 does not watch the detokenizer: requests would hang
        return None

    def _watch_running_children(self) -> None:
        """After start-up 0.5.9's main process only hears of a child that hit an exception (SIGQUIT);
        one that was killed (SIGTERM from a cgroup-wide stop, SIGKILL, OOM killer) goes unnoticed and the
        requests it was serving never finish."""
        for c in self.children:
            if c.error is not None:
                self._fail(c)
            if c.popen.poll() is not None:
                self.engine.stalled.set()
        while True:  # status lines (an "error" is the scheduler's SIGQUIT to us)
            try:
                child, line = self.events.get_nowait()
            except queue.Empty:
                return
            if line.startswith("error"):
                child.error = line[len("error") :].strip()
                self._fail(child)

    def _scheduler_exception(self, text: str) -> None:
        """A scheduler's exception while serving (run_scheduler_process: logged, SIGQUIT to the main process, whose
        running_phase_sigquit_handler kills the whole tree): the server ends by SIGKILL."""
        log(f"Scheduler hit an exception: Traceback (most recent call last):\n{text}", "TP0")
        log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        kill_process_tree(os.getpid(), include_parent=True)

    def _fail(self, child: Child) -> int:
        self.state = "failed"
        # let the other ranks report (and exit) first, as the real crash cascades through all ranks
        time.sleep(0.2)
        if child.error is not None:
            # run_scheduler_process caught an exception and sent SIGQUIT to us: launch_phase_sigquit_handler
            # (engine.py), or SignalHandler.running_phase_sigquit_handler once the handle loop runs; both call
            # kill_process_tree(os.getpid()), so the server ends by SIGKILL.
            if self.handle_loop_at is None:
                log("Received sigquit from a child process. It usually means the child failed.")
            else:
                log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
            kill_process_tree(os.getpid(), include_parent=True)
        # _wait_for_scheduler_ready: the pipe closed without a word (the scheduler was killed)
        log(f"Rank {child.rank} scheduler is dead. Please check if there are relevant logs.")
        log(f"Exit code: {child.popen.returncode}")
        return 1

    def healthy_before_failure(self) -> bool:
        return self._was_ready

    def _maybe_log_decode(self) -> None:
        now = time.monotonic()
        if now < self._next_decode_log:
            return
        self._next_decode_log = now + self.decode_log_interval
        snap = self.engine.snapshot()
        if not snap["num_running_reqs"]:
            return
        log(
            f"Decode batch, #running-req: {snap['num_running_reqs']}, #token: {snap['num_used_tokens']}, "
            f"token usage: {snap['token_usage']:.2f}, cuda graph: {not self.args.disable_cuda_graph}, "
            f"gen throughput (token/s): {self.engine.gen_throughput():.2f}, "
            f"#queue-req: {snap['num_queue_reqs']}, ",
            "TP0",
        )

    def _warmup(self) -> None:
        """0.5.9 ``_execute_server_warmup`` (http_server.py:1667): ``GET /model_info``, then one ``POST /generate``
        of 8 tokens; both go through the HTTP middleware (``sglang:http_requests_total``)."""
        self._was_ready = True
        if self.args.skip_server_warmup:
            return
        if self.metrics is not None:
            self.metrics.http_begin("/model_info", "GET", None)
            self.metrics.http_response("/model_info", "GET", 200)
            self.metrics.http_end("/model_info", "GET", None)
            self.metrics.http_begin("/generate", "POST", None)
        ptoks = len(WARMUP_PROMPT.split()) + 1
        log(
            f"Prefill batch, #new-seq: 1, #new-token: {ptoks}, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0, ",
            "TP0",
        )
        rid = self.engine.new_rid()
        self.request_begin(rid)
        try:
            self.engine.generate(WARMUP_PROMPT, 8, rid=rid)
        finally:
            self.request_end(rid)
            if self.metrics is not None:
                self.metrics.http_response("/generate", "POST", 200)
                self.metrics.http_end("/generate", "POST", None)
        if self.access_log_enabled("/generate"):
            log('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
