"""The rollout's quality gate (docs/quality-gate.md): the evaluation set in the repository (generated, deterministic,
usable, four groups), the normaliser and matchers (exact with its script, numeric, a tool call's JSON), the verdict
of the sequential test against a baseline (what the refusal says), the baseline's checks and key (filters), and the
module sglang_quality_eval run in-process (its main(), as Ansible runs it) against the lab's simulated engine on
loopback: healthy, partial-quality over all groups and in one, non-English corruption, wrong-answer, nan-output, an
API key."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.gpufleet.fleet.plugins.filter.rollout_quality import (
    rollout_quality_baseline_problems,
    rollout_quality_eval_set_problems,
    rollout_quality_key,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_quality_eval as q

REPO = Path(__file__).resolve().parents[3]
EVAL_DIR = REPO / "roles" / "rollout" / "files" / "quality_eval"
EVAL_SET = json.loads((EVAL_DIR / "gpufleet-eval-v2.json").read_text())
KEY = {"gpu_class": "NVIDIA RTX PRO 6000 Blackwell Server Edition x2", "model": "glm-5", "lane": "lab-sim"}
API_KEY = "quality-Key-0042 #x"


# ---------------------------------------------------------------- the evaluation set


def test_the_evaluation_set_is_the_generators_output_and_usable():
    proc = subprocess.run([sys.executable, str(EVAL_DIR / "generate.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert q.check_eval_set(EVAL_SET) == []
    items = EVAL_SET["items"]
    groups = {g: [i for i in items if i["group"] == g] for g in ("arithmetic", "facts", "multilingual", "tool_json")}
    assert {i["group"] for i in items} == set(groups) and all(len(v) == 100 for v in groups.values())
    kinds = {i["id"].rsplit("-", 1)[0] for i in items}
    assert kinds == {"arith", "weekday", "date", "capital", "convert", "reason", "weekday-lang", "month-lang", "tool"}
    assert {i["match"] for i in items} == {"exact", "numeric", "json"}
    assert len({i["prompt"] for i in items}) == len(items)
    assert all("only" in i["prompt"] for i in items)  # each asks for a short answer
    # the multilingual answers are in their script; the tool calls' expected arguments validate against the schema
    assert {i["script"] for i in groups["multilingual"]} == {"latin", "cyrillic", "greek", "han"}
    assert all(q.script_problem(i["expected"], i["script"]) == "" for i in groups["multilingual"])
    assert all(q.schema_problems(i["expected"]["arguments"], i["schema"]) == [] for i in groups["tool_json"])
    # the gate can pass on it: every group holds more items than its test needs
    assert q.gate_problems(EVAL_SET, {"items": [{"id": i["id"], "ok": True} for i in items]}, q.GateSettings()) == []


def test_a_bad_evaluation_set_is_refused_naming_each_problem():
    bad = {
        "schema": "gpufleet.quality_eval/v1",
        "name": "bad",
        "items": [
            {"id": "a", "prompt": "What is 1 + 1?", "expected": 2, "match": "numeric"},
            {"id": "a", "prompt": "x", "expected": "y"},
            {"id": "b", "prompt": "", "expected": "y", "match": "fuzzy"},
            {"id": "c", "prompt": "x", "expected": "two", "match": "numeric", "tolerance": -1},
            {"id": "d", "prompt": "x"},
            {"id": "e", "prompt": "x", "expected": "y", "script": "klingon", "group": 3},
            {"id": "f", "prompt": "x", "expected": {"name": "t"}, "match": "json"},
        ],
    }
    assert rollout_quality_eval_set_problems(bad) == [
        "item a: duplicate id",
        "item b has no prompt",
        "item b: unknown matcher 'fuzzy' (known: exact, numeric, json)",
        "item c: numeric expected answer 'two' is not a number",
        "item c: tolerance must be a number >= 0 (got -1)",
        "item d has no expected answer",
        "item e: unknown script 'klingon' (known: latin, cyrillic, greek, han)",
        "item e: group must be a string",
        "item f: a json item's expected answer is {name, arguments} (got {'name': 't'})",
    ]
    assert rollout_quality_eval_set_problems({}) == [
        "schema is None, expected 'gpufleet.quality_eval/v1'",
        "the evaluation set has no name",
        "the evaluation set has no items",
    ]


# ---------------------------------------------------------------- normalising and matching


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("Friday", True),
        ("friday.", True),
        ("**Friday**", True),
        ('"Friday"', True),
        ("Answer: Friday", True),
        ("Friday\n\nIt was a Friday because ...", True),
        ("It was a Friday.", False),  # exact: the answer, not a sentence that contains it
        ("Thursday", False),
        ("", False),
    ],
)
def test_the_exact_matcher(answer, ok):
    assert q.matches({"expected": "Friday", "match": "exact"}, answer) is ok


def test_the_exact_matcher_takes_aliases():
    item = {"expected": "Brasília", "match": "exact", "aliases": ["Brasilia"]}
    assert q.matches(item, "Brasilia") and q.matches(item, "brasília.") and not q.matches(item, "Rio de Janeiro")


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("52290", True),
        ("52,290", True),
        ("The answer is 52290.", True),
        ("52290.0", True),
        ("52291", False),
        ("fifty-two thousand", False),
        ("!!!!!!!!", False),
    ],
)
def test_the_numeric_matcher(answer, ok):
    assert q.matches({"expected": 52290, "match": "numeric"}, answer) is ok


@pytest.mark.parametrize(
    ("answer", "ok", "why"),
    [
        ("понедельник", True, ""),
        ("Понедельник.", True, ""),
        ("пoнeдeльник", False, "a script mix-up: Latin letters in an answer expected in Cyrillic"),
        ("понед\ufffdльник", False, "a replacement character (U+FFFD) in the answer"),
        ("вторник", False, ""),
    ],
)
def test_the_exact_matcher_names_a_replacement_character_or_a_script_mix_up(answer, ok, why):
    item = {"expected": "понедельник", "match": "exact", "script": "cyrillic"}
    assert q.check_answer(item, answer) == (ok, why)
    assert q.check_answer({"expected": "月曜日", "script": "han"}, "月曜日a") == (
        False,
        "a script mix-up: Latin letters in an answer expected in Han",
    )


TOOL = {
    "match": "json",
    "expected": {"name": "set_timer", "arguments": {"minutes": 25, "label": "thé", "repeat": False}},
    "schema": {
        "type": "object",
        "properties": {"minutes": {"type": "integer"}, "label": {"type": "string"}, "repeat": {"type": "boolean"}},
        "required": ["minutes", "label", "repeat"],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize(
    ("answer", "ok", "why"),
    [
        ('{"name": "set_timer", "arguments": {"minutes": 25, "label": "thé", "repeat": false}}', True, ""),
        (
            '```json\n{"name": "set_timer", "arguments": {"label": "thé", "minutes": 25, "repeat": false}}\n```',
            True,
            "",
        ),
        ('{"name": "set_timer", "arguments": {"minutes": 25.0, "label": "the\u0301", "repeat": false}}', True, ""),
        ('{"name: "set_timer", "arguments": {}}', False, "not a JSON object (Expecting ':' delimiter: line 1"),
        ('{"name": "get_weather", "arguments": {}}', False, "called 'get_weather', not 'set_timer'"),
        (
            '{"name": "set_timer", "arguments": {"minutes": "25", "label": "thé", "repeat": false, "x": 1}}',
            False,
            "the arguments break the tool's schema: arguments.x: not a parameter of the tool; arguments.minutes: "
            "'25' is not of type integer",
        ),
        (
            '{"name": "set_timer", "arguments": {"minutes": 25, "label": "th\ufffd", "repeat": false}}',
            False,
            "the arguments differ from the requested ones",
        ),
        ("", False, "not a JSON object (no JSON object in the answer)"),
    ],
)
def test_the_json_matcher_parses_the_call_and_checks_it_against_its_schema(answer, ok, why):
    got_ok, got_why = q.check_answer(TOOL, answer)
    assert got_ok is ok and got_why.startswith(why), got_why


def test_the_numeric_matcher_with_a_tolerance():
    item = {"expected": 42.165, "match": "numeric", "tolerance": 0.01}
    assert q.matches(item, "42.1648") and q.matches(item, "about 42.17 km") and not q.matches(item, "42.2")


# ---------------------------------------------------------------- score and verdict


BASELINE = {
    "schema": q.BASELINE_SCHEMA,
    **KEY,
    "score": 1.0,
    "correct": 400,
    "total": 400,
    "written_at": "2026-12-07T06:00:00Z",
    "host": "t-01",
    "eval_set_sha256": q.eval_set_digest(EVAL_SET),
    "items": [{"id": i["id"], "ok": True} for i in EVAL_SET["items"]],
}


def feed(answers: list[tuple[str, bool]]):
    """A GateRun over the evaluation set's groups fed (group, regression) answers in order, and the results."""
    gate = q.GateRun(q.GateSettings(), q.available_by_group(EVAL_SET["items"], BASELINE))
    results = []
    for n, (group, regression) in enumerate(answers):
        gate.add(group, regression)
        results.append({"id": f"{group}-{n:03d}", "group": group, "prompt": f"p{n}", "expected": n,
                        "got": "?" if regression else str(n), "ok": not regression})  # fmt: skip
        if gate.verdict:
            break
    return gate, results


GROUPS = ("arithmetic", "facts", "multilingual", "tool_json")


def test_a_clean_run_passes_once_every_test_has_passed_naming_the_error_rates():
    gate, results = feed([(GROUPS[n % 4], False) for n in range(200)])
    # the overall test needs 62 clean items (GateSettings: noise 0.01, drop 0.05, alpha 0.02/2, beta 0.04)
    assert gate.verdict == "pass" and len(results) == 62
    verdict = q.judge({"items": results}, BASELINE, gate)
    assert verdict["ok"] is True and verdict["score"] == 1.0 and verdict["failed_group"] is None
    assert verdict["reason"].startswith(
        "passed the sequential test after 62 items: 0 regressions in items the baseline answered right (by group: "
        "arithmetic 0/16, facts 0/16, multilingual 0/15, tool_json 0/15); baseline 1.000 (400/400, "
        "2026-12-07T06:00:00Z, host t-01); the test: a healthy canary rolled back at most "
    )
    rates = verdict["rates"]
    assert rates["false_rollback"] <= 0.02 and rates["detection"] >= 0.95 and rates["group_detection"] >= 0.95
    assert verdict["decision"]["all"]["verdict"] == "pass"


def test_a_regression_confined_to_one_group_fails_its_test_naming_the_group_and_the_worst_items():
    answers = [(g, g == "multilingual" and n % 2 == 0) for n in range(40) for g in GROUPS]
    gate, results = feed(answers)
    assert gate.verdict == "fail" and gate.failed_by == "multilingual"
    results[-1]["why"] = "a script mix-up: Latin letters in an answer expected in Cyrillic"
    verdict = q.judge({"items": results}, BASELINE, gate, worst_limit=2)
    assert verdict["ok"] is False and verdict["failed_group"] == "multilingual"
    assert verdict["reason"].startswith(
        "the sequential test for a 25-point drop in group multilingual failed it: 2 regressions in 3 items the "
        "baseline answered right (by group: arithmetic 0/3, facts 0/3, multilingual 2/3, tool_json 0/2)"
    )
    assert "(a script mix-up: Latin letters in an answer expected in Cyrillic)" in verdict["reason"]
    assert [w["group"] for w in verdict["worst"]] == ["multilingual", "multilingual"]


def test_a_uniform_drop_fails_the_overall_test():
    # one regression in every 13 items, spread over the groups: no group's test fails first
    gate, results = feed([(GROUPS[n % 4], n % 13 == 12) for n in range(240)])
    assert gate.verdict == "fail" and gate.failed_by == "all"
    verdict = q.judge({"items": results}, BASELINE, gate)
    assert verdict["reason"].startswith("the sequential test for a 5-point drop over all groups failed it: ")


def test_nan_lines_fail_the_verdict_whatever_the_answers():
    line = "[2026-12-05 06:00:01 TP0] Detected errors during sampling! NaN in the logits."
    gate, results = feed([(GROUPS[n % 4], False) for n in range(200)])
    verdict = q.judge({"items": results, "nan_detection": True, "nan_lines": [line]}, BASELINE, gate)
    assert verdict["ok"] is False and verdict["score"] == 1.0
    assert f"1 NaN line(s) in the engine's journal since its start, first: {line}" in verdict["reason"]


def test_without_a_baseline_the_run_is_measured_only():
    results = [{"id": str(n), "ok": n != 0} for n in range(4)]
    verdict = q.judge({"items": results}, {})
    assert verdict["ok"] is None and verdict["score"] == 0.75 and verdict["reason"] == "score 0.750 measured (4 items)"


def test_a_baseline_too_thin_for_the_test_is_refused_naming_the_group():
    thin = {**BASELINE, "items": [{"id": i["id"], "ok": i["group"] != "tool_json" or i["id"] < "tool-006"}
                                  for i in EVAL_SET["items"]]}  # fmt: skip
    assert q.gate_problems(EVAL_SET, thin, q.GateSettings()) == [
        "group tool_json: the baseline answered 5 items right; its test needs 12"
    ]
    assert q.gate_problems(EVAL_SET, BASELINE, q.GateSettings(noise=0.2, drop=0.9)) == [
        "allowed_drop must be in (0, 1 - noise), got 0.9"
    ]


def test_a_baseline_that_cannot_judge_the_run_is_named():
    path = "/b/x.json"
    assert rollout_quality_baseline_problems({}, KEY, EVAL_SET, path) == ["no quality baseline at /b/x.json"]
    assert rollout_quality_baseline_problems({"score": 1}, KEY, EVAL_SET, path) == [
        "/b/x.json is not a quality baseline (schema gpufleet.quality_baseline/v1)"
    ]
    other = {**BASELINE, "lane": "sglang-cu128", "eval_set": "old", "eval_set_sha256": "0" * 64}
    assert rollout_quality_baseline_problems(other, KEY, EVAL_SET, path) == [
        "/b/x.json is the baseline of lane 'sglang-cu128', not 'lab-sim'",
        f"/b/x.json was measured with another evaluation set (old sha256 000000000000, now "
        f"{q.eval_set_digest(EVAL_SET)[:12]}): write it again",
    ]
    assert rollout_quality_baseline_problems(BASELINE, KEY, EVAL_SET, path) == []


def test_the_key_of_a_host_names_its_class_model_and_lane():
    facts = {"gpu_facts": {"gpu_count": 2, "gpus": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]}}
    hv = {"ansible_facts": facts, "sglang_server_flags": {"enable-nan-detection": True}}
    key = rollout_quality_key(hv, "glm-5", "sglang-cu130")  # the lane as ml_env exports it (ml_env_lane.lock)
    assert key == {
        "gpu_class": "NVIDIA H200 x2",
        "model": "glm-5",
        "lane": "sglang-cu130",
        "file": "nvidia-h200-x2--glm-5--sglang-cu130.json",
        "nan_detection": True,
    }
    # the benchmarks' class override wins; no NaN flag
    key = rollout_quality_key({"serving_bench_gpu_class": "My Class x8"}, "qwen3", "sglang-cu128")
    assert key["file"] == "my-class-x8--qwen3--sglang-cu128.json" and key["nan_detection"] is False


def test_nan_detection_is_the_flag_on_0_5_9_and_an_environment_variable_on_0_5_23():
    hv = {"serving_bench_gpu_class": "X x8", "sglang_server_environment": {"SGLANG_SANITIZE_NAN_LOGITS": "1"}}
    assert rollout_quality_key(hv, "glm-5", "sglang-cu130")["nan_detection"] is True
    assert q.nan_check_on({}, {"SGLANG_ENABLE_NAN_LOGITS_CHECK": "yes"}) is True  # EnvBool: true/1/yes/y
    assert q.nan_check_on({}, {"SGLANG_SANITIZE_NAN_LOGITS": "on"}) is False  # not a word EnvBool takes
    assert q.nan_check_on({"enable-nan-detection": "true"}, {}) is True
    assert q.nan_check_on({}, {"SGLANG_SANITIZE_NAN_LOGITS": "0", "SGLANG_SPEC_NAN_DETECTION": "1"}) is False
    assert q.nan_check_on(None, None) is False


@pytest.mark.parametrize(
    "line",
    [
        # 0.5.9 layers/sampler.py:67
        "[2026-12-05 06:00:01 TP0] Detected errors during sampling! NaN in the logits.",
        # 0.5.23 utils/async_probe.py:40-46 (SGLANG_SANITIZE_NAN_LOGITS)
        "[2026-12-07 12:00:01 TP0] NaN detected in sampler: next_token_logits; values were sanitized before sampling. "
        "This usually indicates numerical overflow (e.g. fp16 activations) or an upstream bug producing NaN. Logged "
        "once; further occurrences are silent.",
        # 0.5.23 utils/async_probe.py:118-159 (SGLANG_ENABLE_NAN_LOGITS_CHECK), in the scheduler's traceback
        "Assertion `NaN detected! sampler: next_token_logits` failed.",
    ],
)
def test_every_versions_nan_line_is_found(line):
    assert any(re.search(p, line) for p in q.NAN_PATTERNS)


def test_the_units_environment_is_read_from_systemd():
    def runner(argv):
        assert argv == ["systemctl", "show", "-p", "Environment", "--value", "sglang-server.service"]
        return 0, 'SGLANG_SANITIZE_NAN_LOGITS=1 "NCCL_DEBUG=WARN" CUDA_VISIBLE_DEVICES=0,1\n', ""

    env = q.unit_environment("sglang-server.service", runner)
    assert env == {"SGLANG_SANITIZE_NAN_LOGITS": "1", "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert q.unit_environment("x.service", lambda argv: (1, "", "no such unit")) == {}


# ---------------------------------------------------------------- the module against the simulated engine


@pytest.fixture
def serve(tmp_path):
    from sglang_sim_helpers import Sim

    sims = []

    def _serve(fault=None, args=()):
        env = {"SGLANG_SIM_FAULT": fault} if fault else {}
        base = tmp_path / f"sim{len(sims)}"
        base.mkdir()
        sim = Sim(base, ["--served-model-name", "glm-5", "--reasoning-parser", "glm45", *args], env, 2)
        sims.append(sim)
        sim.start()
        sim.wait_log("The server is fired up and ready to roll", timeout=30)
        return sim

    yield _serve
    for sim in sims:
        sim.stop()


def eval_args(sim, **extra):
    return {
        "base_url": f"http://127.0.0.1:{sim.port}",
        "served_name": "glm-5",
        "eval_set": EVAL_SET,
        "reasoning_parser": "glm45",
        "concurrency": 16,
        "timeout": 30,
        "key": KEY,
        "host": "t-01",
        **extra,
    }


def test_a_healthy_engine_answers_every_item_and_makes_a_baseline(serve, run_module):
    sim = serve()
    result, failed = run_module("sglang_quality_eval", eval_args(sim))
    assert not failed, result
    assert result["score"] == 1.0 and result["correct"] == result["total"] == len(EVAL_SET["items"])
    assert result["ok"] is None and result["errors"] == 0 and result["simulator"] is True
    assert result["nan_detection"] is False
    record = result["baseline_record"]
    assert {k: record[k] for k in ("schema", "gpu_class", "model", "lane", "host", "score")} == {
        "schema": q.BASELINE_SCHEMA,
        **KEY,
        "host": "t-01",
        "score": 1.0,
    }
    assert q.baseline_problems(record, KEY, q.eval_set_digest(EVAL_SET), "b.json") == []
    # judged against its own baseline it passes after the fewest items the test allows (62 with 8 in flight at the
    # decision, not counted), drawn at random from every group; the same seed draws the same items
    again, failed = run_module("sglang_quality_eval", eval_args(sim, baseline=record, seed="run-1"))
    assert not failed and again["ok"] is True and again["total"] == 62 and again["seed"] == "run-1"
    assert {r["group"] for r in again["items"]} == {"arithmetic", "facts", "multilingual", "tool_json"}
    assert all(r.get("counted", True) is False for r in again["items"][62:])
    same, _ = run_module("sglang_quality_eval", eval_args(sim, baseline=record, seed="run-1"))
    other, _ = run_module("sglang_quality_eval", eval_args(sim, baseline=record, seed="run-2"))
    counted = [[r["id"] for r in x["items"][:62]] for x in (again, same, other)]
    assert counted[0] == counted[1] != counted[2]


def test_a_partial_quality_drop_fails_against_the_baseline_naming_the_worst_items(serve, run_module):
    from sglang_sim.quality import degraded

    sim = serve("partial-quality=0.5")
    result, failed = run_module("sglang_quality_eval", eval_args(sim, baseline=BASELINE, worst=3))
    assert not failed, result
    counted = [r for r in result["items"] if r.get("counted", True)]
    wrong = sorted(r["id"] for r in counted if degraded(r["prompt"], 0.5))
    assert wrong and sorted(r["id"] for r in counted if not r["ok"]) == wrong
    assert result["ok"] is False and result["total"] == len(counted) < 20
    assert result["reason"].startswith("the sequential test for a ")
    worst = result["worst"]
    assert len(worst) == 3 and [w["id"] for w in worst] == wrong[:3]
    for w in worst:
        item = next(i for i in EVAL_SET["items"] if i["id"] == w["id"])
        assert w["prompt"] == item["prompt"] and w["expected"] == item["expected"] and w["got"]
        assert f"[{w['id']}] {w['prompt'][:100]!r}: expected {w['expected']!r}, got {w['got']!r}" in result["reason"]


@pytest.mark.parametrize(
    ("fault", "groups"),
    [("partial-quality-facts=0.5", {"facts"}), ("non-english-corruption", {"multilingual", "tool_json"})],
)
def test_a_loss_confined_to_one_group_is_caught_by_its_groups_test(serve, run_module, fault, groups):
    sim = serve(fault)
    result, failed = run_module("sglang_quality_eval", eval_args(sim, baseline=BASELINE, seed="s"))
    assert not failed, result
    assert result["ok"] is False and result["failed_group"] in groups, result["reason"]
    counted = [r for r in result["items"] if r.get("counted", True)]
    assert {r["group"] for r in counted if not r["ok"]} <= groups
    assert f"drop in group {result['failed_group']} failed it: " in result["reason"]
    if fault == "non-english-corruption":
        assert all(r["why"] for r in counted if not r["ok"])  # a replacement character, a script mix-up, bad JSON


def test_a_second_run_of_the_trusted_version_passes_the_logprob_comparison_and_a_perturbed_kernel_fails_it(
    serve, run_module
):
    healthy = serve()
    result, failed = run_module("sglang_quality_eval", eval_args(healthy))
    assert not failed, result
    record = result["baseline_record"]
    prompts = EVAL_SET["logprob_prompts"]
    assert [x["id"] for x in record["logprobs"]] == [x["id"] for x in prompts]
    assert all(len(x["top"]) == len(x["tokens"]) > 0 and len(x["top"][0]) == 5 for x in record["logprobs"])
    again, _ = run_module("sglang_quality_eval", eval_args(healthy, baseline=record, seed="a"))
    lp = again["logprob"]
    # the simulator's run-to-run noise (0.002 per logit) stays far below the bound (0.02)
    assert again["ok"] is True and lp["ok"] is True and lp["divergence"] < 0.005 and lp["parted"] == []
    assert f"logprobs against the baseline: divergence {lp['divergence']} over " in again["reason"]
    # every answer still right, the log-probabilities off: a kernel that computes 1% differently
    perturbed = serve("kernel-perturbation=0.01")
    out, _ = run_module("sglang_quality_eval", eval_args(perturbed, baseline=record, seed="a"))
    assert out["failed_group"] is None and out["decision"]["all"]["verdict"] == "pass"
    assert out["ok"] is False and out["logprob"]["ok"] is False and out["logprob"]["divergence"] > 0.05
    assert ": FAILED (the engine computes differently from its baseline)" in out["reason"]


def test_the_logprobs_of_another_engine_version_are_reported_not_judged(serve, run_module):
    sim = serve("kernel-perturbation=0.01")
    record, _ = run_module("sglang_quality_eval", eval_args(serve()))
    baseline = {**record["baseline_record"], "engine_version": "0.5.9"}
    out, _ = run_module("sglang_quality_eval", eval_args(sim, baseline=baseline, seed="a"))
    assert out["ok"] is True and out["logprob"]["ok"] is False
    assert f"not judged: the baseline's engine is 0.5.9, the canary's {out['engine_version']}" in out["reason"]
    older = {**record["baseline_record"], "logprobs": []}
    out, _ = run_module("sglang_quality_eval", eval_args(sim, baseline=older, seed="a"))
    assert out["ok"] is True and "logprobs not compared: the baseline recorded none" in out["reason"]
    off, _ = run_module("sglang_quality_eval", eval_args(sim, baseline=record["baseline_record"], logprob_top_k=0))
    assert off["ok"] is True and off["logprob"] == {}


def test_tokens_that_part_from_the_baseline_are_named():
    base = [{"id": "p", "tokens": ["A", "B", "C"], "top": [[["A", -0.1]], [["B", -0.2]], [["C", -0.3]]]}]
    same = q.compare_logprobs(base, [{**base[0]}], 0.02)
    assert same["ok"] is True and same["divergence"] == 0 and same["compared"] == 3
    other = [{"id": "p", "tokens": ["A", "X", "C"], "top": [[["A", -0.15]], [["X", -0.2]], [["C", -0.3]]]}]
    parted = q.compare_logprobs(base, other, 0.02)
    assert parted["parted"] == ["p at token 1 ('B' -> 'X')"] and parted["divergence"] == 0.05
    assert parted["ok"] is False  # 0.05 > 0.02; and the one prompt of one parted is more than a quarter
    missing = q.compare_logprobs(base, [{"id": "p", "error": "HTTP 500: x"}], 0.02)
    assert missing["ok"] is False and missing["errors"] == ["p: HTTP 500: x"]


@pytest.mark.parametrize("fault", ["wrong-answer", "nan-output"])
def test_a_broken_engine_scores_nothing(serve, run_module, fault):
    sim = serve(fault, args=("--enable-nan-detection",))
    result, failed = run_module("sglang_quality_eval", eval_args(sim, baseline=BASELINE))
    assert not failed, result
    assert result["score"] == 0.0 and result["ok"] is False and result["nan_detection"] is True
    if fault == "nan-output":
        assert all(set(r["got"]) <= {"!"} for r in result["items"])


def test_the_api_key_is_read_on_the_host_and_never_shown(serve, run_module, tmp_path):
    sim = serve(args=("--api-key", API_KEY))
    result, failed = run_module("sglang_quality_eval", eval_args(sim))
    assert not failed and result["score"] == 0.0 and result["errors"] == len(EVAL_SET["items"])
    assert result["items"][0]["error"].startswith("HTTP 401")
    secrets = tmp_path / "secrets.env"
    secrets.write_text(f'SGLANG_SERVER_API_KEY="{API_KEY}"\n')
    result, failed = run_module("sglang_quality_eval", eval_args(sim, secrets_file=str(secrets)))
    assert not failed and result["score"] == 1.0
    assert API_KEY not in json.dumps(result)


def test_a_bad_evaluation_set_fails_the_module_naming_the_problem(run_module):
    args = {"base_url": "http://127.0.0.1:9", "served_name": "glm-5", "eval_set": {"schema": "x", "name": "n"}}
    result, failed = run_module("sglang_quality_eval", args)
    assert failed
    assert result["msg"] == (
        "evaluation set refused: schema is 'x', expected 'gpufleet.quality_eval/v1'; the evaluation set has no items"
    )
