"""The engine versions the simulator emulates, one chosen at start (``SGLANG_SIM_ENGINE_VERSION``, default 0.5.9).

Each version has its parser's dump (``data/server-args-<version>.json``: options, defaults, choices; dumped by
lab/real-engine/dump_parser.py from that version's own parser, the same files the role's argument tables are reduced
from) and its ``/server_info`` fields (``data/server-args-fields-<version>.json``). The rest of the simulator is
written against 0.5.9's names (its parser's dests); ``SIM_NAMES`` says where a later version keeps each of them.

What differs between the versions, from their sources:

* 0.5.10.post1: the parser (353 arguments), the ServerArgs dataclass (server_args.py:287); the metrics the simulator
  emits are all there (observability/metrics_collector.py, where 0.5.9's metrics/collector.py moved).
* 0.5.23: the parser (533 arguments) and ServerArgs assembled from arg_groups/fields/ (server_args.py:231);
  ``/server_info`` is ``build_server_info`` (utils/common.py:3584-3593: ``resolved_dict()``, ``launch_command``,
  the scheduler info, ``kv_events``) plus ``startup_time``, ``internal_states``, ``version`` and ``frontend:
  "python"`` (entrypoints/http_server.py:863-892); DSA models default to ``attention_backend "dsa"``
  (arg_groups/model_overrides/deepseek_v2.py:103, 0.5.9 said "nsa", server_args.py:1212); the metrics of
  ``METRICS_GONE`` are not in 0.5.23's observability/ (``cache_config_info`` became the gauges ``sglang:page_size``
  and ``sglang:num_pages``, observability/metrics_collector.py:1325-1336).
"""

from __future__ import annotations

import os

ENV = "SGLANG_SIM_ENGINE_VERSION"
DEFAULT = "0.5.9"
KNOWN = ("0.5.9", "0.5.10.post1", "0.5.23")

# 0.5.9's dest (what the simulator's code reads) -> the dest of the same setting in a later version's parser, or
# None where the version has none (the simulator then reads it as unset: 0.5.9's default below).
SIM_NAMES: dict[str, dict[str, str | None]] = {
    "0.5.23": {
        "tensor_parallel_size": "tp_size",
        "pipeline_parallel_size": "pp_size",
        "data_parallel_size": "dp_size",
        "expert_parallel_size": "ep_size",
        "moe_data_parallel_size": "moe_dp_size",
        "attention_context_parallel_size": "attn_cp_size",
        "cuda_graph_bs": "cuda_graph_bs_decode",
        "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
        "mamba_scheduler_strategy": "mamba_radix_cache_strategy",
        "nsa_prefill_backend": "dsa_prefill_backend",
        "nsa_decode_backend": "dsa_decode_backend",
        # gone in 0.5.23 (plugins/module_utils/sglang_flag_migration.py names each one's source)
        "enable_piecewise_cuda_graph": None,
        "piecewise_cuda_graph_max_tokens": None,
        "piecewise_cuda_graph_tokens": None,
        "collect_tokens_histogram": None,
        "enable_nan_detection": None,
    },
}
UNSET = {"enable_piecewise_cuda_graph": False, "collect_tokens_histogram": False, "enable_nan_detection": False}

# metrics (sglang:<name>) the simulator emits for 0.5.9 that a version does not have: where 0.5.9 defines them
METRICS_GONE: dict[str, dict[str, str]] = {
    "0.5.23": {
        "sglang:cache_config_info": "0.5.9 metrics/collector.py:859",
        "sglang:engine_startup_time": "0.5.9 metrics/collector.py:516",
        "sglang:engine_load_weights_time": "0.5.9 metrics/collector.py:522",
        "sglang:num_running_reqs_offline_batch": "0.5.9 metrics/collector.py:367",
        "sglang:num_prefill_prealloc_queue_reqs": "0.5.9 metrics/collector.py:431",
        "sglang:num_retractions": "0.5.9 metrics/collector.py:1289",
    },
}
# 0.5.23 reports the KV cache layout as two gauges (observability/metrics_collector.py:1325-1336)
PAGE_GAUGES = {"0.5.23"}
# /server_info keys a version adds beside the fields (entrypoints/http_server.py:863-892, utils/common.py:3584)
SERVER_INFO_EXTRA = {"0.5.23": ("launch_command", "kv_events", "startup_time", "frontend")}
# the default attention backend of a DSA model (0.5.9 server_args.py:1212; 0.5.23 model_overrides/deepseek_v2.py:103)
DSA_BACKEND = {"0.5.23": "dsa"}


# What a version does with NaN logits (engine.py emits each): 0.5.9 and 0.5.10.post1 warn at every decode step with
# --enable-nan-detection (layers/sampler.py:66-72; 0.5.10.post1 :67-73); 0.5.23 has no such flag but two environment
# variables (environ.py:516, :1511; EnvBool: true/1/yes/y): SGLANG_ENABLE_NAN_LOGITS_CHECK (or
# SGLANG_ENABLE_ASYNC_ASSERT, environ.py:515) asserts on the device, which ends the server
# (utils/async_probe.py:118-159, managers/scheduler.py:6370-6373), else SGLANG_SANITIZE_NAN_LOGITS sanitizes and warns
# once (async_probe.py:40-82).
_TRUE = ("true", "1", "yes", "y")


def nan_mode(version: str, flag: bool, environ=None) -> str:
    """'warn' (every step), 'sanitize' (one warning), 'check' (fatal) or '' (NaN logits go unseen)."""
    environ = os.environ if environ is None else environ
    if version != "0.5.23":
        return "warn" if flag else ""
    names = ("SGLANG_ENABLE_NAN_LOGITS_CHECK", "SGLANG_ENABLE_ASYNC_ASSERT", "SGLANG_SANITIZE_NAN_LOGITS")
    on = {name for name in names if environ.get(name, "").strip().lower() in _TRUE}
    if on & {"SGLANG_ENABLE_NAN_LOGITS_CHECK", "SGLANG_ENABLE_ASYNC_ASSERT"}:
        return "check"
    return "sanitize" if on else ""


class UnknownEngineVersion(SystemExit):
    """An engine version the simulator has no data for: the start ends (exit 2) naming the variable and the choices."""


def problem(version: str | None) -> str:
    """Empty when ``version`` is one the simulator emulates, else the message that ends the start."""
    if version in KNOWN:
        return ""
    return (
        f"{ENV}={version!r} is not an engine version sglang-sim emulates: set {ENV} to one of {', '.join(KNOWN)} "
        "(each has its parser's dump in sglang_sim/data/server-args-<version>.json), or unset it for "
        f"{DEFAULT}"
    )


def current() -> str:
    """The engine version chosen for this process (its environment; child processes inherit it)."""
    return os.environ.get(ENV, "").strip() or DEFAULT


def args_data(version: str) -> str:
    return f"data/server-args-{version}.json"


def fields_data(version: str) -> str:
    return f"data/server-args-fields-{version}.json"


def to_sim(args, version: str) -> None:
    """After parsing: the 0.5.9 names the simulator reads, from the version's own dests."""
    for sim, own in SIM_NAMES.get(version, {}).items():
        setattr(args, sim, getattr(args, own) if own else UNSET.get(sim))


def from_sim(values: dict, version: str) -> dict:
    """``values`` (a namespace's dict) with each of the version's own dests set from the simulator's 0.5.9 name
    (after the resolution wrote them), the 0.5.9-only names dropped."""
    out = dict(values)
    for sim, own in SIM_NAMES.get(version, {}).items():
        if own and sim in out:
            out[own] = out[sim]
        out.pop(sim, None)
    return out
