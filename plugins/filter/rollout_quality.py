"""Filters of the rollout's quality gate (roles/rollout tasks/quality_*.yml; docs/quality-gate.md): the key of a
host's quality baseline (GPU class, model, lane) with its file name, why a stored baseline cannot judge a run, and
which baselines a baseline run writes from the hosts it scored. The scoring itself is
module_utils/sglang_quality_eval.py's (module sglang_quality_eval)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter.serving_bench import gpu_class, slug
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_quality_eval import (
    EVAL_OPTIONS,
    baseline_problems,
    check_eval_set,
    eval_set_digest,
    gate_problems,
    nan_check_on,
    settings_of,
)

# The sequential test's options (module sglang_quality_eval; the role's rollout_quality_gate_<option>)
GATE_OPTIONS = ("noise", "allowed_drop", "group_drop", "false_rollback", "miss", "max_items")


def baseline_file(gpu_cls: str, model: str, lane: str) -> str:
    """'<class>--<model>--<lane>.json', each part as a file name (serving_bench_slug)."""
    return f"{slug(gpu_cls)}--{slug(model)}--{slug(lane)}.json"


def rollout_quality_key(host_vars, model: str, lane: str = "", deployed_lane: str = "") -> dict:
    """{gpu_class, model, lane, file} of one host: its GPU class as the benchmarks name it (serving_bench_gpu_class,
    else '<GPU name> x<count>' from its gpu_facts), its model (as the disruption budget counts it), its lane and the
    baseline's file name '<class>--<model>--<lane>.json' (each part as a file name: serving_bench_slug).

    The lane is the one the host runs now, before the change: ``deployed_lane`` (the lane of its last-known-good
    manifest, the version its server runs, proven), else ``lane``, the inventory's (ml_env's export,
    ``hostvars[host].ml_env_lane.lock``). A rollout that changes the lane is judged against the baseline of the lane it
    leaves: the new lane has none yet."""
    hv = host_vars or {}
    facts = (hv.get("ansible_facts") or {}).get("gpu_facts") or {}
    try:
        cls = gpu_class(facts, str(hv.get("serving_bench_gpu_class") or ""))
    except Exception:  # no GPU fact and no override: named as such, the baseline then cannot be found
        cls = "unknown GPU class"
    lane = str(deployed_lane or lane or "default")
    model = str(model or "default")
    flags = hv.get("sglang_server_flags") or hv.get("sglang_server_inventory_flags") or {}
    return {
        "gpu_class": cls,
        "model": model,
        "lane": lane,
        "file": baseline_file(cls, model, lane),
        # SGLang logs NaN logits only with enable-nan-detection in the host's merged flags (0.5.9, 0.5.10.post1) or
        # SGLANG_SANITIZE_NAN_LOGITS / SGLANG_ENABLE_NAN_LOGITS_CHECK in its environment (0.5.23)
        "nan_detection": nan_check_on(flags, hv.get("sglang_server_environment")),
    }


def rollout_quality_eval_set_problems(eval_set) -> list:
    """Why an evaluation set cannot be used (schema, items: unique ids, prompts, expected answers, matchers,
    tolerances); [] when it can."""
    return check_eval_set(eval_set)


def rollout_quality_baseline_problems(baseline, key: dict, eval_set: dict, path: str, settings=None) -> list:
    """Why ``baseline`` (the file's content, {} when missing) cannot judge a run of ``eval_set`` on a host of
    ``key``: missing, not a baseline, another GPU class/model/lane, another evaluation set; with the gate's
    ``settings``, settings the sequential test cannot use (each naming its variable rollout_quality_gate_<option>)
    or fewer items answered right, overall or in a group, than the test needs to pass; [] when it can."""
    problems = baseline_problems(baseline or {}, key or {}, eval_set_digest(eval_set or {}), path)
    if problems or settings is None:
        return problems
    values = {k: EVAL_OPTIONS[k]["default"] for k in GATE_OPTIONS}
    values.update({k: v for k, v in settings.items() if k in GATE_OPTIONS})
    try:
        gate = settings_of(values)
    except (TypeError, ValueError) as e:
        return [f"the rollout_quality_gate_* settings must be numbers ({e})"]
    bad = gate.problems()
    if bad:
        return [f"rollout_quality_gate_{p}" for p in bad]
    return [f"{path}: {p}" for p in gate_problems(eval_set or {}, baseline, gate)]


# How a baseline run makes one baseline of the hosts of one GPU class, model and lane
# (rollout_quality_gate_baseline_rule; docs/quality-gate.md, "Writing baselines").
BASELINE_RULES = ("agree", "max", "median")


def _shown(record: dict) -> str:
    return f"{record.get('host')} {float(record.get('score', 0)):.3f} ({record.get('correct')}/{record.get('total')})"


def _missed(record: dict, best: dict, limit: int = 5) -> str:
    """The items ``record`` got wrong that ``best`` got right (at most ``limit``, then how many more)."""
    ok = {i.get("id") for i in best.get("items", []) if i.get("ok")}
    ids = [i.get("id") for i in record.get("items", []) if not i.get("ok") and i.get("id") in ok]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(str(i) for i in ids[:limit]) + more


def rollout_quality_baselines(records, rule: str = "agree") -> dict:
    """The baselines a baseline run writes from the records it measured (module sglang_quality_eval's
    ``baseline_record`` of each host, in inventory order), one per GPU class, model and lane.

    The hosts of one key ran the same engine, model and evaluation set at temperature 0; when their scores differ,
    one of them may be the silent fault the gate is for, and a baseline taken from it lowers the floor of every later
    rollout. ``rule`` says what then happens:

    * ``agree`` (the default): no baseline is written at all; ``refused`` names each disagreeing key, each host's
      score and the items a lower host missed that the best one answered;
    * ``max``: the best host's record (the first in inventory order of the highest score): the strictest floor;
    * ``median``: the record of the median score (of an even count the higher of the two middle ones; the first
      host in inventory order with it).

    With ``max`` and ``median`` a disagreement is written anyway and named in ``warnings``. Every written record
    gets ``hosts`` ({host: score} of its key) and ``baseline_rule``. Returns ``{write: [{file, record}], refused:
    [str], warnings: [str]}``."""
    if rule not in BASELINE_RULES:
        raise AnsibleFilterError(
            f"rollout_quality_gate_baseline_rule={rule!r}: choose one of {', '.join(BASELINE_RULES)} "
            "(docs/quality-gate.md, 'Writing baselines')"
        )
    groups: dict[tuple, list[dict]] = {}
    for record in records or []:
        groups.setdefault((record.get("gpu_class"), record.get("model"), record.get("lane")), []).append(record)
    write, refused, warnings = [], [], []
    for (cls, model, lane), group in groups.items():
        by_score = sorted(group, key=lambda r: float(r.get("score", 0)))  # stable: inventory order among equals
        best = next(r for r in group if float(r.get("score", 0)) == float(by_score[-1].get("score", 0)))
        scores = ", ".join(_shown(r) for r in group)
        disagree = len({float(r.get("score", 0)) for r in group}) > 1
        lower = "; ".join(
            f"{r.get('host')} missed {_missed(r, best)}"
            for r in group
            if float(r.get("score", 0)) < float(best.get("score", 0)) and _missed(r, best)
        )
        lower = f" ({lower}, which {best.get('host')} answered)" if lower else ""
        where = f"{cls}, {model}, {lane}"
        if disagree and rule == "agree":
            refused.append(f"{where}: the hosts disagree: {scores}{lower}")
            continue
        chosen = best
        if rule == "median":
            median = float(by_score[len(by_score) // 2].get("score", 0))
            chosen = next(r for r in group if float(r.get("score", 0)) == median)
        if disagree:
            warnings.append(
                f"{where}: the hosts disagree: {scores}{lower}; the baseline is {_shown(chosen)} "
                f"(rollout_quality_gate_baseline_rule={rule})"
            )
        hosts = {str(r.get("host")): r.get("score") for r in group}
        write.append(
            {"file": baseline_file(cls, model, lane), "record": {**chosen, "hosts": hosts, "baseline_rule": rule}}
        )
    if refused:
        write = []
    return {"write": write, "refused": refused, "warnings": warnings}


class FilterModule:
    def filters(self):
        return {
            "rollout_quality_key": rollout_quality_key,
            "rollout_quality_baseline_problems": rollout_quality_baseline_problems,
            "rollout_quality_eval_set_problems": rollout_quality_eval_set_problems,
            "rollout_quality_baselines": rollout_quality_baselines,
        }
