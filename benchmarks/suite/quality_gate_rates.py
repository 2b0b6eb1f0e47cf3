"""The quality gate's error rates (docs/quality-gate.md, "The decision rule and its error rates"): computed exactly for
the default settings, then measured by running the gate many times against simulated engines with planted
degradations of known size.

1. **Computed**: the sequential tests' exact chance of failing a canary (module_utils/quality_sprt.py
   ``Sprt.operating``) at a range of regression rates, for the overall test and one group's, and the gate's bound on
   false rollbacks (the sum over its tests).
2. **Measured**: for each planted fault a lab simulated engine (lab/sglang-sim, on loopback) is started, asked every
   item of the evaluation set once through the gate's own client (``ask_item``: its matchers), and the gate's
   decision (``draw_order`` + ``GateRun``, the module's own functions) is run ``--runs`` times with different seeds on
   those answers. The simulated engine answers deterministically (temperature 0, a fault's items are a fixed set), so
   a replay asks the same questions and gets the same answers as the module would; ``--e2e`` runs per fault check
   that by running the whole module (``run_eval``, over HTTP) with a seed and comparing its verdict with the replay's.
   The size of each degradation is what the engine actually got wrong (its realised share of the items the
   baseline, a healthy engine's run, answered right), overall and per group. Rates come with Wilson 95% intervals.

3. **The logprob comparison, calibrated**: a baseline of the fixed prompts' top-k log-probabilities from a healthy
   simulated engine, then ``--logprob-runs`` runs of the comparison (``ask_logprobs`` + ``compare_logprobs``)
   against a second healthy engine and against engines whose kernel is off by 0.05% to 1% (the simulator's
   ``kernel-perturbation``): the divergence each gives and how often the default bound passes it.

    python benchmarks/suite/quality_gate_rates.py [--runs 2000] [--e2e 20] [--logprob-runs 10]
        [--output benchmarks/results/quality_gate_rates.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "collections", ROOT / "lab" / "sglang-sim" / "src", ROOT / "tests" / "unit" / "sglang_sim"):
    sys.path.insert(0, str(extra))

from ansible_collections.gpufleet.fleet.plugins.module_utils import quality_sprt as sprt  # noqa: E402
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_quality_eval as q  # noqa: E402

EVAL_SET = json.loads((ROOT / "roles/rollout/files/quality_eval/gpufleet-eval-v2.json").read_text())
# (name, the simulator's fault, the group it is confined to or None, the share of that group's items it spoils, what
# it stands for); the fault's SHARE is chosen so that exactly that share of the items goes wrong (share_for)
FAULTS = (
    ("healthy", "", None, 0.0, "the trusted version itself: no item flips"),
    ("noise-1pct", "partial-quality", None, 0.01, "a healthy canary whose run-to-run flips are the default noise"),
    ("noise-2pct", "partial-quality", None, 0.02, "twice the default noise: between the hypotheses"),
    ("drop-5pt", "partial-quality", None, 0.06, "a 5-point drop on top of 1% noise, over every group"),
    ("drop-10pt", "partial-quality", None, 0.11, "a 10-point drop on top of 1% noise"),
    ("multilingual-25pt", "partial-quality-multilingual", "multilingual", 0.26, "a 25-point drop in one group only"),
    ("tool-json-25pt", "partial-quality-tool-json", "tool_json", 0.26, "a 25-point drop in tool-call JSON only"),
    ("non-english-corruption", "non-english-corruption", None, None, "FP4-like: non-English text and tool JSON"),
)


def share_for(target: float, items: list[dict]) -> float:
    """The partial-quality SHARE that spoils exactly round(target * len(items)) of ``items``: the simulator spoils an
    item when its prompt's hash fraction is below SHARE (sglang_sim.quality.degraded)."""
    from sglang_sim.quality import hash_fraction

    fractions = sorted(hash_fraction(i["prompt"]) for i in items)
    k = round(target * len(items))
    return (fractions[k - 1] + fractions[k]) / 2 if 0 < k < len(items) else float(k > 0)


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def computed(settings: sprt.GateSettings) -> dict:
    overall, group = settings.overall(), settings.group(4, 100)
    rates = (0.0, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.11, 0.2, 0.26, 0.5)

    def table(test):
        return {str(r): {k: round(v, 4) for k, v in test.operating(r).items() if k != "pass"} for r in rates}

    bound = q.error_rates(settings, [group] * 4)["false_rollback"]
    return {
        "overall_test": {"healthy_rate": overall.p0, "degraded_rate": round(overall.p1, 4), "alpha": overall.alpha,
                         "beta": overall.beta, "max_items": overall.max_n, "fewest_to_pass": overall.fewest_to_pass(),
                         "fewest_to_fail": overall.fewest_to_fail(), "fail_probability": table(overall)},
        "group_test": {"healthy_rate": group.p0, "degraded_rate": round(group.p1, 4), "alpha": group.alpha,
                       "beta": group.beta, "max_items": group.max_n, "fewest_to_pass": group.fewest_to_pass(),
                       "fewest_to_fail": group.fewest_to_fail(), "fail_probability": table(group)},
        "false_rollback_bound_at_noise": bound,
    }  # fmt: skip


@contextlib.contextmanager
def engine(fault: str, tmp: Path):
    """A simulated engine with ``fault`` on loopback, and the module's options to ask it."""
    from sglang_sim_helpers import Sim

    env = {"SGLANG_SIM_FAULT": fault} if fault else {}
    base = Path(tempfile.mkdtemp(dir=tmp))
    sim = Sim(base, ["--served-model-name", "glm-5"], env, 2)
    sim.start()
    try:
        sim.wait_log("The server is fired up and ready to roll", timeout=60)
        p = {**{k: v.get("default") for k, v in q.EVAL_OPTIONS.items()}, "base_url": f"http://127.0.0.1:{sim.port}",
             "served_name": "glm-5", "eval_set": EVAL_SET, "concurrency": 8}  # fmt: skip
        yield p
    finally:
        sim.stop()


def answers_of(p: dict) -> dict:
    """Every item asked once through the gate's client (a baseline run of the module): {id: result}."""
    return {r["id"]: r for r in q.run_eval(dict(p))["items"]}


def replay(answers: dict, baseline: dict, settings: sprt.GateSettings, seed: str) -> tuple[str, str | None, int]:
    """The gate's decision on these answers with ``seed`` (the module's own draw and feeding, one item at a time):
    (verdict, failed test, items the decision used)."""
    by_group = sprt.available_by_group(EVAL_SET["items"], baseline)
    gate = sprt.GateRun(settings, by_group)
    used = q.ask_in_turn(lambda item: answers[item["id"]], sprt.draw_order(by_group, random.Random(seed)), gate, 1)
    return gate.verdict or gate.finish(), gate.failed_by, len(used)


def logprob_calibration(tmp: Path, runs: int) -> dict:
    """The comparison's divergence against a healthy baseline: a second healthy engine, and kernels off by SIZE."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_http import http

    bound = q.EVAL_OPTIONS["logprob_max_divergence"]["default"]
    top_k = q.EVAL_OPTIONS["logprob_top_k"]["default"]

    def asked(p: dict) -> list[dict]:
        def post(body):
            return http("POST", p["base_url"] + "/v1/chat/completions", body=body, headers={}, timeout=60)

        return [q.ask_logprobs(post, x, "glm-5", top_k) for x in EVAL_SET["logprob_prompts"]]

    with engine("", tmp) as p:
        baseline = asked(p)
    out = {"bound": bound, "top_k": top_k, "prompts": len(EVAL_SET["logprob_prompts"]), "runs": runs, "sizes": []}
    for size in (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01):
        with engine(f"kernel-perturbation={size}" if size else "", tmp) as p:
            found = [q.compare_logprobs(baseline, asked(p), bound) for _ in range(runs)]
        values = sorted(f["divergence"] for f in found)
        row = {"kernel_perturbation": size, "divergence_min": values[0], "divergence_median": values[len(values) // 2],
               "divergence_max": values[-1], "passed": sum(f["ok"] for f in found), "of": runs}  # fmt: skip
        out["sizes"].append(row)
        print(f"kernel off by {size:<7g} divergence {row['divergence_min']}-{row['divergence_max']} "
              f"(median {row['divergence_median']}): passed {row['passed']}/{runs} at the bound {bound}")  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000, help="replays of the gate per planted fault")
    ap.add_argument("--e2e", type=int, default=20, help="whole module runs per fault compared with the replay")
    ap.add_argument("--logprob-runs", type=int, default=10, help="logprob comparisons per kernel perturbation")
    ap.add_argument("--output", default=str(ROOT / "benchmarks/results/quality_gate_rates.json"))
    args = ap.parse_args(argv)
    settings = sprt.GateSettings()
    started = time.monotonic()
    result = {
        "command": f"python benchmarks/suite/quality_gate_rates.py --runs {args.runs} --e2e {args.e2e} "
        f"--logprob-runs {args.logprob_runs}",
        "eval_set": EVAL_SET["name"],
        "items": len(EVAL_SET["items"]),
        "settings": {"noise": settings.noise, "allowed_drop": settings.drop, "group_drop": settings.group_drop,
                     "false_rollback": settings.alpha, "miss": settings.beta, "max_items": settings.max_items},
        "goal": {"false_rollback_at_most": 0.02, "detect_a_drop_of": 0.05, "detection_at_least": 0.95},
        "computed": computed(settings),
        "measured": [],
    }  # fmt: skip
    c = result["computed"]
    print(f"computed: false rollbacks at the noise rate at most {c['false_rollback_bound_at_noise']:.4f}; "
          f"a 5-point drop caught {c['overall_test']['fail_probability']['0.06']['fail']:.4f}; a 25-point drop in "
          f"a group {c['group_test']['fail_probability']['0.26']['fail']:.4f}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        with engine("", Path(tmp)) as p:
            healthy = answers_of(p)
        baseline = {"items": [{"id": i, "ok": r["ok"]} for i, r in healthy.items()], "score": 1.0}
        right = [i for i in EVAL_SET["items"] if healthy[i["id"]]["ok"]]
        for name, kind, group, target, what in FAULTS:
            fault = kind
            if target:
                share = share_for(target, [i for i in right if group in (None, i["group"])])
                fault = f"{kind}={share:.12f}"
            with engine(fault, Path(tmp)) as p:
                answers = answers_of(p)
                realised = {"all": round(sum(not answers[i["id"]]["ok"] for i in right) / len(right), 4)}
                for g in sorted({i["group"] for i in right}):
                    mine = [i for i in right if i["group"] == g]
                    realised[g] = round(sum(not answers[i["id"]]["ok"] for i in mine) / len(mine), 4)
                runs = [replay(answers, baseline, settings, f"bench-{name}-{n}") for n in range(args.runs)]
                # the whole module, over HTTP, with the first seeds: the same verdict, test and item count
                agree = 0
                for n in range(min(args.e2e, args.runs)):
                    out = q.run_eval({**p, "baseline": baseline, "seed": f"bench-{name}-{n}"})
                    agree += (("pass" if out["ok"] else "fail"), out["failed_group"], out["total"]) == runs[n]
            fails = sum(v == "fail" for v, _, _ in runs)
            items = [u for _, _, u in runs]
            by: dict = {}
            for v, f, _ in runs:
                if v == "fail":
                    by[f] = by.get(f, 0) + 1
            row = {"name": name, "fault": fault or "(none)", "what": what, "planted_share": target,
                   "planted_in": group or "every group", "realised_regression_share": realised,
                   "runs": args.runs, "rolled_back": fails, "rollback_rate": round(fails / args.runs, 4),
                   "rollback_rate_95": wilson(fails, args.runs), "failed_by": by,
                   "items_mean": round(statistics.mean(items), 1),
                   "items_p95": sorted(items)[int(0.95 * (len(items) - 1))], "items_max": max(items),
                   "module_runs_agreeing": f"{agree}/{min(args.e2e, args.runs)}"}  # fmt: skip
            result["measured"].append(row)
            print(f"{name:24} realised {realised['all']:.3f}: rolled back {fails}/{args.runs} = {row['rollback_rate']} "
                  f"{row['rollback_rate_95']}, items mean {row['items_mean']} p95 {row['items_p95']}, failed by {by}, "
                  f"module runs agreeing {row['module_runs_agreeing']}")  # fmt: skip
        result["logprob_calibration"] = logprob_calibration(Path(tmp), args.logprob_runs)
    result["seconds"] = round(time.monotonic() - started, 1)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
