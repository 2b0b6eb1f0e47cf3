"""The rollout's quality gate (docs/quality-gate.md): the evaluation set in the repository (generated, deterministic,
usable), the normaliser and matchers, the score, the verdict against a baseline (what the refusal says), the
baseline's checks and key (filters), and the module sglang_quality_eval run in-process (its main(), as Ansible runs
it) against the lab's simulated engine on loopback: healthy, partial-quality, wrong-answer, nan-output, an API key."""

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
EVAL_SET = json.loads((EVAL_DIR / "gpufleet-eval-v1.json").read_text())
KEY = {"gpu_class": "NVIDIA RTX PRO 6000 Blackwell Server Edition x2", "model": "glm-5", "lane": "lab-sim"}
API_KEY = "quality-Key-0042 #x"


# ---------------------------------------------------------------- the evaluation set


def test_the_evaluation_set_is_the_generators_output_and_usable():
    proc = subprocess.run([sys.executable, str(EVAL_DIR / "generate.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert q.check_eval_set(EVAL_SET) == []
    items = EVAL_SET["items"]
    assert 30 <= len(items) <= 60
    kinds = {i["id"].rsplit("-", 1)[0] for i in items}
    assert kinds == {"arith", "weekday", "date", "capital", "convert", "reason"}
    assert {i["match"] for i in items} == {"exact", "numeric"}
    assert all("only" in i["prompt"] for i in items)  # each asks for a short answer


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
        ],
    }
    assert rollout_quality_eval_set_problems(bad) == [
        "item a: duplicate id",
        "item b has no prompt",
        "item b: unknown matcher 'fuzzy' (known: exact, numeric)",
        "item c: numeric expected answer 'two' is not a number",
        "item c: tolerance must be a number >= 0 (got -1)",
        "item d has no expected answer",
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


def test_the_numeric_matcher_with_a_tolerance():
    item = {"expected": 42.165, "match": "numeric", "tolerance": 0.01}
    assert q.matches(item, "42.1648") and q.matches(item, "about 42.17 km") and not q.matches(item, "42.2")


# ---------------------------------------------------------------- score and verdict


def results(n_ok: int, n_bad: int) -> list[dict]:
    out = [{"id": f"ok-{i:02d}", "prompt": f"p{i}", "expected": i, "got": str(i), "ok": True} for i in range(n_ok)]
    out += [{"id": f"bad-{i:02d}", "prompt": f"q{i}", "expected": i, "got": "?", "ok": False} for i in range(n_bad)]
    return out


BASELINE = {
    "schema": q.BASELINE_SCHEMA,
    **KEY,
    "score": 0.95,
    "correct": 38,
    "total": 40,
    "written_at": "2026-12-05T06:00:00Z",
    "host": "t-01",
    "eval_set_sha256": q.eval_set_digest(EVAL_SET),
    "items": [{"id": "bad-00", "ok": False}, {"id": "bad-01", "ok": True}],
}


def test_a_score_at_the_floor_passes_and_below_it_fails_naming_score_baseline_and_worst_items():
    at_floor = q.judge({"items": results(36, 4)}, BASELINE, 0.05)  # 0.90 = 0.95 - 0.05
    assert at_floor["ok"] is True and at_floor["score"] == 0.9 and at_floor["floor"] == 0.9
    below = q.judge({"items": results(35, 5)}, BASELINE, 0.05, worst_limit=2)
    assert below["ok"] is False
    assert below["reason"].startswith(
        "score 0.875 (35/40 exact) against the baseline 0.950 (38/40, 2026-12-05T06:00:00Z, host t-01); "
        "floor 0.900 (allowed drop 0.050); worst items: "
    )
    # the regression (an item the baseline answered right) comes first; each with prompt, expected and got
    assert below["worst"] == [
        {"id": "bad-01", "prompt": "q1", "expected": 1, "got": "?"},
        {"id": "bad-00", "prompt": "q0", "expected": 0, "got": "?"},
    ]
    assert "[bad-01] 'q1': expected 1, got '?'" in below["reason"]


def test_nan_lines_fail_the_verdict_whatever_the_score():
    line = "[2026-12-05 06:00:01 TP0] Detected errors during sampling! NaN in the logits."
    verdict = q.judge({"items": results(40, 0), "nan_detection": True, "nan_lines": [line]}, BASELINE, 0.05)
    assert verdict["ok"] is False and verdict["score"] == 1.0
    assert f"1 NaN line(s) in the engine's journal since its start, first: {line}" in verdict["reason"]


def test_without_a_baseline_the_run_is_measured_only():
    verdict = q.judge({"items": results(3, 1)}, {}, 0.05)
    assert verdict["ok"] is None and verdict["score"] == 0.75 and verdict["reason"] == "score 0.750 measured"


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
    # judged against its own baseline it passes
    again, failed = run_module("sglang_quality_eval", eval_args(sim, baseline=record))
    assert not failed and again["ok"] is True and again["floor"] == 0.95


def test_a_partial_quality_drop_fails_against_the_baseline_naming_the_worst_items(serve, run_module):
    from sglang_sim.quality import degraded

    sim = serve("partial-quality=0.5")
    baseline = {**BASELINE, "score": 1.0, "correct": 38, "total": 38, "items": []}
    result, failed = run_module("sglang_quality_eval", eval_args(sim, baseline=baseline, worst=3))
    assert not failed, result
    wrong = [i["id"] for i in EVAL_SET["items"] if degraded(i["prompt"], 0.5)]
    assert 0 < len(wrong) < len(EVAL_SET["items"])
    assert sorted(r["id"] for r in result["items"] if not r["ok"]) == sorted(wrong)
    assert result["score"] == round(1 - len(wrong) / len(EVAL_SET["items"]), 4)
    assert result["ok"] is False and result["floor"] == 0.95
    assert result["reason"].startswith(
        f"score {result['score']:.3f} ({result['correct']}/38 exact) against the baseline"
    )
    worst = result["worst"]
    assert len(worst) == 3 and [w["id"] for w in worst] == sorted(wrong)[:3]
    for w in worst:
        item = next(i for i in EVAL_SET["items"] if i["id"] == w["id"])
        assert w["prompt"] == item["prompt"] and w["expected"] == item["expected"] and w["got"]
        assert f"[{w['id']}] {w['prompt']!r}: expected {w['expected']!r}, got {w['got']!r}" in result["reason"]


@pytest.mark.parametrize("fault", ["wrong-answer", "nan-output"])
def test_a_broken_engine_scores_nothing(serve, run_module, fault):
    sim = serve(fault, args=("--enable-nan-detection",))
    result, failed = run_module("sglang_quality_eval", eval_args(sim, baseline={**BASELINE, "score": 1.0}))
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
