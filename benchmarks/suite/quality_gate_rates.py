"""The quality gate's error rates, computed exactly from the binomial distribution (docs/quality-gate.md, "What the
gate can tell"): the gate passes a canary whose score k/n is at least the baseline's score minus the allowed drop
(module_utils/sglang_quality_eval.py `judge`), so with each item answered right with probability p, independently,

    P(pass | p) = sum over k >= k_min of C(n, k) p^k (1 - p)^(n - k),   k_min = ceil(n * (baseline - drop))

For the default settings (the 38 items of gpufleet-eval-v1, allowed drop 0.05) and several baselines this prints how
often a healthy canary is rolled back (its true accuracy equal to the baseline's) and how often a canary 5 points worse
passes; then, for the goal of issue 46 (at most 2% false rollbacks, at least 95% of 5-point drops caught), the fewest
items a fixed-size gate needs at each accuracy, with its pass threshold.

    python benchmarks/suite/quality_gate_rates.py [--items 38] [--drop 0.05]
        [--output benchmarks/results/quality_gate_rates.json]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pass_probabilities(n: int, p: float) -> list[float]:
    """P(score >= k/n) for k = 0..n+1 (the last 0), for items each right with probability p."""
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    tail = [0.0] * (n + 2)
    for k in range(n, -1, -1):
        tail[k] = tail[k + 1] + pmf[k]
    return tail


def current_gate(n: int, baseline_correct: int, drop: float, accuracies: list[float]) -> dict:
    k_min = math.ceil(n * (baseline_correct / n - drop) - 1e-9)
    return {
        "items": n,
        "baseline": f"{baseline_correct}/{n}",
        "pass_at_least": k_min,
        "pass_probability": {str(p): round(pass_probabilities(n, p)[k_min], 4) for p in accuracies},
    }


def fewest_items(p0: float, drop: float, false_rollback: float, detection: float, limit: int = 2000) -> dict | None:
    """The smallest fixed n (and its threshold) that passes accuracy p0 with probability >= 1 - false_rollback and
    accuracy p0 - drop with probability <= 1 - detection."""
    p1 = p0 - drop
    for n in range(10, limit):
        t0, t1 = pass_probabilities(n, p0), pass_probabilities(n, p1)
        for k in range(n, -1, -1):  # the highest threshold that still passes p0 often enough
            if 1 - t0[k] <= false_rollback:
                if 1 - t1[k] >= detection:
                    return {"accuracy": p0, "items": n, "pass_at_least": k,
                            "false_rollback": round(1 - t0[k], 4), "detection": round(1 - t1[k], 4)}  # fmt: skip
                break
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=38)
    ap.add_argument("--drop", type=float, default=0.05)
    ap.add_argument("--output", default=str(ROOT / "benchmarks/results/quality_gate_rates.json"))
    args = ap.parse_args(argv)
    n, drop = args.items, args.drop
    accuracies = [1.0, 0.99, 0.97, 0.95, 0.92, 0.90, 0.85]
    result = {
        "rule": "pass when correct/items >= baseline score - allowed drop (sglang_quality_eval judge)",
        "allowed_drop": drop,
        "current": [current_gate(n, b, drop, accuracies) for b in (n, n - 1, n - 3)],
        "goal": {"false_rollback_at_most": 0.02, "detection_of_a_drop_of": drop, "detection_at_least": 0.95},
        "fewest_items_for_the_goal": [fewest_items(p0, drop, 0.02, 0.95) for p0 in (0.99, 0.97, 0.95, 0.90)],
    }
    for gate in result["current"]:
        print(f"{gate['items']} items, baseline {gate['baseline']}: passes at {gate['pass_at_least']} right;",
              ", ".join(f"p={p}: {v:.3f}" for p, v in gate["pass_probability"].items()))  # fmt: skip
    for need in result["fewest_items_for_the_goal"]:
        print(f"accuracy {need['accuracy']}: {need['items']} items, pass at >= {need['pass_at_least']} right "
              f"(false rollback {need['false_rollback']}, detection {need['detection']})")  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
