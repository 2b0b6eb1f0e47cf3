"""The simulated inference engine: answers, timing model and metrics.

Speed model (all knobs are environment variables, read once at start):

* ``SGLANG_SIM_TOKENS_PER_S`` = R (default 60): decode rate of one request running alone.
* ``SGLANG_SIM_SATURATION`` = K (default 32): concurrency knee. With c requests decoding at once, each
  decodes at ``r(c) = R / (1 + (c - 1) / K)`` tokens/s, so the aggregate ``c * r(c)`` rises almost
  linearly at first and saturates towards ``R * K`` (defaults: 60 tok/s alone, ~1,300 tok/s at c=64).
  ``c`` is re-read at every token, so requests speed up/slow down as others come and go.
* ``SGLANG_SIM_PREFILL_TOKENS_PER_S`` (default 8000): time to first token = prompt_tokens / this
  (+ ``SGLANG_SIM_TTFT_BASE_S``, default 0.02).
* ``SGLANG_SIM_MAX_REQUEST_SECONDS`` (default 300): cap on the simulated delay of one request; past it the
  rest of the answer is sent at once.
* ``--max-running-requests N``: at most N requests run at once, the others wait in the queue
  (``sglang:num_queue_reqs``).

Metrics (``--enable-metrics``, ``metrics.SglangMetrics``) follow 0.5.9's timing, not the instant state:

* scheduler gauges are set by ``log_stats`` at a prefill (a request admitted: ``log_prefill_stats``), every
  ``--decode-log-interval`` (40) decode steps (``log_decode_stats``) and, when idle, at most every 30 s
  (``check_memory``; ``SGLANG_SIM_IDLE_METRICS_INTERVAL`` shortens it for tests): between those they keep their
  last value, so ``sglang:num_running_reqs`` can stay > 0 for up to 30 s after the last request;
* a decode step lasts ``1 / r(c)``; each counts in ``sglang:cuda_graph_passes_total`` and
  ``sglang:realtime_tokens_total{mode="decode"}``;
* the tokenizer side sees an output when the scheduler streams one: every token of a streamed request, every
  50th token (``DEFAULT_FORCE_STREAM_INTERVAL``) and the last of a non-streamed one: the first output gives
  ``sglang:time_to_first_token_seconds``, each later one ``sglang:inter_token_latency_seconds``; the counters and
  ``sglang:e2e_request_latency_seconds`` move when the request finishes;
* a prefix cache (pages of ``page_size`` tokens, LRU within the KV pool) gives ``cached_tokens``,
  ``sglang:cache_hit_rate`` and a shorter prefill.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from . import textgen
from .faults import Faults, FaultSource
from .log import log
from .metrics import SglangMetrics

NAN_LOG = "Detected errors during sampling! NaN in the logits."
# 0.5.23 utils/async_probe.py:40-46 (SGLANG_SANITIZE_NAN_LOGITS: logged once) and :118-159
# (SGLANG_ENABLE_NAN_LOGITS_CHECK: the device-side assert's message, in the scheduler's exception)
NAN_SANITIZED = (
    "NaN detected in sampler: next_token_logits; values were sanitized before sampling. This usually indicates "
    "numerical overflow (e.g. fp16 activations) or an upstream bug producing NaN. Logged once; further occurrences are "
    "silent."
)
NAN_ASSERT = (
    "torch.AcceleratorError: CUDA error: device-side assert triggered: NaN detected! sampler: next_token_logits"
)
# managers/scheduler_output_processor_mixin.py:38: a non-streamed request is sent to the tokenizer every 50 tokens
DEFAULT_FORCE_STREAM_INTERVAL = 50
# managers/scheduler.py:811-823 with environ.py:225-227 (SGLANG_INIT_NEW_TOKEN_RATIO 0.7, factor 0.14, 600 steps)
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        log(f"sglang-sim: ignoring {name}={raw!r} (not a number), using {default}")
        return default
    if minimum is not None and value < minimum:
        return minimum
    return value


class ClientGone(Exception):
    pass


@dataclass
class Result:
    rid: str
    text: str
    pieces: list[str]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft: float
    e2e_latency: float
    cached_tokens: int = 0


@dataclass
class _Running:
    rid: str
    prompt_tokens: int
    generated: int = 0
    started: float = field(default_factory=time.monotonic)


class PrefixCache:
    """The radix cache, coarsely: pages of ``page_size`` tokens keyed by their whole prefix, LRU-evicted beyond
    the KV pool. A match stops one token short of the prompt (a request always computes its last token) and at a
    page boundary, as ``RadixCache.match_prefix`` does."""

    def __init__(self, capacity_tokens: int, page_size: int = 1):
        self.page = max(1, int(page_size))
        self.capacity = max(1, int(capacity_tokens) // self.page)
        self.entries: OrderedDict[int, None] = OrderedDict()

    def _keys(self, tokens: list[str], limit: int) -> list[int]:
        keys, h = [], 0
        for i in range(0, limit - limit % self.page, self.page):
            h = hash((h, tuple(tokens[i : i + self.page])))
            keys.append(h)
        return keys

    def match(self, tokens: list[str]) -> int:
        n = 0
        for key in self._keys(tokens, max(0, len(tokens) - 1)):
            if key not in self.entries:
                break
            self.entries.move_to_end(key)
            n += 1
        return n * self.page

    def insert(self, tokens: list[str]) -> None:
        for key in self._keys(tokens, len(tokens)):
            self.entries[key] = None
            self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)


class Engine:
    def __init__(
        self,
        model_name: str,
        faults: Faults | FaultSource,
        *,
        max_running_requests: int | None = None,
        kv_tokens: int = 100_000,
        cuda_graph: bool = True,
        cuda_graph_max_bs: int | None = None,
        nan_mode: str = "",
        metrics: SglangMetrics | None = None,
        page_size: int = 1,
        decode_log_interval: int = 40,
    ):
        self.model_name = model_name
        self.nan_mode = nan_mode  # engines.nan_mode: what this version does with NaN logits
        self.nan_warned = False
        # the scheduler's fatal exception (set by the server: its crash path); None: the engine alone, nothing ends
        self.fatal: Callable[[str], None] | None = None
        # time.time() of the last output the "detokenizer" handed back (TokenizerManager.last_receive_tstamp)
        self.last_receive_tstamp = 0.0
        # set when the scheduler hangs (fault hang-after-ready): no request gets another token
        self.hung = threading.Event()
        self.fault_source = faults if isinstance(faults, FaultSource) else FaultSource(faults, path="")
        self.max_running = max_running_requests if max_running_requests and max_running_requests > 0 else None
        self.kv_tokens = max(1, kv_tokens)
        self.cuda_graph = cuda_graph
        self.cuda_graph_max_bs = cuda_graph_max_bs
        self.rate_single = env_float("SGLANG_SIM_TOKENS_PER_S", 60.0, 0.001)
        self.knee = env_float("SGLANG_SIM_SATURATION", 32.0, 0.001)
        self.prefill_rate = env_float("SGLANG_SIM_PREFILL_TOKENS_PER_S", 8000.0, 0.001)
        self.ttft_base = env_float("SGLANG_SIM_TTFT_BASE_S", 0.02, 0.0)
        self.max_request_s = env_float("SGLANG_SIM_MAX_REQUEST_SECONDS", 300.0, 0.0)
        self.idle_log_s = env_float("SGLANG_SIM_IDLE_METRICS_INTERVAL", 30.0, 0.01)
        self.cond = threading.Condition()
        self.running: dict[str, _Running] = {}
        self.queued = 0
        self.cache = PrefixCache(self.kv_tokens, page_size)
        self._recent: deque[tuple[float, int]] = deque()
        self._ids = itertools.count()
        # Set when a scheduler or the detokenizer died without an exception after start-up: 0.5.9's main
        # process does not notice (no SIGQUIT came), so running and new requests get no more tokens.
        self.stalled = threading.Event()
        # the TP rank whose scheduler process is stopped (app.App.rank_silence), else None: no request gets a
        # token meanwhile, and they go on when it runs again
        self.rank_silence = lambda: None
        # scheduler-side metric state (managers/scheduler_metrics_mixin.py)
        self.metrics = metrics
        self.decode_log_interval = max(1, int(decode_log_interval or 40))
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0  # decode tokens since the last decode log
        self.last_decode_stats_tic = time.monotonic()
        self.last_log_time = time.monotonic()  # SchedulerMetricsCollector.last_log_time
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.last_gen_throughput = 0.0
        self._ticker: threading.Thread | None = None

    def start_scheduler_loop(self) -> None:
        """The schedulers are ready (their event loop starts): decode steps and idle checks from now on."""
        if self.metrics is None or self._ticker is not None:
            return
        with self.cond:
            self.last_log_time = self.last_decode_stats_tic = time.monotonic()
        self._ticker = threading.Thread(target=self._scheduler_loop, name="sim-scheduler-stats", daemon=True)
        self._ticker.start()

    @property
    def faults(self) -> Faults:
        """The faults in force now (start-time ones merged with SGLANG_SIM_FAULT_FILE's)."""
        return self.fault_source.current()

    # --- speed model
    def per_request_rate(self, concurrency: int) -> float:
        c = max(1, concurrency)
        return self.rate_single / (1.0 + (c - 1) / self.knee)

    def new_rid(self) -> str:
        return uuid.uuid4().hex

    # --- stats
    def _note_tokens(self, n: int) -> None:
        now = time.monotonic()
        self._recent.append((now, n))
        while self._recent and now - self._recent[0][0] > 5.0:
            self._recent.popleft()

    def gen_throughput(self) -> float:
        with self.cond:
            now = time.monotonic()
            while self._recent and now - self._recent[0][0] > 5.0:
                self._recent.popleft()
            if not self._recent:
                return 0.0
            span = max(now - self._recent[0][0], 0.5)
            return sum(n for _, n in self._recent) / span

    def _used_tokens(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self.running.values())

    def snapshot(self) -> dict:
        with self.cond:
            used = self._used_tokens()
            return {
                "num_running_reqs": len(self.running),
                "num_queue_reqs": self.queued,
                "num_used_tokens": used,
                "token_usage": min(1.0, used / self.kv_tokens),
            }

    # --- scheduler metrics (managers/scheduler_metrics_mixin.py), called with self.cond held
    def _base_stats(self) -> dict[str, float]:
        used = self._used_tokens()
        return {
            "num_used_tokens": used,
            "token_usage": min(1.0, used / self.kv_tokens),
            "num_queue_reqs": self.queued,
            "max_total_num_tokens": self.kv_tokens,
            "new_token_ratio": self.new_token_ratio,
            "gen_throughput": self.last_gen_throughput,
        }

    def _log_stats(self, stats: dict[str, float]) -> None:
        self.last_log_time = time.monotonic()
        if self.metrics is not None:
            self.metrics.log_stats(stats)

    def _log_prefill_stats(self, running_bs: int, new_tokens: int, cached_tokens: int) -> None:
        """``log_prefill_stats`` (scheduler_metrics_mixin.py:160): gen_throughput keeps its last value."""
        if self.metrics is None:
            return
        self.metrics.realtime_tokens_inc("prefill_compute", new_tokens)
        self.metrics.realtime_tokens_inc("prefill_cache", cached_tokens)
        total = new_tokens + cached_tokens
        stats = self._base_stats()
        stats.update({"num_running_reqs": running_bs, "cache_hit_rate": cached_tokens / total if total else 0.0})
        self._log_stats(stats)

    def _decode_step(self, batch: int) -> None:
        """One decode forward of ``batch`` requests (scheduler_output_processor_mixin.py:438-442, 532-537)."""
        self.forward_ct_decode = (self.forward_ct_decode + 1) % (1 << 30)
        self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        if self.metrics is None:
            return
        max_bs = self.cuda_graph_max_bs or batch
        self.metrics.cuda_graph_pass(self.cuda_graph and batch <= max_bs)
        if self.forward_ct_decode % self.decode_log_interval == 0:
            now = time.monotonic()
            gap = max(now - self.last_decode_stats_tic, 1e-6)
            self.last_decode_stats_tic = now
            self.last_gen_throughput = self.num_generated_tokens / gap
            self.num_generated_tokens = 0
            stats = self._base_stats()
            stats.update(
                {
                    "num_running_reqs": len(self.running),
                    "decode_sum_seq_lens": self._used_tokens(),
                    "gen_throughput": self.last_gen_throughput,
                    "cache_hit_rate": 0.0,
                }
            )
            self._log_stats(stats)
        self.metrics.realtime_tokens_inc("decode", batch)

    def _idle_check(self) -> None:
        """``self_check_during_idle`` -> ``check_memory`` (scheduler_runtime_checker_mixin.py:253): every 30 s."""
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        if time.monotonic() > self.last_log_time + self.idle_log_s:
            stats = self._base_stats()
            stats.update({"num_running_reqs": len(self.running), "gen_throughput": 0.0})
            stats["token_usage"] = round(stats["token_usage"], 2)
            self._log_stats(stats)

    def _scheduler_loop(self) -> None:
        """The scheduler's event loop, as far as the metrics see it: decode steps while requests run, the idle
        check otherwise; nothing at all while the scheduler is stuck (hung/stalled)."""
        while True:
            if self.hung.is_set() or self.stalled.is_set() or self.rank_silence() is not None:
                time.sleep(0.2)
                continue
            with self.cond:
                c = len(self.running)
                if c == 0:
                    self._idle_check()
                    self.cond.wait(min(1.0, self.idle_log_s))
                    continue
            time.sleep(1.0 / self.per_request_rate(c))
            with self.cond:
                c = len(self.running)
                if c and not (self.hung.is_set() or self.stalled.is_set()):
                    self._decode_step(c)

    # --- generation
    def generate(
        self,
        prompt: str,
        max_tokens: int | None,
        *,
        ignore_eos: bool = False,
        on_piece: Callable[[str, int], None] | None = None,
        rid: str | None = None,
        prompt_tokens: int | None = None,
        think: bool = False,
        log_metrics: bool = True,
        cache_tokens: list[str] | None = None,
        stream: bool | None = None,
    ) -> Result:
        """Run one request: ``prompt`` picks the answer; ``prompt_tokens`` overrides the token estimate.

        ``think``: the model thinks first (a chat request to the simulated thinking model).
        ``log_metrics=False``: not counted in the tokenizer's metrics (the health check's request, as in 0.5.9;
        the scheduler still counts it). ``cache_tokens``: the prompt's tokens for the prefix cache (default: the
        prompt's). ``stream``: a streamed request (default: ``on_piece`` given).
        """
        rid = rid or self.new_rid()
        t_start = time.monotonic()
        faults = self.faults  # SGLANG_SIM_FAULT merged with SGLANG_SIM_FAULT_FILE, read once per request
        stuck_before = self.hung.is_set()
        if self.fault_source.file_faults.hang_after_ready and not stuck_before:
            log("sglang-sim: hang-after-ready (runtime fault): the scheduler stops producing tokens")
            self.hung.set()
        while stuck_before:
            # 0.5.9's scheduler takes requests in at the top of its loop (managers/scheduler.py event_loop_normal:
            # recv_requests, then get_next_batch_to_run and run_batch): one stuck in a step never reads the next
            # request, which waits in the tokenizer's socket: no queue, no prefill, no scheduler gauge or counter moves
            time.sleep(3600)
        tokens = cache_tokens if cache_tokens is not None else textgen.tokenize(prompt)
        if prompt_tokens is None:
            prompt_tokens = len(tokens)
        stream = on_piece is not None if stream is None else stream
        pieces, finish = textgen.plan_output(
            prompt,
            max_tokens,
            ignore_eos=ignore_eos,
            wrong=faults.wrong_answer,
            nan=faults.nan_output,
            think=think,
        )
        with self.cond:
            self.queued += 1
            try:
                while self.max_running is not None and len(self.running) >= self.max_running:
                    self.cond.wait(0.5)
            finally:
                self.queued -= 1
            cached = min(self.cache.match(tokens), max(0, prompt_tokens - 1))
            running_bs = len(self.running)
            state = _Running(rid, prompt_tokens)
            self.running[rid] = state
            self.cache.insert(tokens)
            if self.metrics is not None:
                self.metrics.observe_queue_time(time.monotonic() - t_start)
            self._log_prefill_stats(running_bs, prompt_tokens - cached, cached)
            self.cond.notify_all()
        track = _TokenizerSide(self, t_start, stream, log_metrics)
        try:
            ttft = self._simulate(state, prompt_tokens - cached, pieces, t_start, on_piece, faults, track)
        except ClientGone:
            track.aborted(prompt_tokens, state.generated, cached)
            raise
        finally:
            with self.cond:
                self.running.pop(rid, None)
                self.cache.insert(tokens + pieces[: state.generated])
                self.cond.notify_all()
        e2e = time.monotonic() - t_start
        track.finished(prompt_tokens, len(pieces), cached, e2e)
        return Result(rid, "".join(pieces), pieces, finish, prompt_tokens, len(pieces), ttft, e2e, cached)

    def _simulate(
        self,
        state: _Running,
        new_tokens: int,
        pieces: list[str],
        t_start: float,
        on_piece: Callable[[str, int], None] | None,
        faults: Faults,
        track: _TokenizerSide,
    ) -> float:
        cap_at = t_start + self.max_request_s
        deadline = time.monotonic() + self.ttft_base + new_tokens / self.prefill_rate + faults.slow_step
        ttft = 0.0
        last = len(pieces) - 1
        for i, piece in enumerate(pieces):
            while self.stalled.is_set():  # a dead rank: this request never gets another token
                time.sleep(0.5)
            while self.rank_silence() is not None:  # a stopped rank: its peers wait in their collectives
                time.sleep(0.2)
                deadline = time.monotonic()
            if i > 0:
                with self.cond:
                    c = len(self.running)
                deadline += 1.0 / self.per_request_rate(c) + faults.slow_step
            now = time.monotonic()
            wait = min(deadline, cap_at) - now
            if wait > 0.0005:
                time.sleep(wait)
            while self.hung.is_set():  # a stuck scheduler: nothing comes back, ever
                time.sleep(3600)
            if faults.nan_output and self.nan_mode == "warn":
                # layers/sampler.py Sampler._preprocess_logits: one warning per decode step, only with
                # --enable-nan-detection (then the NaN logits become -1e5: still token 0, still "!")
                log(NAN_LOG, "TP0")
            elif faults.nan_output and self.nan_mode == "sanitize" and not self.nan_warned:
                self.nan_warned = True  # 0.5.23: sanitized to -1e30 (still token 0), one warning per process
                log(NAN_SANITIZED, "TP0")
            elif faults.nan_output and self.nan_mode == "check" and self.fatal is not None:
                self.fatal(NAN_ASSERT)
            if i == 0:
                ttft = time.monotonic() - t_start
            with self.cond:
                self.last_receive_tstamp = time.time()
                state.generated += 1
                if i > 0:
                    self.num_generated_tokens += 1
                self._note_tokens(1)
            track.output(i + 1, i == last)
            if on_piece is not None:
                on_piece(piece, i)
        if not pieces:
            ttft = time.monotonic() - t_start
            with self.cond:
                self.last_receive_tstamp = time.time()
        return ttft


class _TokenizerSide:
    """``TokenizerManager.collect_metrics`` (tokenizer_manager.py:1945) for one request: what it sees of the
    scheduler's outputs (``stream_output_generation``, scheduler_output_processor_mixin.py:958-989)."""

    def __init__(self, engine: Engine, t_start: float, stream: bool, log_metrics: bool):
        self.metrics = engine.metrics if log_metrics else None
        self.t_start = t_start
        self.stream = stream
        self.first = True
        self.last_time = 0.0
        self.last_tokens = 0
        self.done = False

    def output(self, completion_tokens: int, finished: bool) -> None:
        if self.metrics is None:
            return
        if not (finished or self.stream or completion_tokens % DEFAULT_FORCE_STREAM_INTERVAL == 0):
            return  # no output for the tokenizer at this step
        now = time.monotonic()
        if self.first:
            self.first = False
            self.last_time, self.last_tokens = now, completion_tokens
            self.metrics.observe_ttft(now - self.t_start)
        elif completion_tokens - self.last_tokens:
            self.metrics.observe_itl(now - self.last_time, completion_tokens - self.last_tokens)
            self.last_time, self.last_tokens = now, completion_tokens

    def finished(self, prompt_tokens: int, completion_tokens: int, cached: int, e2e: float) -> None:
        if self.metrics is None or self.done:
            return
        self.done = True
        self.metrics.finished(prompt_tokens, completion_tokens, cached, e2e)

    def aborted(self, prompt_tokens: int, completion_tokens: int, cached: int) -> None:
        """A client that went away: ``abort_request`` counts it, then the scheduler's abort finishes it."""
        if self.metrics is None or self.done:
            return
        self.metrics.aborted()
        self.finished(prompt_tokens, completion_tokens, cached, time.monotonic() - self.t_start)
