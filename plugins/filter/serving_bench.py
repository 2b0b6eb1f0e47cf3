"""Filters of the serving_bench role: configuration identity, GPU class, baseline comparison, gate, ranking."""

from __future__ import annotations

import hashlib
import json
import re
import shlex

from ansible.errors import AnsibleFilterError


def unit_config(unit_text: str) -> dict:
    """What defines a server's configuration, read from its installed systemd unit.

    ``ExecStart`` (the release's python, the module and every flag) and the ``Environment=`` assignments (NCCL,
    CUDA_HOME, the role's and the inventory's variables). Secrets live in the EnvironmentFile, not here.
    """
    if not unit_text or "ExecStart=" not in unit_text:
        raise AnsibleFilterError("serving_bench: the unit has no ExecStart= (is the server deployed?)")
    lines, joined = [], ""
    for raw in unit_text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        lines.append(joined + line)
        joined = ""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in lines:
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart=") :])
        elif line.startswith("Environment="):
            for item in shlex.split(line[len("Environment=") :]):
                key, _sep, value = item.partition("=")
                env[key] = value
    release = next((a.rsplit("/bin/", 1)[0] for a in argv if "/bin/python" in a), "")
    return {"argv": argv, "environment": env, "release": release}


def config_hash(config: dict) -> str:
    """16 hex digits of the sha256 of the configuration (flags + environment + release), canonical JSON."""
    canon = json.dumps(
        {
            "argv": config.get("argv", []),
            "environment": config.get("environment", {}),
            "release": config.get("release"),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def gpu_class(gpu_facts: dict | None, override: str = "") -> str:
    """The host's GPU class: the override, else '<name> x<count>' from ansible_facts.gpu_facts."""
    if override:
        return str(override)
    gpus = (gpu_facts or {}).get("gpus") or []
    if not gpus:
        raise AnsibleFilterError(
            "serving_bench: no GPUs in ansible_facts.gpu_facts to name the GPU class; run the gpu_facts role "
            "first or set serving_bench_gpu_class"
        )
    names = sorted({str(g.get("name", "?")) for g in gpus})
    return f"{' + '.join(names)} x{len(gpus)}"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-").lower() or "unknown"


def _at(results: list[dict], concurrency: int) -> dict | None:
    return next((r for r in results or [] if int(r.get("max_concurrency", -1)) == int(concurrency)), None)


def compare(results: list[dict], baseline: dict | None, metric: str = "output_throughput") -> list[dict]:
    """Per concurrency: this run's metric, the baseline's, and the change in percent (negative: slower)."""
    base_results = (baseline or {}).get("results", [])
    out = []
    for r in results or []:
        b = _at(base_results, r.get("max_concurrency"))
        value, ref = r.get(metric), (b or {}).get(metric)
        delta = None
        if isinstance(value, (int, float)) and isinstance(ref, (int, float)) and ref > 0:
            delta = round((value - ref) / ref * 100.0, 1)
        out.append({"max_concurrency": r.get("max_concurrency"), "value": value, "baseline": ref, "delta_pct": delta})
    return out


def gate(
    run: dict,
    baseline: dict | None,
    concurrency: int,
    max_regression_pct: float,
    metric: str = "output_throughput",
    require_baseline: bool = True,
) -> dict:
    """The canary gate's verdict: ok, and a reason a person can act on."""
    host = run.get("host", "?")
    cls = run.get("gpu_class", "?")
    out = {
        "host": host,
        "gpu_class": cls,
        "metric": metric,
        "concurrency": int(concurrency),
        "max_regression_pct": float(max_regression_pct),
        "config_hash": run.get("config_hash"),
        "baseline_host": (baseline or {}).get("host"),
        "baseline_config_hash": (baseline or {}).get("config_hash"),
    }
    mine = _at(run.get("results", []), concurrency)
    if mine is None or not isinstance(mine.get(metric), (int, float)):
        return out | {
            "ok": False,
            "reason": f"{host}: no {metric} measured at concurrency {concurrency} (serving_bench_gate_concurrency "
            "must be one of serving_bench_concurrencies, and the run must succeed)",
        }
    if mine.get("failed"):
        return out | {
            "ok": False,
            "value": mine[metric],
            "reason": f"{host}: {mine['failed']} of {mine.get('num_prompts')} requests failed at concurrency "
            f"{concurrency}: {mine.get('error') or 'see the bench log'}",
        }
    ref = _at((baseline or {}).get("results", []), concurrency)
    if ref is None or not isinstance(ref.get(metric), (int, float)) or ref[metric] <= 0:
        reason = (
            f"{host}: no baseline for GPU class '{cls}' at concurrency {concurrency}; record one on a known-good "
            "host with playbooks/bench.yml -e serving_bench_save_baseline=true"
        )
        return out | {"ok": not require_baseline, "value": mine[metric], "baseline": None, "reason": reason}
    delta = (mine[metric] - ref[metric]) / ref[metric] * 100.0
    ok = delta >= -float(max_regression_pct)
    word = "below" if delta < 0 else "above"
    reason = (
        f"{host}: {metric} at concurrency {concurrency} is {mine[metric]:.2f}, {abs(delta):.1f}% {word} the "
        f"baseline {ref[metric]:.2f} of GPU class '{cls}' (allowed: {float(max_regression_pct):g}% below)"
    )
    return out | {
        "ok": ok,
        "value": mine[metric],
        "baseline": ref[metric],
        "delta_pct": round(delta, 1),
        "reason": reason,
    }


def rank(variants: list[dict], concurrency: int, metric: str = "output_throughput") -> list[dict]:
    """Tuning variants, best first by metric at concurrency; a variant that failed ranks last."""

    def key(v: dict):
        r = _at(v.get("results", []), concurrency) or {}
        value = r.get(metric)
        good = isinstance(value, (int, float)) and not r.get("failed") and v.get("ok", True)
        return (0 if good else 1, -(value or 0.0))

    ranked = sorted(variants, key=key)
    out = []
    for i, v in enumerate(ranked, 1):
        r = _at(v.get("results", []), concurrency) or {}
        out.append(v | {"rank": i, "score": r.get(metric), "score_failed": r.get("failed")})
    return out


def input_problems(v: dict) -> list[str]:
    """Problems with the role's inputs, each naming the variable and the fix."""
    problems = []
    conc = v.get("serving_bench_concurrencies")
    if not isinstance(conc, list) or not conc or not all(isinstance(c, int) and c > 0 for c in conc):
        problems.append(f"serving_bench_concurrencies must be a non-empty list of positive integers, got {conc!r}")
    for name in ("serving_bench_input_len", "serving_bench_output_len", "serving_bench_prompts_per_concurrency"):
        if not isinstance(v.get(name), int) or v.get(name) <= 0:
            problems.append(f"{name} must be a positive integer, got {v.get(name)!r}")
    pct = v.get("serving_bench_gate_max_regression_pct")
    if not isinstance(pct, (int, float)) or not 0 <= pct < 100:
        problems.append(f"serving_bench_gate_max_regression_pct must be a number in [0, 100), got {pct!r}")
    metric = v.get("serving_bench_gate_metric")
    if metric not in ("output_throughput", "total_throughput", "request_throughput"):
        problems.append(
            "serving_bench_gate_metric must be output_throughput, total_throughput or request_throughput, "
            f"got {metric!r}"
        )
    if v.get("serving_bench_backend") not in ("sglang", "sglang-native", "sglang-oai"):
        problems.append(
            f"serving_bench_backend must be sglang, sglang-native or sglang-oai, got {v.get('serving_bench_backend')!r}"
        )
    return problems


class FilterModule:
    def filters(self):
        return {
            "serving_bench_unit_config": unit_config,
            "serving_bench_config_hash": config_hash,
            "serving_bench_gpu_class": gpu_class,
            "serving_bench_slug": slug,
            "serving_bench_compare": compare,
            "serving_bench_gate": gate,
            "serving_bench_rank": rank,
            "serving_bench_input_problems": input_problems,
        }
