"""Grafana dashboards of the fleet, generated from the definitions in this file (the one source).

    python tools/dashboards.py            # write dashboards/<uid>.json
    python tools/dashboards.py --check    # exit 1 listing the files that differ from what would be written
    python tools/dashboards.py --queries  # every panel's PromQL, one JSON object a line (for the lab's Prometheus)

A dashboard is rows of panels; a panel has a title, a unit, and one target per PromQL expression with its legend.
The JSON is Grafana's dashboard model (schemaVersion 39): a `datasource` variable (type datasource, Prometheus)
that every panel and target uses as `${datasource}`, and `gpu_class` / `instance` variables from label_values.
Selectors are written with macros, `{SG}` or `{SG, name="x"}`, expanded by `expand()` (SELECTORS below), so that a
panel's filters are the same everywhere.

--queries prints {"dashboard": <uid>, "panel": <title>, "refId": <A, B...>, "expr": <PromQL>} per target, in the
dashboards' order, with Grafana's variables substituted (`substitute()`): `$instance` and `$gpu_class` (only ever
inside `=~` matchers) become `.+`, `$__rate_interval` becomes `1m`. Each is a valid instant query (Prometheus 2.42,
the monitor's) that returns series on a running fleet. tests/unit/dashboards/ checks the files, the metric names
(an allow-list) and runs every query through promtool on synthetic series; dashboards/README.md says how to import.

Metric names used (nothing else; the unit tests hold the allow-list):
  SGLang 0.5.9 (job="sglang"; labels instance, gpu_class, model_name), always the `sglang:` form (sglang issue
  12618: its own dashboard broke over `sglang:` vs `sglang_`): sglang:num_running_reqs, sglang:num_queue_reqs,
  sglang:num_used_tokens, sglang:token_usage, sglang:gen_throughput, sglang:cache_hit_rate,
  sglang:prompt_tokens_total, sglang:generation_tokens_total, sglang:time_to_first_token_seconds_{bucket,sum,count},
  sglang:inter_token_latency_seconds_bucket, sglang:e2e_request_latency_seconds_{bucket,count} (requests are
  counted with the e2e histogram's _count).
  GPUs (job="node", textfile collector roles/node_exporter/files/gpufleet_gpu_metrics.py, label gpu):
  gpufleet_gpu_{utilization_ratio, memory_used_bytes, memory_total_bytes, memory_engine_bytes,
  memory_foreign_bytes, temperature_celsius, power_watts, collector_success}.
  node-exporter 1.5 (job="node", labels instance, role): node_load1, node_memory_MemAvailable_bytes,
  node_memory_MemTotal_bytes, node_filesystem_avail_bytes, node_filesystem_size_bytes, node_systemd_unit_state,
  node_systemd_service_restart_total. Generation probe (job="generation_probe"): probe_success,
  probe_duration_seconds. Prometheus: up, ALERTS.
  SMG (job="smg"), read in the smg repository snapshot (lightseekorg/smg, commit 73da68ca9472, whose crates say
  1.9.0): model_gateway/src/observability/metrics.rs (init_metrics()'s describe_* and the Metrics::record_*/set_*
  functions with their labels), model_gateway/src/middleware/metrics.rs and middleware/logging.rs (the HTTP layer,
  `path` = the matched route), model_gateway/src/routers/http/router.rs (what the HTTP router records),
  model_gateway/src/worker/{worker.rs,manager.rs,circuit_breaker.rs} (worker gauges); each name below is also in
  the smg 1.13.0 wheel's smg_rs.abi3.so (strings), the version roles/fleet_router installs:
    smg_http_requests_total{method, path}                  every request, counted when it arrives
    smg_http_responses_total{path, status_code, error_code}
    smg_http_request_duration_seconds_bucket{method, path} histogram (buckets for *duration_seconds)
    smg_http_connections_active                            in-flight HTTP requests of the gateway
    smg_router_requests_total{router_type, backend_type, connection_mode, model, endpoint, streaming}
    smg_router_request_errors_total{..., model, endpoint, error_type}  no series until the first error
    smg_router_request_duration_seconds_bucket{..., model, endpoint}
    smg_worker_health{worker}                              1 healthy, 0 unhealthy (a removed worker stays, -1)
    smg_worker_requests_active{worker}                     running requests per worker
    smg_worker_cb_state{worker}                            circuit breaker 0 closed, 1 open, 2 half-open
    smg_worker_pool_size{worker_type, connection_mode, model}
    smg_worker_health_checks_total{worker_type, result}    result success|failure
    smg_worker_errors_total{worker_type, connection_mode, error_type}  no series until the first error
    smg_worker_retries_total{worker_type, endpoint}        no series until the first retry
  A counter with no series until its first event is drawn as `<it> or on (instance) 0 * <a counter that exists>`,
  so a healthy gateway shows 0 instead of "No data".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "dashboards"
SCHEMA_VERSION = 39
TAG = "gpufleet"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's variables in the exprs and what --queries puts in their place (a variable only inside =~ matchers).
SUBSTITUTIONS = {"$__rate_interval": "1m", "$instance": ".+", "$gpu_class": ".+"}

# Inference routes of smg (the `path` label is the matched route), as in the router error-rate alert.
INFER_PATHS = "/generate|/v1/chat/completions|/v1/completions|/v1/responses|/v1/messages"

# Selector macros: `{SG}` -> `{job="sglang", ...}`, `{SG, le="1"}` -> `{job="sglang", ..., le="1"}`.
SELECTORS = {
    # the engines (and their probe) of the selected servers
    "SG": 'job="sglang", instance=~"$instance", gpu_class=~"$gpu_class"',
    "PROBE": 'job="generation_probe", instance=~"$instance", gpu_class=~"$gpu_class"',
    # the engines of a GPU class (router dashboard, where $instance is a gateway)
    "SG_CLASS": 'job="sglang", gpu_class=~"$gpu_class"',
    # node-exporter of the selected servers (GPU metrics, the host); every host of the fleet
    "HOST": 'job="node", role="server", instance=~"$instance"',
    "NODE": 'job="node"',
    # the selected gateways, all routes or the inference routes
    "SMG": 'job="smg", instance=~"$instance"',
    "SMG_INFER": f'job="smg", instance=~"$instance", path=~"{INFER_PATHS}"',
    "SMG_NODE": 'job="node", role="router", instance=~"$instance"',
}
_MACRO = re.compile(r"\{([A-Z_]+)(?=[,}])")


def expand(expr: str) -> str:
    """Expand the selector macros of an expression."""

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name not in SELECTORS:
            raise KeyError(f"unknown selector macro {{{name}}} in {expr!r}")
        return "{" + SELECTORS[name]

    return _MACRO.sub(one, expr)


def substitute(expr: str) -> str:
    """The expression with Grafana's variables replaced (SUBSTITUTIONS): an instant query for any Prometheus."""
    out = expr
    for name, value in SUBSTITUTIONS.items():  # $__rate_interval first: no variable is a prefix of another
        out = out.replace("${" + name[1:] + "}", value).replace(name, value)
    if "$" in out:
        raise ValueError(f"a variable --queries cannot substitute is left in {out!r}")
    return out


# --- definitions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    expr: str  # with selector macros
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[Target, ...]
    kind: str = "timeseries"  # or "stat"
    description: str = ""
    width: int = 8
    height: int = 8
    min: float | None = None
    max: float | None = None
    # stat panels: [(color, from value)], the first from None (the base)
    thresholds: tuple[tuple[str, float | None], ...] = (("green", None),)


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str  # label_values(...) (Grafana's Prometheus variable query)
    multi: bool = True  # multi-value with "All"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]


def dashboard(
    name: str, title: str, variables: tuple[Variable, ...], rows: tuple[Row, ...], description: str
) -> Dashboard:
    """A gpufleet dashboard: uid `gpufleet-<name>`, title `gpufleet / <title>`."""
    return Dashboard(f"{TAG}-{name}", f"{TAG} / {title}", description, variables, rows)


def t(expr: str, legend: str = "") -> Target:
    return Target(expr, legend)


def ts(title: str, unit: str, *targets: Target, **kw) -> Panel:
    if unit == "percentunit":
        kw.setdefault("min", 0)
        kw.setdefault("max", 1)
    return Panel(title, unit, targets, **kw)


def stat(title: str, unit: str, *targets: Target, **kw) -> Panel:
    kw.setdefault("width", 4)
    kw.setdefault("height", 4)
    return Panel(title, unit, targets, kind="stat", **kw)


def memory_available(host: str) -> str:
    """The share of memory available on the hosts of selector macro `host` (node-exporter)."""
    return f"node_memory_MemAvailable_bytes{{{host}}} / node_memory_MemTotal_bytes{{{host}}}"


def root_fs_free(host: str) -> str:
    """The share of the root filesystem free on the hosts of selector macro `host` (node-exporter)."""
    return (
        f'node_filesystem_avail_bytes{{{host}, mountpoint="/"}} / node_filesystem_size_bytes{{{host}, mountpoint="/"}}'
    )


def or_zero(expr: str) -> str:
    """`expr` (the rate of an smg counter with no series until its first event) or 0 for each gateway that counts
    requests: a healthy gateway shows 0, not "No data" (the module docstring)."""
    return f"{expr} or on (instance) 0 * sum by (instance) (rate(smg_http_requests_total{{SMG}}[$__rate_interval]))"


UP_COLORS = (("red", None), ("green", 1))  # 0 bad, 1 good
BAD_IF_ANY = (("green", None), ("red", 1))  # 0 good, 1 or more bad

GPU_CLASS = Variable("gpu_class", "GPU class", 'label_values(up{job="sglang"}, gpu_class)')
SERVERS = Variable("instance", "Server", 'label_values(up{job="sglang", gpu_class=~"$gpu_class"}, instance)')
ONE_SERVER = Variable(
    "instance", "Server", 'label_values(up{job="sglang", gpu_class=~"$gpu_class"}, instance)', multi=False
)
GATEWAYS = Variable("instance", "Gateway", 'label_values(up{job="smg"}, instance)')


def quantiles(metric: str, by: str, selector: str, legend: str, qs=(0.5, 0.99)) -> tuple[Target, ...]:
    """histogram_quantile targets of a histogram's _bucket series, grouped by `by` (le added)."""
    return tuple(
        t(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{selector}[$__rate_interval])))",
            f"{legend} p{round(q * 100)}".strip(),
        )
        for q in qs
    )


FLEET_ROWS = (
    Row(
        "Health",
        (
            stat(
                "Servers up",
                "none",
                t("sum(up{SG})", "up"),
                t("count(up{SG})", "scraped"),
                description="SGLang engines answering their /metrics scrape, of the engines scraped.",
            ),
            stat(
                "Generation probe success",
                "percentunit",
                t("avg(probe_success{PROBE})", "success"),
                description="Share of servers whose last generation probe returned the known answer.",
                thresholds=(("red", None), ("orange", 0.5), ("green", 1)),
            ),
            stat(
                "Gateways up",
                "none",
                t('sum(up{job="smg"})', "up"),
                t('count(up{job="smg"})', "scraped"),
                description="smg gateways answering their Prometheus scrape.",
            ),
            stat(
                "Request rate",
                "reqps",
                t("sum(rate(sglang:e2e_request_latency_seconds_count{SG}[$__rate_interval]))", "requests/s"),
                description="Requests finished per second by the selected engines.",
            ),
            stat(
                "Generation tokens/s",
                "short",
                t("sum(rate(sglang:generation_tokens_total{SG}[$__rate_interval]))", "tokens/s"),
                description="Tokens generated per second by the selected engines (finished requests).",
            ),
            stat(
                "Firing alerts",
                "none",
                t('count(ALERTS{alertstate="firing"}) or vector(0)', "firing"),
                description="Alerts firing now, fleet-wide (gpufleet-alerts.yml). 0 when none fires.",
                thresholds=BAD_IF_ANY,
            ),
        ),
    ),
    Row(
        "Traffic",
        (
            ts(
                "Request rate by server",
                "reqps",
                t(
                    "sum by (instance) (rate(sglang:e2e_request_latency_seconds_count{SG}[$__rate_interval]))",
                    "{{instance}}",
                ),
            ),
            ts(
                "Generation tokens/s by server",
                "short",
                t("sum by (instance) (rate(sglang:generation_tokens_total{SG}[$__rate_interval]))", "{{instance}}"),
            ),
            ts(
                "Generation probe duration",
                "s",
                t("probe_duration_seconds{PROBE}", "{{instance}}"),
                description="Seconds the blackbox exporter's real generation took on each server.",
            ),
        ),
    ),
    Row(
        "Latency (by GPU class)",
        (
            ts(
                "Time to first token p50 / p99",
                "s",
                *quantiles("sglang:time_to_first_token_seconds", "gpu_class", "{SG}", "{{gpu_class}}"),
            ),
            ts(
                "Inter-token latency p99",
                "s",
                *quantiles("sglang:inter_token_latency_seconds", "gpu_class", "{SG}", "{{gpu_class}}", (0.99,)),
            ),
            ts(
                "End-to-end request latency p50 / p99",
                "s",
                *quantiles("sglang:e2e_request_latency_seconds", "gpu_class", "{SG}", "{{gpu_class}}"),
            ),
        ),
    ),
    Row(
        "Load",
        (
            ts(
                "Queued requests",
                "short",
                t("sum by (instance) (sglang:num_queue_reqs{SG})", "{{instance}}"),
                description="Requests waiting in each engine's queue.",
            ),
            ts(
                "Running requests",
                "short",
                t("sum by (instance) (sglang:num_running_reqs{SG})", "{{instance}}"),
            ),
            ts(
                "KV cache token usage",
                "percentunit",
                t("max by (instance) (sglang:token_usage{SG})", "{{instance}}"),
                description="Share of the KV-cache token pool in use (the KVCacheFull alert watches > 90%).",
            ),
        ),
    ),
    Row(
        "Hosts (every role)",
        (
            stat(
                "Fleet units active",
                "none",
                t('sum(node_systemd_unit_state{NODE, name=~"sglang.*|smg.*", state="active"})', "active"),
                t('count(node_systemd_unit_state{NODE, name=~"sglang.*|smg.*", state="active"})', "units"),
                description="sglang-server and smg-router units in state active, of the units reported.",
                width=6,
                height=8,
            ),
            ts("Root filesystem free", "percentunit", t(root_fs_free("NODE"), "{{instance}} ({{role}})"), width=6),
            ts("Memory available", "percentunit", t(memory_available("NODE"), "{{instance}} ({{role}})"), width=6),
            ts("Load (1 min)", "short", t("node_load1{NODE}", "{{instance}} ({{role}})"), width=6),
        ),
    ),
)

SERVER_ROWS = (
    Row(
        "Status",
        (
            stat("Engine up", "none", t("up{SG}", "{{instance}}"), thresholds=UP_COLORS),
            stat("Generation probe", "none", t("probe_success{PROBE}", "{{instance}}"), thresholds=UP_COLORS),
            stat("Probe duration", "s", t("probe_duration_seconds{PROBE}", "{{instance}}")),
            stat(
                "sglang unit active",
                "none",
                t('node_systemd_unit_state{HOST, name=~"sglang.*", state="active"}', "{{name}}"),
                thresholds=UP_COLORS,
            ),
            stat(
                "Restarts (1h)",
                "none",
                t('increase(node_systemd_service_restart_total{HOST, name=~"sglang.*"}[1h])', "{{name}}"),
                description="Restarts of the engine's unit by systemd in the last hour (crashes, OOM kills).",
                thresholds=BAD_IF_ANY,
            ),
            stat(
                "GPU collector",
                "none",
                t("gpufleet_gpu_collector_success{HOST}", "{{instance}}"),
                description="1 when the last nvidia-smi reading succeeded.",
                thresholds=UP_COLORS,
            ),
        ),
    ),
    Row(
        "Requests",
        (
            ts(
                "Running and queued requests",
                "short",
                t("sglang:num_running_reqs{SG}", "running {{instance}}"),
                t("sglang:num_queue_reqs{SG}", "queued {{instance}}"),
            ),
            ts(
                "Request rate",
                "reqps",
                t(
                    "sum by (instance) (rate(sglang:e2e_request_latency_seconds_count{SG}[$__rate_interval]))",
                    "{{instance}}",
                ),
            ),
            ts(
                "Tokens/s",
                "short",
                t(
                    "sum by (instance) (rate(sglang:generation_tokens_total{SG}[$__rate_interval]))",
                    "generated {{instance}}",
                ),
                t(
                    "sum by (instance) (rate(sglang:prompt_tokens_total{SG}[$__rate_interval]))",
                    "prompt {{instance}}",
                ),
                t("sglang:gen_throughput{SG}", "engine-reported {{instance}}"),
                description="Generated and prompt tokens per second (counters of finished requests), and the "
                "engine's own generation throughput gauge.",
            ),
        ),
    ),
    Row(
        "Latency",
        (
            ts(
                "Time to first token",
                "s",
                *quantiles("sglang:time_to_first_token_seconds", "instance", "{SG}", "{{instance}}"),
                t(
                    "sum by (instance) (rate(sglang:time_to_first_token_seconds_sum{SG}[$__rate_interval]))"
                    " / sum by (instance) (rate(sglang:time_to_first_token_seconds_count{SG}[$__rate_interval]))",
                    "{{instance}} mean",
                ),
            ),
            ts(
                "Inter-token latency",
                "s",
                *quantiles("sglang:inter_token_latency_seconds", "instance", "{SG}", "{{instance}}"),
            ),
            ts(
                "End-to-end request latency",
                "s",
                *quantiles("sglang:e2e_request_latency_seconds", "instance", "{SG}", "{{instance}}"),
            ),
        ),
    ),
    Row(
        "KV cache",
        (
            ts("Token usage", "percentunit", t("sglang:token_usage{SG}", "{{instance}}")),
            ts("Used tokens", "short", t("sglang:num_used_tokens{SG}", "{{instance}}")),
            ts("Prefix cache hit rate", "percentunit", t("sglang:cache_hit_rate{SG}", "{{instance}}")),
        ),
    ),
    Row(
        "GPUs and host",
        (
            ts(
                "GPU utilisation",
                "percentunit",
                t("gpufleet_gpu_utilization_ratio{HOST}", "GPU {{gpu}}"),
                width=6,
            ),
            ts(
                "GPU memory",
                "bytes",
                t("gpufleet_gpu_memory_used_bytes{HOST}", "used GPU {{gpu}}"),
                t("gpufleet_gpu_memory_engine_bytes{HOST}", "engine GPU {{gpu}}"),
                t("gpufleet_gpu_memory_total_bytes{HOST}", "total GPU {{gpu}}"),
                width=6,
            ),
            ts(
                "Host memory and root filesystem free",
                "percentunit",
                t(memory_available("HOST"), "memory available"),
                t(root_fs_free("HOST"), "/ free"),
                width=6,
            ),
            ts("Host load (1 min)", "short", t("node_load1{HOST}", "load1"), width=6),
        ),
    ),
)

GPUS_ROWS = (
    Row(
        "Summary",
        (
            stat("GPUs reporting", "none", t("count(gpufleet_gpu_utilization_ratio{HOST})", "GPUs")),
            stat(
                "Collectors OK",
                "none",
                t("sum(gpufleet_gpu_collector_success{HOST})", "ok"),
                t("count(gpufleet_gpu_collector_success{HOST})", "hosts"),
                description="Hosts whose last nvidia-smi reading succeeded, of the GPU hosts.",
            ),
            stat("Mean utilisation", "percentunit", t("avg(gpufleet_gpu_utilization_ratio{HOST})", "mean")),
            stat(
                "Hottest GPU",
                "celsius",
                t("max(gpufleet_gpu_temperature_celsius{HOST})", "max"),
                thresholds=(("green", None), ("orange", 80), ("red", 88)),
            ),
            stat("Power draw", "watt", t("sum(gpufleet_gpu_power_watts{HOST})", "total")),
            stat(
                "Foreign memory",
                "bytes",
                t("sum(gpufleet_gpu_memory_foreign_bytes{HOST})", "total"),
                description="GPU memory held by processes that are not the engine's (alert above 1 GiB a GPU).",
                thresholds=(("green", None), ("red", 1073741824)),
            ),
        ),
    ),
    Row(
        "Utilisation and memory",
        (
            ts(
                "Utilisation",
                "percentunit",
                t("gpufleet_gpu_utilization_ratio{HOST}", "{{instance}} GPU {{gpu}}"),
            ),
            ts(
                "Memory used vs total",
                "bytes",
                t("gpufleet_gpu_memory_used_bytes{HOST}", "{{instance}} GPU {{gpu}} used"),
                t("gpufleet_gpu_memory_total_bytes{HOST}", "{{instance}} GPU {{gpu}} total"),
            ),
            ts(
                "Memory used (share)",
                "percentunit",
                t(
                    "gpufleet_gpu_memory_used_bytes{HOST} / gpufleet_gpu_memory_total_bytes{HOST}",
                    "{{instance}} GPU {{gpu}}",
                ),
            ),
        ),
    ),
    Row(
        "Engine and foreign memory",
        (
            ts(
                "Engine memory",
                "bytes",
                t("gpufleet_gpu_memory_engine_bytes{HOST}", "{{instance}} GPU {{gpu}}"),
                description="GPU memory of the processes of the engine's systemd unit.",
                width=12,
            ),
            ts(
                "Foreign memory",
                "bytes",
                t("gpufleet_gpu_memory_foreign_bytes{HOST}", "{{instance}} GPU {{gpu}}"),
                description="Used memory not held by the engine: an orphaned scheduler, another program, a leak. "
                "GpufleetGpuForeignMemory fires above 1 GiB.",
                width=12,
            ),
        ),
    ),
    Row(
        "Temperature and power",
        (
            ts(
                "Temperature",
                "celsius",
                t("gpufleet_gpu_temperature_celsius{HOST}", "{{instance}} GPU {{gpu}}"),
                width=12,
            ),
            ts("Power", "watt", t("gpufleet_gpu_power_watts{HOST}", "{{instance}} GPU {{gpu}}"), width=12),
        ),
    ),
)

ROUTER_ROWS = (
    Row(
        "Gateways",
        (
            stat("Gateway up", "none", t("up{SMG}", "{{instance}}"), thresholds=UP_COLORS),
            stat(
                "Healthy workers",
                "none",
                t("sum by (instance) (smg_worker_health{SMG} == bool 1)", "{{instance}}"),
                description="Workers each gateway lists as healthy (smg_worker_health == 1).",
                thresholds=UP_COLORS,
            ),
            stat(
                "smg unit active",
                "none",
                t('node_systemd_unit_state{SMG_NODE, name=~"smg.*", state="active"}', "{{instance}}"),
                thresholds=UP_COLORS,
            ),
            stat(
                "Restarts (1h)",
                "none",
                t('increase(node_systemd_service_restart_total{SMG_NODE, name=~"smg.*"}[1h])', "{{instance}}"),
                thresholds=BAD_IF_ANY,
            ),
            stat(
                "In-flight requests",
                "none",
                t("smg_http_connections_active{SMG}", "{{instance}}"),
                description="HTTP requests the gateway is serving now.",
            ),
            stat(
                "Routed requests/s",
                "reqps",
                t("sum by (instance) (rate(smg_router_requests_total{SMG}[$__rate_interval]))", "{{instance}}"),
                description="Requests routed to a worker per second (smg_router_requests_total).",
            ),
        ),
    ),
    Row(
        "Traffic",
        (
            ts(
                "HTTP requests by route",
                "reqps",
                t(
                    "sum by (instance, path) (rate(smg_http_requests_total{SMG}[$__rate_interval]))",
                    "{{instance}} {{path}}",
                ),
                description="Every request the gateway received, by matched route (health checks included).",
            ),
            ts(
                "Routed requests by model and endpoint",
                "reqps",
                t(
                    "sum by (instance, model, endpoint) (rate(smg_router_requests_total{SMG}[$__rate_interval]))",
                    "{{instance}} {{model}} {{endpoint}}",
                ),
            ),
            ts(
                "Running requests per worker",
                "short",
                t("smg_worker_requests_active{SMG}", "{{instance}} -> {{worker}}"),
            ),
        ),
    ),
    Row(
        "Errors",
        (
            ts(
                "Responses by status code",
                "reqps",
                t(
                    "sum by (instance, status_code) (rate(smg_http_responses_total{SMG}[$__rate_interval]))",
                    "{{instance}} {{status_code}}",
                ),
            ),
            ts(
                "Inference error ratio",
                "percentunit",
                t(
                    "(sum by (instance) ("
                    'rate(smg_http_responses_total{SMG_INFER, status_code=~"5.."}[$__rate_interval])'
                    " or "
                    'rate(smg_http_responses_total{SMG_INFER, error_code=~"stream_error|model_not_found"}'
                    "[$__rate_interval]))"
                    " or on (instance) "
                    "0 * sum by (instance) (rate(smg_http_responses_total{SMG_INFER}[$__rate_interval])))"
                    " / "
                    'sum by (instance) (rate(smg_http_responses_total{SMG_INFER, status_code!="499"}'
                    "[$__rate_interval]))",
                    "{{instance}}",
                ),
                description="Inference requests answered with a 5xx, a broken stream or no worker for the "
                "model, of those answered (a client's 499 left out): GpufleetRouterErrorRate fires above 5%.",
            ),
            ts(
                "Router errors by type",
                "reqps",
                t(
                    or_zero(
                        "sum by (instance, error_type) (rate(smg_router_request_errors_total{SMG}[$__rate_interval]))"
                    ),
                    "{{instance}} {{error_type}}",
                ),
            ),
            ts(
                "Worker errors and retries",
                "reqps",
                t(
                    or_zero("sum by (instance, error_type) (rate(smg_worker_errors_total{SMG}[$__rate_interval]))"),
                    "{{instance}} error {{error_type}}",
                ),
                t(
                    or_zero("sum by (instance, endpoint) (rate(smg_worker_retries_total{SMG}[$__rate_interval]))"),
                    "{{instance}} retry {{endpoint}}",
                ),
                width=12,
            ),
            ts(
                "Worker health checks by result",
                "ops",
                t(
                    "sum by (instance, result) (rate(smg_worker_health_checks_total{SMG}[$__rate_interval]))",
                    "{{instance}} {{result}}",
                ),
                width=12,
            ),
        ),
    ),
    Row(
        "Latency",
        (
            ts(
                "Routed request latency",
                "s",
                *quantiles("smg_router_request_duration_seconds", "instance", "{SMG}", "{{instance}}"),
                width=12,
            ),
            ts(
                "HTTP request latency p99 by route",
                "s",
                *quantiles(
                    "smg_http_request_duration_seconds", "instance, path", "{SMG}", "{{instance}} {{path}}", (0.99,)
                ),
                width=12,
            ),
        ),
    ),
    Row(
        "Workers",
        (
            ts(
                "Worker health",
                "none",
                t("smg_worker_health{SMG}", "{{instance}} -> {{worker}}"),
                description="1 healthy, 0 unhealthy (a worker removed from the gateway stays at -1).",
            ),
            ts(
                "Circuit breaker state",
                "none",
                t("smg_worker_cb_state{SMG}", "{{instance}} -> {{worker}}"),
                description="0 closed (serving), 1 open (no requests sent), 2 half-open (trying again).",
            ),
            ts(
                "Worker pool size",
                "none",
                t("smg_worker_pool_size{SMG}", "{{instance}} {{model}}"),
            ),
        ),
    ),
    Row(
        "Engines behind the gateways (by GPU class)",
        (
            ts(
                "Engine request rate",
                "reqps",
                t(
                    "sum by (gpu_class) (rate(sglang:e2e_request_latency_seconds_count{SG_CLASS}[$__rate_interval]))",
                    "{{gpu_class}}",
                ),
            ),
            ts(
                "Engine end-to-end latency p99",
                "s",
                *quantiles("sglang:e2e_request_latency_seconds", "gpu_class", "{SG_CLASS}", "{{gpu_class}}", (0.99,)),
            ),
            ts(
                "Engine running and queued requests",
                "short",
                t("sum by (gpu_class) (sglang:num_running_reqs{SG_CLASS})", "running {{gpu_class}}"),
                t("sum by (gpu_class) (sglang:num_queue_reqs{SG_CLASS})", "queued {{gpu_class}}"),
            ),
        ),
    ),
)

# The dashboards: name (uid gpufleet-<name>), title (after "gpufleet / "), variables, rows and what they show.
DASHBOARDS: tuple[Dashboard, ...] = (
    dashboard(
        "fleet",
        "Fleet overview",
        (GPU_CLASS, SERVERS),
        FLEET_ROWS,
        "The fleet at a glance: engines, probe, traffic, latency, load, firing alerts and hosts.",
    ),
    dashboard(
        "server",
        "Server",
        (GPU_CLASS, ONE_SERVER),
        SERVER_ROWS,
        "One SGLang server: engine, probe, requests, latency, KV cache, GPUs and host.",
    ),
    dashboard(
        "gpus",
        "GPUs",
        (GPU_CLASS, SERVERS),
        GPUS_ROWS,
        "Every GPU of the selected servers (nvidia-smi through node-exporter's textfile collector).",
    ),
    dashboard(
        "router",
        "Router (smg)",
        (GPU_CLASS, GATEWAYS),
        ROUTER_ROWS,
        "The smg gateways: traffic, errors, latency and workers; the engines behind them by GPU class.",
    ),
)


# --- Grafana JSON ------------------------------------------------------------------------------------------------


def variable_json(var: Variable) -> dict:
    out = {
        "name": var.name,
        "label": var.label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": var.query,
        "query": {"query": var.query, "refId": f"PrometheusVariableQueryEditor-{var.name}"},
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "hide": 0,
        "skipUrlSync": False,
        "multi": var.multi,
        "includeAll": var.multi,
        "options": [],
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if var.multi else {},
    }
    if var.name == "gpu_class":
        out["allValue"] = ".+"  # every class, also one that appeared after the page loaded
    return out


def datasource_variable() -> dict:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "regex": "",
        "refresh": 1,
        "hide": 0,
        "skipUrlSync": False,
        "multi": False,
        "includeAll": False,
        "options": [],
        "current": {},
    }


def target_json(target: Target, ref_id: str) -> dict:
    return {
        "refId": ref_id,
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expand(target.expr),
        "legendFormat": target.legend or "__auto",
        "range": True,
        "instant": False,
    }


def panel_json(panel: Panel, panel_id: int, grid: dict) -> dict:
    defaults: dict = {
        "unit": panel.unit,
        "color": {"mode": "palette-classic" if panel.kind == "timeseries" else "thresholds"},
    }
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    defaults["thresholds"] = {
        "mode": "absolute",
        "steps": [{"color": color, "value": value} for color, value in panel.thresholds],
    }
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineInterpolation": "linear",
            "lineWidth": 1,
            "fillOpacity": 10,
            "gradientMode": "none",
            "showPoints": "never",
            "spanNulls": False,
            "axisPlacement": "auto",
            "axisSoftMin": 0,
            "stacking": {"mode": "none", "group": "A"},
            "thresholdsStyle": {"mode": "off"},
        }
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
            "wideLayout": True,
            "showPercentChange": False,
        }
    else:
        raise ValueError(f"panel {panel.title!r}: unknown kind {panel.kind!r}")
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [target_json(target, chr(ord("A") + i)) for i, target in enumerate(panel.targets)],
    }


def dashboard_json(dash: Dashboard) -> dict:
    panels: list[dict] = []
    next_id = 1
    y = 0
    for row in dash.rows:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if not 1 <= panel.width <= 24:
                raise ValueError(f"{dash.uid}/{panel.title}: width {panel.width} is not 1..24")
            if x + panel.width > 24:
                y += line_height
                x, line_height = 0, 0
            panels.append(panel_json(panel, next_id, {"h": panel.height, "w": panel.width, "x": x, "y": y}))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return {
        "uid": dash.uid,
        "title": dash.title,
        "description": dash.description + " Generated by tools/dashboards.py: edit that file, not this one.",
        "tags": [TAG],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "id": None,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "title": "gpufleet dashboards",
                "type": "dashboards",
                "tags": [TAG],
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
                "targetBlank": False,
                "icon": "external link",
                "tooltip": "",
                "url": "",
            }
        ],
        "templating": {"list": [datasource_variable(), *(variable_json(v) for v in dash.variables)]},
        "panels": panels,
    }


def render() -> dict[str, str]:
    """File name -> the text this generator writes for it."""
    files = {}
    for dash in DASHBOARDS:
        files[f"{dash.uid}.json"] = json.dumps(dashboard_json(dash), indent=2) + "\n"
    if len(files) != len(DASHBOARDS):
        raise ValueError("two dashboards share a uid")
    return files


def check(out_dir: Path = OUT_DIR) -> list[str]:
    """What differs between out_dir and what render() gives: one line each (empty: up to date)."""
    problems = []
    wanted = render()
    for name, text in wanted.items():
        path = out_dir / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text() != text:
            problems.append(f"{path}: differs from tools/dashboards.py")
    for path in sorted(out_dir.glob("*.json")):
        if path.name not in wanted:
            problems.append(f"{path}: no dashboard of tools/dashboards.py has this uid (remove it)")
    return problems


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = out_dir / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def queries() -> list[dict]:
    """One record per panel target: dashboard uid, panel title, refId, expr with the variables substituted."""
    out = []
    for dash in DASHBOARDS:
        for panel in dashboard_json(dash)["panels"]:
            for target in panel.get("targets", []):
                out.append(
                    {
                        "dashboard": dash.uid,
                        "panel": panel["title"],
                        "refId": target["refId"],
                        "expr": substitute(target["expr"]),
                    }
                )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when dashboards/ differs from what would be written")
    mode.add_argument("--queries", action="store_true", help="print every panel's PromQL, one JSON object a line")
    args = parser.parse_args(argv)
    if args.queries:
        sys.stdout.write("".join(json.dumps(record) + "\n" for record in queries()))
        return 0
    if args.check:
        problems = check()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run `python tools/dashboards.py` and commit dashboards/", file=sys.stderr)
            return 1
        print(f"dashboards/: {len(DASHBOARDS)} dashboards up to date")
        return 0
    written = write()
    for path in written:
        print(f"wrote {path.relative_to(ROOT)}")
    print(f"dashboards/: {len(DASHBOARDS)} dashboards, {len(written)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
