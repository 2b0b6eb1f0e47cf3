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
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from . import textgen
from .faults import Faults
from .log import log

# SGLang's default histogram buckets (seconds); end-to-end latency has one more, longer bucket.
# fmt: off
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0]
# fmt: on
E2E_BUCKETS = [*TTFT_BUCKETS, 800.0]
NAN_LOG = "Detected errors during sampling! NaN in the logits."


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


class Histogram:
    def __init__(self, buckets: list[float]):
        self.buckets = sorted(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1
        self.total += value
        self.count += 1


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


@dataclass
class _Running:
    rid: str
    prompt_tokens: int
    generated: int = 0
    started: float = field(default_factory=time.monotonic)


class Engine:
    def __init__(
        self,
        model_name: str,
        faults: Faults,
        *,
        max_running_requests: int | None = None,
        kv_tokens: int = 100_000,
        ttft_buckets: list[float] | None = None,
        e2e_buckets: list[float] | None = None,
        cuda_graph: bool = True,
        nan_detection: bool = False,
    ):
        self.model_name = model_name
        self.nan_detection = nan_detection
        # time.time() of the last output the "detokenizer" handed back (TokenizerManager.last_receive_tstamp)
        self.last_receive_tstamp = 0.0
        # set when the scheduler hangs (fault hang-after-ready): no request gets another token
        self.hung = threading.Event()
        self.faults = faults
        self.max_running = max_running_requests if max_running_requests and max_running_requests > 0 else None
        self.kv_tokens = max(1, kv_tokens)
        self.cuda_graph = cuda_graph
        self.rate_single = env_float("SGLANG_SIM_TOKENS_PER_S", 60.0, 0.001)
        self.knee = env_float("SGLANG_SIM_SATURATION", 32.0, 0.001)
        self.prefill_rate = env_float("SGLANG_SIM_PREFILL_TOKENS_PER_S", 8000.0, 0.001)
        self.ttft_base = env_float("SGLANG_SIM_TTFT_BASE_S", 0.02, 0.0)
        self.max_request_s = env_float("SGLANG_SIM_MAX_REQUEST_SECONDS", 300.0, 0.0)
        self.cond = threading.Condition()
        self.running: dict[str, _Running] = {}
        self.queued = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.ttft_hist = Histogram(ttft_buckets or TTFT_BUCKETS)
        self.e2e_hist = Histogram(e2e_buckets or E2E_BUCKETS)
        self._recent: deque[tuple[float, int]] = deque()
        self._ids = itertools.count()
        self.last_gen_throughput = 0.0
        # Set when a scheduler or the detokenizer died without an exception after start-up: 0.5.9's main
        # process does not notice (no SIGQUIT came), so running and new requests get no more tokens.
        self.stalled = threading.Event()

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

    def snapshot(self) -> dict:
        with self.cond:
            used = sum(r.prompt_tokens + r.generated for r in self.running.values())
            return {
                "num_running_reqs": len(self.running),
                "num_queue_reqs": self.queued,
                "num_used_tokens": used,
                "token_usage": min(1.0, used / self.kv_tokens),
            }

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
    ) -> Result:
        """Run one request: ``prompt`` picks the answer; ``prompt_tokens`` overrides the token estimate.

        ``think``: the model thinks first (a chat request to the simulated thinking model).
        ``log_metrics=False``: not counted in the metrics (the health check's request, as in 0.5.9).
        """
        rid = rid or self.new_rid()
        t_start = time.monotonic()
        if prompt_tokens is None:
            prompt_tokens = textgen.count_tokens(prompt)
        pieces, finish = textgen.plan_output(
            prompt,
            max_tokens,
            ignore_eos=ignore_eos,
            wrong=self.faults.wrong_answer,
            nan=self.faults.nan_output,
            think=think,
        )
        with self.cond:
            self.queued += 1
            try:
                while self.max_running is not None and len(self.running) >= self.max_running:
                    self.cond.wait(0.5)
            finally:
                self.queued -= 1
            state = _Running(rid, prompt_tokens)
            self.running[rid] = state
        try:
            ttft = self._simulate(state, prompt_tokens, pieces, t_start, on_piece)
        finally:
            with self.cond:
                self.running.pop(rid, None)
                self.cond.notify_all()
        e2e = time.monotonic() - t_start
        if not log_metrics:
            return Result(rid, "".join(pieces), pieces, finish, prompt_tokens, len(pieces), ttft, e2e)
        with self.cond:
            self.prompt_tokens_total += prompt_tokens
            self.requests_total += 1
            self.ttft_hist.observe(ttft)
            self.e2e_hist.observe(e2e)
        return Result(rid, "".join(pieces), pieces, finish, prompt_tokens, len(pieces), ttft, e2e)

    def _simulate(
        self,
        state: _Running,
        prompt_tokens: int,
        pieces: list[str],
        t_start: float,
        on_piece: Callable[[str, int], None] | None,
    ) -> float:
        cap_at = t_start + self.max_request_s
        deadline = time.monotonic() + self.ttft_base + prompt_tokens / self.prefill_rate
        ttft = 0.0
        for i, piece in enumerate(pieces):
            while self.stalled.is_set():  # a dead rank: this request never gets another token
                time.sleep(0.5)
            if i > 0:
                with self.cond:
                    c = len(self.running)
                deadline += 1.0 / self.per_request_rate(c)
            now = time.monotonic()
            wait = min(deadline, cap_at) - now
            if wait > 0.0005:
                time.sleep(wait)
            while self.hung.is_set():  # a stuck scheduler: nothing comes back, ever
                time.sleep(3600)
            if self.faults.nan_output and self.nan_detection:
                # layers/sampler.py Sampler._preprocess_logits: one warning per decode step, only with
                # --enable-nan-detection (then the NaN logits become -1e5: still token 0, still "!")
                log(NAN_LOG, "TP0")
            if i == 0:
                ttft = time.monotonic() - t_start
            with self.cond:
                self.last_receive_tstamp = time.time()
                state.generated += 1
                self.generation_tokens_total += 1
                self._note_tokens(1)
            if on_piece is not None:
                on_piece(piece, i)
        if not pieces:
            ttft = time.monotonic() - t_start
            with self.cond:
                self.last_receive_tstamp = time.time()
        return ttft

    # --- Prometheus text
    def metrics_text(self, extra_labels: dict[str, str] | None = None) -> str:
        labels = {"model_name": self.model_name}
        labels.update(extra_labels or {})
        snap = self.snapshot()
        thr = self.gen_throughput()

        def lab(extra: dict[str, str] | None = None) -> str:
            items = dict(labels)
            items.update(extra or {})
            body = ",".join(f'{k}="{_esc(v)}"' for k, v in items.items())
            return "{" + body + "}"

        out: list[str] = ["# sglang-sim: gpufleet lab simulator (not SGLang)"]

        def gauge(name: str, help_: str, value: float) -> None:
            out.append(f"# HELP sglang:{name} {help_}")
            out.append(f"# TYPE sglang:{name} gauge")
            out.append(f"sglang:{name}{lab()} {float(value)}")

        def counter(name: str, help_: str, value: float) -> None:
            # like prometheus_client: metadata under the base name, the sample with "_total"
            out.append(f"# HELP sglang:{name} {help_}")
            out.append(f"# TYPE sglang:{name} counter")
            out.append(f"sglang:{name}_total{lab()} {float(value)}")

        def histogram(name: str, help_: str, h: Histogram) -> None:
            out.append(f"# HELP sglang:{name} {help_}")
            out.append(f"# TYPE sglang:{name} histogram")
            for b, n in zip(h.buckets, h.counts, strict=True):
                out.append(f"sglang:{name}_bucket{lab({'le': _fmt(b)})} {float(n)}")
            out.append(f"sglang:{name}_bucket{lab({'le': '+Inf'})} {float(h.count)}")
            out.append(f"sglang:{name}_count{lab()} {float(h.count)}")
            out.append(f"sglang:{name}_sum{lab()} {float(h.total)}")

        with self.cond:
            prompt_total = self.prompt_tokens_total
            gen_total = self.generation_tokens_total
            req_total = self.requests_total
            gauge("num_running_reqs", "The number of running requests.", snap["num_running_reqs"])
            gauge("num_used_tokens", "The number of used tokens.", snap["num_used_tokens"])
            gauge("token_usage", "The token usage.", snap["token_usage"])
            gauge("gen_throughput", "The generation throughput (token/s).", thr)
            gauge("num_queue_reqs", "The number of requests in the waiting queue.", snap["num_queue_reqs"])
            gauge("cache_hit_rate", "The prefix cache hit rate.", 0.0)
            counter("prompt_tokens", "Number of prefill tokens processed.", prompt_total)
            counter("generation_tokens", "Number of generation tokens processed.", gen_total)
            counter("num_requests", "Number of requests processed.", req_total)
            histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft_hist)
            histogram(
                "e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                self.e2e_hist,
            )
        return "\n".join(out) + "\n"


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(b: float) -> str:
    return repr(float(b))
