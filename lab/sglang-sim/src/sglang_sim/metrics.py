"""``/metrics`` as sglang 0.5.9 serves it: its collectors, in prometheus_client's multiprocess mode.

What 0.5.9 does (file:line of the sglang 0.5.9 sources, python/sglang/srt/...; the README's "Metrics" section has
the full list):

* ``--enable-metrics``: ``utils/common.py:1553 set_prometheus_multiproc_dir`` (multiprocess mode) and, in the
  lifespan, ``utils/common.py:1571 add_prometheus_middleware``: ``Mount("/metrics", make_asgi_app(registry))``
  over a ``MultiProcessCollector``. Without the flag there is no such route: 404 ``{"detail":"Not Found"}``.
* The metrics: ``metrics/collector.py`` ``SchedulerMetricsCollector`` (in the scheduler processes, labels
  ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`` [+ ``dp_rank``] + ``--extra-metric-labels``,
  ``managers/scheduler_metrics_mixin.py:114``) and ``TokenizerMetricsCollector`` (in the main process, labels
  ``model_name`` + ``--tokenizer-metrics-allowed-custom-labels`` + ``--extra-metric-labels``,
  ``managers/tokenizer_manager.py:433``), the HTTP middleware's counters (``utils/common.py:1604``) and the
  detokenizer's CPU counter (``metrics/cpu_monitor.py``).
* A family appears only once one of its children exists (a ``.labels(...)`` call), as in multiprocess mode.
  Labels are written sorted by name; histograms as ``_sum``, ``_bucket``..., ``_count``; gauges in mode
  ``all`` (the default) get a ``pid`` label, ``mostrecent``/``livesum`` do not.
* The exposition is prometheus_client 0.26.0's (the version locks/sglang-cu128 pins), chosen by the ``Accept``
  header (``exposition.choose_encoder``): the Prometheus text format 0.0.4 by default, **OpenMetrics when the
  scraper asks for it** (Prometheus does). prometheus_client 0.26 then writes the sample names with ``:``
  escaped to ``_`` (``openmetrics/exposition.py``: the sample name goes through ``_escape`` with the label-name
  rune test), while ``# HELP``/``# TYPE`` keep ``sglang:``: a Prometheus that negotiates OpenMetrics stores
  ``sglang_num_running_reqs``, one that reads the text format ``sglang:num_running_reqs``. Gzip with
  ``Accept-Encoding: gzip``; ``?name[]=`` restricts the samples (``RestrictedRegistry``).
"""

from __future__ import annotations

import gzip
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import parse_qs

from .log import log

SIM_COMMENT = "# sglang-sim: gpufleet lab simulator (not SGLang)"

# ---------------------------------------------------------------- 0.5.9 bucket boundaries (metrics/collector.py)
# fmt: off
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]  # collector.py:1192
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800,
               2400]  # collector.py:1214
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]  # collector.py:1240
QUEUE_TIME_BUCKETS = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400,
                      500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000]  # collector.py:533
RETRACTION_BUCKETS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 75, 100]  # collector.py:1292
TOKENS_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000, 15000,
                  20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000, 600000, 900000,
                  1100000]  # collector.py:1117
ROUTING_KEY_REQ_COUNT_BUCKET_BOUNDS = [1, 2, 3, 5, 7, 10, 20, 50, 100, 200]  # collector.py:260
# fmt: on


def exponential_buckets(start: float, width: float, length: int) -> list[float]:
    """``metrics/utils.py:52``."""
    return [start * (width**i) for i in range(length)]


PER_STAGE_BUCKETS = exponential_buckets(0.001, 1.62, 30)  # collector.py:705


def generate_buckets(rule: list[str] | None, default: list[float]) -> list[float]:
    """``metrics/utils.py:34 generate_buckets`` (``--prompt-tokens-buckets`` / ``--generation-tokens-buckets``)."""
    rule = list(rule or ["default"])
    if rule[0] == "tse":
        middle, base, count = rule[1:]
        assert float(base) > 1.0, "Base must be greater than 1.0"
        return two_sides_exponential_buckets(float(middle), float(base), int(count))
    if rule[0] == "default":
        return sorted(set(default))
    assert rule[0] == "custom"
    return sorted({float(x) for x in rule[1:]})


def two_sides_exponential_buckets(middle: float, base: float, count: int) -> list[float]:
    """``metrics/utils.py:20``."""
    buckets = [middle]
    distance = 1.0
    for _ in range(math.ceil(count / 2)):
        distance *= base
        buckets.append(middle + distance)
        buckets.append(max(0, middle - distance))
    return sorted(set(buckets))


def check_buckets(buckets: Iterable[float]) -> list[float]:
    """prometheus_client ``Histogram._prepare_buckets``: floats, sorted, +Inf appended, at least two."""
    out = [float(b) for b in buckets]
    if out != sorted(out):
        raise ValueError("Buckets not in sorted order")
    if out and out[-1] != math.inf:
        out.append(math.inf)
    if len(out) < 2:
        raise ValueError("Must have at least two buckets")
    return out


# ---------------------------------------------------------------- prometheus_client 0.26.0 exposition, ported
UNDERSCORES, ALLOWUTF8, DOTS, VALUES = "underscores", "allow-utf-8", "dots", "values"
CONTENT_TYPE_PLAIN_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_PLAIN_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"
CONTENT_TYPE_OM_1_0_0 = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def float_to_go_string(d: float) -> str:
    """``utils.floatToGoString``."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _legacy_label_rune(b: str, i: int) -> bool:
    return ("a" <= b <= "z") or ("A" <= b <= "Z") or b == "_" or ("0" <= b <= "9" and i > 0)


def _legacy_metric_rune(b: str, i: int) -> bool:
    return _legacy_label_rune(b, i) or b == ":"


def _valid_legacy_metric_name(name: str) -> bool:
    return bool(name) and all(_legacy_metric_rune(b, i) for i, b in enumerate(name))


def _valid_legacy_label_name(name: str) -> bool:
    return bool(name) and all(_legacy_label_rune(b, i) for i, b in enumerate(name)) and not name.startswith("__")


def _escape(s: str, escaping: str, valid: Callable[[str, int], bool]) -> str:
    """``openmetrics/exposition.py _escape``."""
    if escaping == ALLOWUTF8:
        return s.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    out = []
    if escaping == UNDERSCORES:
        for i, b in enumerate(s):
            out.append(b if valid(b, i) else "_")
    elif escaping == DOTS:
        for i, b in enumerate(s):
            out.append("__" if b == "_" else "_dot_" if b == "." else b if valid(b, i) else "__")
    elif escaping == VALUES:
        out.append("U__")
        for i, b in enumerate(s):
            if b == "_":
                out.append("__")
            elif valid(b, i):
                out.append(b)
            elif 0xD800 <= ord(b) <= 0xDFFF:
                out.append("_FFFD_")
            else:
                out.append(f"_{ord(b):x}_")
    else:
        return s
    return "".join(out)


def _escape_name(s: str, escaping: str, valid: Callable[[str], bool], rune: Callable[[str, int], bool]) -> str:
    """The steps ``escape_metric_name`` and ``escape_label_name`` share; they differ only in the name test
    (``valid``) and the rune test (``rune``)."""
    if not s:
        return s
    if escaping == ALLOWUTF8:
        if not valid(s):
            return f'"{_escape(s, escaping, rune)}"'
        return _escape(s, escaping, rune)
    if escaping in (UNDERSCORES, VALUES):
        return s if valid(s) else _escape(s, escaping, rune)
    if escaping == DOTS:
        return _escape(s, escaping, rune)
    return s


def escape_metric_name(s: str, escaping: str) -> str:
    return _escape_name(s, escaping, _valid_legacy_metric_name, _legacy_metric_rune)


def escape_label_name(s: str, escaping: str) -> str:
    return _escape_name(s, escaping, _valid_legacy_label_name, _legacy_label_rune)


def _label_str(labels: dict[str, str], escaping: str) -> str:
    return ",".join(
        f'{escape_label_name(k, escaping)}="{_escape(v, ALLOWUTF8, _legacy_label_rune)}"'
        for k, v in sorted(labels.items())
    )


def _accept_params(toks: list[str], key: str) -> str:
    for tok in toks:
        if "=" not in tok:
            continue
        k, v = tok.strip().split("=", 1)
        if k == key:
            return v
    return ""


def _escaping_of(toks: list[str]) -> str:
    for tok in toks:
        if "=" not in tok:
            continue
        k, v = tok.strip().split("=", 1)
        if k != "escaping":
            continue
        return v if v in (ALLOWUTF8, UNDERSCORES, DOTS, VALUES) else UNDERSCORES
    return UNDERSCORES


def _parse_version(v: str) -> tuple:
    out: list = []
    for part in v.split("."):
        try:
            out.append(int(part))
        except ValueError:
            out.append(part)
    return tuple(out)


def choose_format(accept: str | None) -> tuple[str, str, str]:
    """``exposition.choose_encoder``: (format "text"/"openmetrics", escaping, Content-Type)."""
    for accepted in (accept or "").split(","):
        toks = accepted.split(";")
        mime = toks[0].strip()
        if mime == "application/openmetrics-text":
            version, escaping = _accept_params(toks, "version"), _escaping_of(toks)
            if not version:
                return "openmetrics", UNDERSCORES, CONTENT_TYPE_OM_1_0_0
            if _parse_version(version) >= (1, 0, 0):
                return (
                    "openmetrics",
                    escaping,
                    f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}",
                )
        elif mime == "text/plain":
            version, escaping = _accept_params(toks, "version"), _escaping_of(toks)
            if version and _parse_version(version) >= (1, 0, 0):
                return "text", escaping, f"{CONTENT_TYPE_PLAIN_1_0_0}; escaping={escaping}"
    return "text", UNDERSCORES, CONTENT_TYPE_PLAIN_0_0_4


# ---------------------------------------------------------------- metric families (multiprocess semantics)
class Family:
    """One metric as prometheus_client defines it (``name`` as given to it; counters lose ``_total``)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        labelnames: Iterable[str] = (),
        *,
        buckets: Iterable[float] | None = None,
        mode: str = "all",
        pid: int | None = None,
    ):
        if typ == "counter" and name.endswith("_total"):
            name = name[: -len("_total")]
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.labelnames = tuple(labelnames)
        self.buckets = check_buckets(buckets) if typ == "histogram" else []
        self.mode = mode  # gauges: all (pid label), mostrecent, livesum
        self.pid = pid if pid is not None else os.getpid()
        self.children: dict[tuple[str, ...], list[float]] = {}

    def _key(self, labels: dict) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def child(self, labels: dict) -> list[float]:
        """``.labels(**labels)``: creates the child (value 0) if new. Histograms: [sum, bucket counts...]."""
        key = self._key(labels)
        ch = self.children.get(key)
        if ch is None:
            ch = [0.0] * (1 + len(self.buckets)) if self.type == "histogram" else [0.0]
            self.children[key] = ch
        return ch

    def inc(self, labels: dict, amount: float = 1.0) -> None:
        self.child(labels)[0] += amount

    def dec(self, labels: dict, amount: float = 1.0) -> None:
        self.child(labels)[0] -= amount

    def set(self, labels: dict, value: float) -> None:
        self.child(labels)[0] = float(value)

    def observe(self, labels: dict, value: float, count: int = 1, sum_: float | None = None) -> None:
        """``Histogram.observe``; ``count``/``sum_`` for ``observe_inter_token_latency``'s batch form (one
        bucket gets ``count``, the sum gets ``sum_``)."""
        ch = self.child(labels)
        ch[0] += value if sum_ is None else sum_
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                ch[1 + i] += count
                break

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        out = []
        for key, ch in self.children.items():
            labels = dict(zip(self.labelnames, key, strict=True))
            if self.type == "counter":
                out.append((self.name + "_total", labels, ch[0]))
            elif self.type == "gauge":
                if self.mode == "all":
                    labels = {**labels, "pid": str(self.pid)}
                out.append((self.name, labels, ch[0]))
            else:  # histogram: multiprocess.MultiProcessCollector order
                out.append((self.name + "_sum", labels, ch[0]))
                acc = 0.0
                for bound, n in zip(self.buckets, ch[1:], strict=True):
                    acc += n
                    out.append((self.name + "_bucket", {**labels, "le": float_to_go_string(bound)}, acc))
                out.append((self.name + "_count", labels, acc))
        return out


class Registry:
    """The families in the order their first child appeared (what a scrape of the multiprocess dir lists).
    ``hidden``: names the emulated engine version does not have (engines.METRICS_GONE): fed, never exposed."""

    def __init__(self, hidden: Iterable[str] = ()) -> None:
        self.lock = threading.RLock()
        self.families: dict[str, Family] = {}
        self.hidden = set(hidden)

    def add(self, family: Family) -> Family:
        if family.name not in self.hidden:
            self.families[family.name] = family
        return family

    # prometheus_client's Counter/Histogram/Gauge constructors, registered here
    def counter(self, name: str, documentation: str, labelnames: Iterable[str]) -> Family:
        return self.add(Family(name, documentation, "counter", labelnames))

    def histogram(self, name: str, documentation: str, labelnames: Iterable[str], buckets: Iterable[float]) -> Family:
        return self.add(Family(name, documentation, "histogram", labelnames, buckets=buckets))

    def gauge(
        self, name: str, documentation: str, labelnames: Iterable[str], *, mode: str, pid: int | None = None
    ) -> Family:
        return self.add(Family(name, documentation, "gauge", labelnames, mode=mode, pid=pid))

    def render(self, accept: str | None = None, query: str = "", sim_comment: bool = True) -> tuple[bytes, str]:
        fmt, escaping, content_type = choose_format(accept)
        names = set(parse_qs(query).get("name[]", []))
        with self.lock:
            metrics = []
            for fam in self.families.values():
                samples = fam.samples()
                if names:
                    samples = [s for s in samples if s[0] in names]
                if samples:
                    metrics.append((fam, samples))
        out: list[str] = []
        if fmt == "text":
            if sim_comment:
                out.append(SIM_COMMENT + "\n")  # a comment line: valid in the text format, not in OpenMetrics
            for fam, samples in metrics:
                mname = fam.name + "_total" if fam.type == "counter" else fam.name
                doc = fam.documentation.replace("\\", r"\\").replace("\n", r"\n")
                out.append(f"# HELP {escape_metric_name(mname, escaping)} {doc}\n")
                out.append(f"# TYPE {escape_metric_name(mname, escaping)} {fam.type}\n")
                for name, labels, value in samples:
                    lab = _label_str(labels, escaping)
                    if escaping != ALLOWUTF8 or _valid_legacy_metric_name(name):
                        lab = "{" + lab + "}" if lab else ""
                        out.append(f"{escape_metric_name(name, escaping)}{lab} {float_to_go_string(value)}\n")
                    else:
                        comma = "," if lab else ""
                        out.append(
                            f"{{{escape_metric_name(name, escaping)}{comma}{lab}}} {float_to_go_string(value)}\n"
                        )
        else:
            for fam, samples in metrics:
                doc = _escape(fam.documentation, ALLOWUTF8, _legacy_label_rune)
                out.append(f"# HELP {escape_metric_name(fam.name, escaping)} {doc}\n")
                out.append(f"# TYPE {escape_metric_name(fam.name, escaping)} {fam.type}\n")
                for name, labels, value in samples:
                    lab = _label_str(labels, escaping)
                    if escaping == ALLOWUTF8 and not _valid_legacy_metric_name(name):
                        lab = escape_metric_name(name, escaping) + ("," + lab if lab else "")
                        out.append(f"{{{lab}}} {float_to_go_string(value)}\n")
                    else:
                        lab = "{" + lab + "}" if lab else ""
                        # prometheus_client 0.26: the sample name is escaped with the *label* rune test, so
                        # with the default "underscores" escaping "sglang:x" is written "sglang_x"
                        out.append(f"{_escape(name, escaping, _legacy_label_rune)}{lab} {float_to_go_string(value)}\n")
            out.append("# EOF\n")
        return "".join(out).encode("utf-8"), content_type


def bake(registry: Registry, accept: str | None, accept_encoding: str | None, query: str) -> tuple[bytes, dict]:
    """``exposition._bake_output``: (body, headers)."""
    body, content_type = registry.render(accept, query)
    headers = {"Content-Type": content_type}
    if any(a.split(";")[0].strip().lower() == "gzip" for a in (accept_encoding or "").split(",")):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


# ---------------------------------------------------------------- sglang 0.5.9's collectors
# (name, documentation) as metrics/collector.py defines them; all gauges of SchedulerMetricsCollector that
# log_stats sets (collector.py:975), in that order. Multiprocess mode "mostrecent", but for those in
# SCHEDULER_GAUGES_MODE_ALL (mode "all", the default: a pid label).
SCHEDULER_GAUGES: list[tuple[str, str]] = [
    ("num_running_reqs", "The number of running requests."),
    ("num_used_tokens", "The number of used tokens."),
    ("token_usage", "The token usage."),
    ("pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet)."),
    ("swa_token_usage", "The token usage for SWA layers."),
    ("mamba_usage", "The token usage for Mamba layers."),
    ("decode_sum_seq_lens", "The sum of all sequence lengths in decode."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."),
    ("num_running_reqs_offline_batch", "The number of running low-priority offline batch requests(label is 'batch')."),
    ("cache_hit_rate", "The prefix cache hit rate."),
    ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    ("spec_accept_length", "The average acceptance length of speculative decoding."),
    (
        "spec_accept_rate",
        "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` in batch).",
    ),
    ("num_prefill_prealloc_queue_reqs", "The number of requests in the prefill prealloc queue."),
    ("num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."),
    ("num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."),
    ("num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."),
    ("kv_transfer_speed_gb_s", "The transfer speed of the KV cache in GB/s."),
    ("kv_transfer_latency_ms", "The transfer latency of the KV cache in ms."),
    ("kv_transfer_bootstrap_ms", "The bootstrap time of the KV transfer in ms."),
    ("kv_transfer_alloc_ms", "The allocation waiting time of the KV transfer in ms."),
    ("kv_transfer_total_mb", "The total number of tokens transferred in the KV cache."),
    ("num_retracted_reqs", "The number of retracted requests."),
    ("num_paused_reqs", "The number of paused requests by async weight sync."),
    ("utilization", "The utilization."),
    ("engine_startup_time", "The time taken for the engine to start up."),
    ("engine_load_weights_time", "The time taken for the engine to load weights."),
    ("new_token_ratio", "The new token ratio."),
    ("is_cuda_graph", "Whether the batch is using CUDA graph."),
    ("num_unique_running_routing_keys", "Number of unique routing keys in running batch."),
]
SCHEDULER_GAUGES_MODE_ALL = {"num_retracted_reqs", "num_paused_reqs"}
ROUTING_KEY_GAUGE_HISTOGRAMS = [
    (
        "routing_key_running_req_count",
        "Distribution of routing keys by running request count (gt < count <= le).",
    ),
    (
        "routing_key_all_req_count",
        "Distribution of routing keys by running+waiting request count (gt < count <= le).",
    ),
]


class SglangMetrics:
    """The metrics one 0.5.9 server (node 0) exposes, fed by the simulated engine and HTTP server."""

    def __init__(
        self,
        *,
        tokenizer_labels: dict[str, str],
        scheduler_labels: list[dict[str, str]],
        scheduler_pid: int | None = None,
        bucket_time_to_first_token: list[float] | None = None,
        bucket_inter_token_latency: list[float] | None = None,
        bucket_e2e_request_latency: list[float] | None = None,
        collect_tokens_histogram: bool = False,
        prompt_tokens_buckets: list[str] | None = None,
        generation_tokens_buckets: list[str] | None = None,
        page_size: int = 1,
        max_total_num_tokens: int = 0,
        detokenizer_cpu: Callable[[], tuple[float, float] | None] | None = None,
        engine_version: str = "0.5.9",
    ):
        from .engines import METRICS_GONE, PAGE_GAUGES

        self.engine_version = engine_version
        self.reg = Registry(METRICS_GONE.get(engine_version, {}))
        self.lock = self.reg.lock
        self.tok_labels = dict(tokenizer_labels)
        self.sched_labels = [dict(lab) for lab in scheduler_labels]
        self.detokenizer_cpu = detokenizer_cpu
        spid = scheduler_pid if scheduler_pid is not None else os.getpid()
        sched_names = list(self.sched_labels[0]) if self.sched_labels else []
        tok_names = list(self.tok_labels)
        reg = self.reg
        # HTTP middleware (utils/common.py:1604 add_prometheus_track_response_middleware), livesum gauges first
        self.routing_keys_active = reg.gauge(
            "sglang:routing_keys_active", "Number of unique routing keys with active requests", (), mode="livesum"
        )
        self.routing_keys_active.child({})  # no labels: present from the start
        self.http_active = reg.gauge(
            "sglang:http_requests_active",
            "Number of currently active HTTP requests",
            ("endpoint", "method"),
            mode="livesum",
        )
        # TokenizerMetricsCollector (collector.py:1088)
        self.ttft = reg.histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            tok_names,
            bucket_time_to_first_token or TTFT_BUCKETS,
        )
        self.itl = reg.histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok_names,
            bucket_inter_token_latency or ITL_BUCKETS,
        )
        self.e2e = reg.histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            tok_names,
            bucket_e2e_request_latency or E2E_BUCKETS,
        )
        self.prompt_hist = self.gen_hist = None
        if collect_tokens_histogram:
            self.prompt_hist = reg.histogram(
                "sglang:prompt_tokens_histogram",
                "Histogram of prompt token length.",
                tok_names,
                generate_buckets(prompt_tokens_buckets, TOKENS_BUCKETS),
            )
            self.gen_hist = reg.histogram(
                "sglang:generation_tokens_histogram",
                "Histogram of generation token length.",
                tok_names,
                generate_buckets(generation_tokens_buckets, TOKENS_BUCKETS),
            )
        self.num_retractions = reg.histogram(
            "sglang:num_retractions", "Histogram of retraction counts per request.", tok_names, RETRACTION_BUCKETS
        )
        # SchedulerMetricsCollector gauges (collector.py:306-776), in log_stats order
        self.gauges: dict[str, Family] = {}
        self.cache_config_info = reg.gauge(
            "sglang:cache_config_info",
            "Cache configuration information.",
            ("page_size", "num_pages"),
            mode="mostrecent",
        )
        for short, doc in SCHEDULER_GAUGES:
            mode = "all" if short in SCHEDULER_GAUGES_MODE_ALL else "mostrecent"
            self.gauges[short] = reg.gauge(f"sglang:{short}", doc, sched_names, mode=mode, pid=spid)
        self.routing_hists = [
            reg.gauge(f"sglang:{n}", d, [*sched_names, "gt", "le"], mode="mostrecent")
            for n, d in ROUTING_KEY_GAUGE_HISTOGRAMS
        ]
        self.cuda_graph_passes = reg.counter(
            "sglang:cuda_graph_passes_total",
            "Total number of forward passes categorized by CUDA graph.",
            [*sched_names, "mode"],
        )
        self.realtime_tokens = reg.counter(
            "sglang:realtime_tokens_total",
            "Total number of tokens processed (updated on each log interval). "
            "mode: prefill_compute, prefill_cache, decode.",
            [*sched_names, "mode"],
        )
        # TokenizerMetricsCollector counters
        self.prompt_tokens = reg.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", tok_names)
        self.generation_tokens = reg.counter(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", tok_names
        )
        self.cached_tokens = reg.counter(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*tok_names, "cache_source"],
        )
        self.num_requests = reg.counter("sglang:num_requests_total", "Number of requests processed.", tok_names)
        self.num_aborted = reg.counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tok_names)
        self.http_requests = reg.counter(
            "sglang:http_requests_total", "Total number of HTTP requests by endpoint and method", ("endpoint", "method")
        )
        self.http_responses = reg.counter(
            "sglang:http_responses_total",
            "Total number of HTTP responses by endpoint and status code",
            ("endpoint", "status_code", "method"),
        )
        self.cpu_seconds = reg.counter(
            "sglang:process_cpu_seconds_total",
            "Total CPU time consumed by this process (user + system)",
            ("component",),
        )
        self.queue_time = reg.histogram(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", sched_names, QUEUE_TIME_BUCKETS
        )
        self.per_stage = reg.histogram(
            "sglang:per_stage_req_latency_seconds",
            "The latency of each stage of requests.",
            [*sched_names, "stage"],
            PER_STAGE_BUCKETS,
        )
        # Scheduler.init_cache_with_memory_pool (managers/scheduler.py:631): every rank, at start-up
        self.cache_config_info.set({"page_size": page_size, "num_pages": max_total_num_tokens // max(1, page_size)}, 1)
        if engine_version in PAGE_GAUGES:  # 0.5.23 observability/metrics_collector.py:1325-1336, every rank
            page = reg.gauge("sglang:page_size", "KV cache page size in tokens.", sched_names, mode="mostrecent")
            pages = reg.gauge("sglang:num_pages", "Number of KV cache pages.", sched_names, mode="mostrecent")
            for labels in self.sched_labels:
                page.set(labels, page_size)
                pages.set(labels, max_total_num_tokens // max(1, page_size))
        self._routing_keys: dict[str, int] = {}

    def set_scheduler_pid(self, pid: int) -> None:
        """The ``pid`` label of the gauges in multiprocess mode ``all`` (the scheduler process that logs)."""
        with self.lock:
            for fam in self.gauges.values():
                fam.pid = pid

    # -- scheduler side (the ranks that log: attn_tp_rank 0, or all with --enable-metrics-for-all-schedulers)
    def log_stats(self, stats: dict[str, float]) -> None:
        """``SchedulerMetricsCollector.log_stats`` (collector.py:975): every gauge, the rest at their value."""
        with self.lock:
            for labels in self.sched_labels:
                for short, _doc in SCHEDULER_GAUGES:
                    self.gauges[short].set(labels, stats.get(short, 0.0))
                for fam in self.routing_hists:  # set_by_current_observations(labels, []): all buckets 0
                    bounds = ROUTING_KEY_REQ_COUNT_BUCKET_BOUNDS
                    lows = [0, *bounds]
                    highs = [str(b) for b in bounds] + ["+Inf"]
                    for lo, hi in zip(lows, highs, strict=True):
                        fam.set({**labels, "gt": str(lo), "le": hi}, 0)

    def observe_queue_time(self, seconds: float) -> None:
        with self.lock:
            for labels in self.sched_labels:
                self.queue_time.observe(labels, seconds)
                self.per_stage.observe({**labels, "stage": "prefill_waiting"}, seconds)

    def realtime_tokens_inc(self, mode: str, n: int) -> None:
        if n <= 0:
            return
        with self.lock:
            for labels in self.sched_labels:
                self.realtime_tokens.inc({**labels, "mode": mode}, n)

    def cuda_graph_pass(self, used: bool) -> None:
        with self.lock:
            for labels in self.sched_labels:
                self.cuda_graph_passes.inc({**labels, "mode": "decode_cuda_graph" if used else "decode_none"})

    # -- tokenizer side
    def observe_ttft(self, seconds: float) -> None:
        with self.lock:
            self.ttft.observe(self.tok_labels, seconds)

    def observe_itl(self, interval: float, num_new_tokens: int) -> None:
        """``observe_inter_token_latency`` (collector.py:1381): the sum gets the interval, one bucket
        (interval / tokens) gets the token count."""
        if num_new_tokens <= 0:
            return
        with self.lock:
            self.itl.observe(self.tok_labels, interval / num_new_tokens, count=num_new_tokens, sum_=interval)

    def finished(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, e2e: float) -> None:
        """``observe_one_finished_request`` (collector.py:1315)."""
        with self.lock:
            lab = self.tok_labels
            self.prompt_tokens.inc(lab, prompt_tokens)
            self.generation_tokens.inc(lab, completion_tokens)
            if cached_tokens > 0:
                self.cached_tokens.inc({**lab, "cache_source": "total"}, cached_tokens)
            self.num_requests.inc(lab)
            self.e2e.observe(lab, float(e2e))
            if self.prompt_hist is not None and self.gen_hist is not None:
                self.prompt_hist.observe(lab, float(prompt_tokens))
                self.gen_hist.observe(lab, float(completion_tokens))
            self.num_retractions.observe(lab, 0)

    def aborted(self) -> None:
        """``TokenizerManager.abort_request`` -> ``observe_one_aborted_request`` (tokenizer_manager.py:1320)."""
        with self.lock:
            self.num_aborted.inc(self.tok_labels)

    # -- HTTP middleware (utils/common.py:1634 track_http_status_code)
    def http_begin(self, endpoint: str, method: str, routing_key: str | None) -> None:
        with self.lock:
            self.http_requests.inc({"endpoint": endpoint, "method": method})
            self.http_active.inc({"endpoint": endpoint, "method": method})
            if routing_key:
                n = self._routing_keys.get(routing_key, 0)
                self._routing_keys[routing_key] = n + 1
                if n == 0:
                    self.routing_keys_active.inc({})

    def http_response(self, endpoint: str, method: str, status: int) -> None:
        with self.lock:
            self.http_responses.inc({"endpoint": endpoint, "method": method, "status_code": str(status)})

    def http_end(self, endpoint: str, method: str, routing_key: str | None) -> None:
        with self.lock:
            self.http_active.dec({"endpoint": endpoint, "method": method})
            if routing_key and routing_key in self._routing_keys:
                self._routing_keys[routing_key] -= 1
                if self._routing_keys[routing_key] == 0:
                    del self._routing_keys[routing_key]
                    self.routing_keys_active.dec({})

    # -- exposition
    def refresh_cpu(self) -> None:
        """``metrics/cpu_monitor.py``: the detokenizer adds its CPU seconds every 5 s (first after 5 s)."""
        if self.detokenizer_cpu is None:
            return
        got = self.detokenizer_cpu()
        if got is None:
            return
        started, seconds = got
        if time.monotonic() - started < 5.0:
            return
        with self.lock:
            self.cpu_seconds.set({"component": "detokenizer"}, seconds)

    def render(self, accept: str | None, accept_encoding: str | None, query: str) -> tuple[bytes, dict]:
        try:
            self.refresh_cpu()
        except Exception as e:  # noqa: BLE001 - the CPU counter is best effort, never a failed scrape
            log(f"sglang-sim: detokenizer CPU time unavailable: {e}")
        return bake(self.reg, accept, accept_encoding, query)
