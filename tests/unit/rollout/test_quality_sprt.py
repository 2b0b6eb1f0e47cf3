"""The quality gate's decision rule (plugins/module_utils/quality_sprt.py; docs/quality-gate.md, "The decision rule and
its error rates"): Wald's boundaries, the exact error rates of the truncated test against a simulation of it, the
default settings' rates as the documentation states them, the draw order and the run over several groups."""

from __future__ import annotations

import math
import random

import pytest
from ansible_collections.gpufleet.fleet.plugins.module_utils import quality_sprt as s


def test_wald_boundaries_and_the_fewest_items_of_the_reference_example():
    # docs/quality-gate.md: p0 1 %, p1 5 %, alpha 5 %, beta 10 %: 2 regressions within 9 items fail, 55 clean pass
    t = s.Sprt(0.01, 0.05, 0.05, 0.10, 1000)
    assert math.isclose(t.upper, math.log(0.9 / 0.05)) and math.isclose(t.lower, math.log(0.1 / 0.95))
    assert t.fewest_to_pass() == 55
    assert t.decide(9, 2) == "fail" and t.decide(10, 2) is None and t.decide(55, 0) == "pass"


def test_truncation_decides_by_the_sign_of_the_likelihood_ratio():
    t = s.Sprt(0.01, 0.06, 0.01, 0.04, 100)
    assert t.decide(100, 3) == "fail" and t.decide(100, 2) == "pass"
    assert t.llr(100, 3) > 0 > t.llr(100, 2)


@pytest.mark.parametrize("r", [0.01, 0.03, 0.06])
def test_the_exact_rates_agree_with_a_simulation_of_the_test(r):
    t = s.GateSettings().overall()
    exact = t.operating(r)
    rng = random.Random(7)
    runs, fails, items = 20000, 0, 0
    for _ in range(runs):
        n = f = 0
        while True:
            n += 1
            f += rng.random() < r
            verdict = t.decide(n, f)
            if verdict:
                fails += verdict == "fail"
                items += n
                break
    se = math.sqrt(exact["fail"] * (1 - exact["fail"]) / runs)
    assert abs(fails / runs - exact["fail"]) < 4 * se + 1e-3
    assert abs(items / runs - exact["expected_items"]) < 0.05 * exact["expected_items"]
    assert math.isclose(exact["fail"] + exact["pass"], 1.0, abs_tol=1e-9)


def test_the_default_settings_meet_the_goal_the_documentation_states():
    settings = s.GateSettings()
    overall = settings.overall()
    group = settings.group(4, 100)
    healthy = overall.operating(0.01)["fail"] + 4 * group.operating(0.01)["fail"]
    assert healthy <= 0.02  # a healthy canary rolled back at most 2% of the time
    assert overall.operating(0.06)["fail"] >= 0.95  # a 5-point drop caught at least 95% of the time
    assert group.operating(0.26)["fail"] >= 0.95  # a 25-point drop in one group
    assert (overall.fewest_to_pass(), group.fewest_to_pass()) == (62, 12)
    assert overall.operating(0.01)["expected_items"] < 100


def test_the_draw_order_takes_the_groups_in_turn_and_depends_on_the_seed():
    by_group = {g: [{"id": f"{g}-{i}", "group": g} for i in range(5)] for g in ("b", "a", "c")}
    order = s.draw_order(by_group, random.Random("x"))
    assert [i["group"] for i in order[:6]] == ["a", "b", "c", "a", "b", "c"]
    assert sorted(i["id"] for i in order) == sorted(i["id"] for v in by_group.values() for i in v)
    assert order == s.draw_order(by_group, random.Random("x")) != s.draw_order(by_group, random.Random("y"))


def test_a_run_passes_only_when_every_test_passed_and_fails_at_the_first_failure():
    by_group = {g: [{"id": i} for i in range(100)] for g in ("a", "b")}
    run = s.GateRun(s.GateSettings(), by_group)
    for n in range(61):
        assert run.add("ab"[n % 2], False) is None
    assert run.add("a", False) == "pass" and run.decided == {"a": "pass", "b": "pass", "all": "pass"}
    run = s.GateRun(s.GateSettings(), by_group)
    run.add("a", True)
    assert run.add("a", True) == "fail" and run.failed_by == "a"
    assert run.summary()["a"] == {
        "items": 2,
        "regressions": 2,
        "decided_after": 2,
        "regressions_then": 2,
        "verdict": "fail",
        "healthy_rate": 0.01,
        "degraded_rate": 0.26,
        "alpha": 0.005,
        "max_items": 100,
    }


def test_a_group_whose_test_passed_is_not_asked_again_while_the_overall_test_runs():
    run = s.GateRun(s.GateSettings(), {g: [{"id": i} for i in range(100)] for g in ("a", "b")})
    for _ in range(12):
        run.add("a", False)
    assert run.decided == {"a": "pass"}  # the overall test still wants items of every group
    assert run.wanted("a") and run.wanted("b")
    for _ in range(50):
        run.add("b", False)
    assert run.decided.get("all") == "pass" and run.decided.get("b") == "pass" and run.verdict == "pass"
    assert not run.wanted("a") and not run.wanted("b")


def test_settings_out_of_range_are_named():
    assert s.GateSettings(noise=0, alpha=0.6).problems() == [
        "noise (a healthy canary's regression rate) must be in (0, 1), got 0",
        "false_rollback must be in (0, 0.5), got 0.6",
    ]


def test_an_evaluation_set_without_groups_is_one_group_beside_the_overall_test():
    items = [{"id": str(n)} for n in range(100)]
    by_group = s.available_by_group(items, {"items": [{"id": str(n), "ok": True} for n in range(100)]})
    assert list(by_group) == ["items"] and len(by_group["items"]) == 100
    run = s.GateRun(s.GateSettings(), by_group)
    assert set(run.tests) == {"all", "items"} and run.tests["all"].p1 == pytest.approx(0.06)
    for n in range(61):
        assert run.add(s.group_of(items[n]), False) is None
    assert run.add("items", False) == "pass" and run.summary()["all"]["items"] == 62
