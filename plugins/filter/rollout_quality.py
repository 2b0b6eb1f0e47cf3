"""Filters of the rollout's quality gate (roles/rollout tasks/quality_*.yml; docs/quality-gate.md): the key of a
host's quality baseline (GPU class, model, lane) with its file name, and why a stored baseline cannot judge a run.
The scoring itself is module_utils/sglang_quality_eval.py's (module sglang_quality_eval)."""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.filter.serving_bench import gpu_class, slug
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_quality_eval import (
    baseline_problems,
    check_eval_set,
    eval_set_digest,
)


def rollout_quality_key(host_vars, model: str, default_lane: str = "", deployed_lane: str = "") -> dict:
    """{gpu_class, model, lane, file} of one host: its GPU class as the benchmarks name it (serving_bench_gpu_class,
    else '<GPU name> x<count>' from its gpu_facts), its model (as the disruption budget counts it), its lane and the
    baseline's file name '<class>--<model>--<lane>.json' (each part as a file name: serving_bench_slug).

    The lane is the one the host runs now, before the change: ``deployed_lane`` (the lane of its last-known-good
    manifest, the version its server runs, proven), else the inventory's (ml_env_lock, else
    ``default_lane``). A rollout that changes the lane is judged against the baseline of the lane it leaves: the new
    lane has none yet."""
    hv = host_vars or {}
    facts = (hv.get("ansible_facts") or {}).get("gpu_facts") or {}
    try:
        cls = gpu_class(facts, str(hv.get("serving_bench_gpu_class") or ""))
    except Exception:  # no GPU fact and no override: named as such, the baseline then cannot be found
        cls = "unknown GPU class"
    lane = str(deployed_lane or hv.get("ml_env_lock") or default_lane or "default")
    model = str(model or "default")
    flags = hv.get("sglang_server_flags") or hv.get("sglang_server_inventory_flags") or {}
    nan = flags.get("enable-nan-detection", False) if isinstance(flags, dict) else False
    return {
        "gpu_class": cls,
        "model": model,
        "lane": lane,
        "file": f"{slug(cls)}--{slug(model)}--{slug(lane)}.json",
        # the host's merged flags have enable-nan-detection (SGLang logs NaN logits only then)
        "nan_detection": str(nan).lower() in ("true", "1", "yes", "on"),
    }


def rollout_quality_eval_set_problems(eval_set) -> list:
    """Why an evaluation set cannot be used (schema, items: unique ids, prompts, expected answers, matchers,
    tolerances); [] when it can."""
    return check_eval_set(eval_set)


def rollout_quality_baseline_problems(baseline, key: dict, eval_set: dict, path: str) -> list:
    """Why ``baseline`` (the file's content, {} when missing) cannot judge a run of ``eval_set`` on a host of
    ``key``: missing, not a baseline, another GPU class/model/lane, another evaluation set; [] when it can."""
    return baseline_problems(baseline or {}, key or {}, eval_set_digest(eval_set or {}), path)


class FilterModule:
    def filters(self):
        return {
            "rollout_quality_key": rollout_quality_key,
            "rollout_quality_baseline_problems": rollout_quality_baseline_problems,
            "rollout_quality_eval_set_problems": rollout_quality_eval_set_problems,
        }
