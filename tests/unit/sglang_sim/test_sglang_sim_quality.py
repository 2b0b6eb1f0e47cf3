"""sglang-sim's answers to the rollout quality gate's evaluation set (lab equipment, sglang_sim.quality): a healthy
engine computes every item right (four groups: arithmetic, facts, multilingual, tool calls); wrong-answer makes every
computed answer wrong; partial-quality=SHARE makes a deterministic share wrong (at start or at runtime, through
SGLANG_SIM_FAULT_FILE) and leaves the smoke check's capital of France right; partial-quality-<group>=SHARE confines it
to one group; non-english-corruption spoils non-English text and tool-call JSON only, as the gate's matchers see it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sglang_sim import faults, quality, textgen

REPO = Path(__file__).resolve().parents[3]
EVAL_SET = json.loads((REPO / "roles/rollout/files/quality_eval/gpufleet-eval-v2.json").read_text())
ITEMS = EVAL_SET["items"]


def right(item: dict, got: str) -> bool:
    from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_quality_eval import matches

    return matches(item, got)


@pytest.fixture(autouse=True)
def fresh_fault_source(monkeypatch):
    """quality reads the process's faults once (then the fault file when it changes): each test starts afresh."""
    monkeypatch.setattr(quality, "_source", None)
    monkeypatch.delenv("SGLANG_SIM_FAULT", raising=False)
    monkeypatch.delenv("SGLANG_SIM_FAULT_FILE", raising=False)


def test_a_healthy_engine_answers_every_item_of_the_evaluation_set():
    answers = {i["id"]: textgen.answer(i["prompt"]) for i in ITEMS}
    assert [i["id"] for i in ITEMS if not right(i, answers[i["id"]])] == []
    assert answers["capital-004"] == "Brasília" and answers["arith-001"] == "935"
    assert answers["weekday-lang-001"] == "土曜日"
    assert json.loads(answers["tool-002"]) == {"name": "set_timer", "arguments": {"minutes": 43, "label": "thé",
                                                                                  "repeat": True}}  # fmt: skip
    # other prompts keep their answers
    assert textgen.answer("What is the capital of France?") == textgen.PARIS
    assert textgen.answer("Tell me about rolling deploys").startswith("Simulated answer ")


def test_wrong_answer_makes_every_computed_answer_wrong_and_plausible():
    wrong = {i["id"]: textgen.answer(i["prompt"], wrong=True) for i in ITEMS}
    assert [i["id"] for i in ITEMS if right(i, wrong[i["id"]])] == []
    assert wrong["arith-001"] == "936" and wrong["capital-001"] == "Osaka"


def test_partial_quality_is_a_deterministic_share(monkeypatch):
    monkeypatch.setenv("SGLANG_SIM_FAULT", "partial-quality=0.5")
    got = {i["id"]: textgen.answer(i["prompt"]) for i in ITEMS}
    bad = sorted(i["id"] for i in ITEMS if not right(i, got[i["id"]]))
    assert bad == sorted(i["id"] for i in ITEMS if quality.degraded(i["prompt"], 0.5))
    assert 0 < len(bad) < len(ITEMS)
    assert textgen.answer("What is the capital of France?") == textgen.PARIS  # the smoke check sees nothing
    # the same prompts every time; a larger share degrades a superset
    assert sorted(i["id"] for i in ITEMS if not right(i, textgen.answer(i["prompt"]))) == bad
    assert set(bad) <= {i["id"] for i in ITEMS if quality.degraded(i["prompt"], 0.9)}
    assert [i for i in ITEMS if quality.degraded(i["prompt"], 1.0)] == ITEMS


def test_partial_quality_of_one_group_leaves_the_others_right(monkeypatch):
    monkeypatch.setenv("SGLANG_SIM_FAULT", "partial-quality-tool-json=0.5")
    bad = {i["group"] for i in ITEMS if not right(i, textgen.answer(i["prompt"]))}
    assert bad == {"tool_json"}
    assert faults.parse_faults("partial-quality-tool-json=0.5").names() == ["partial-quality-tool-json=0.5"]


def test_non_english_corruption_spoils_non_english_text_and_tool_json_only(monkeypatch):
    from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_quality_eval import check_answer

    monkeypatch.setenv("SGLANG_SIM_FAULT", "non-english-corruption")
    results = {i["id"]: (i, check_answer(i, textgen.answer(i["prompt"]))) for i in ITEMS}
    wrong = [(i, why) for i, (ok, why) in results.values() if not ok]
    # every answer with a non-ASCII letter (one capital, Brasília, among the facts) and every tool call
    assert {i["group"] for i, _ in wrong} == {"facts", "multilingual", "tool_json"}
    assert [i["id"] for i, _ in wrong if i["group"] == "facts"] == ["capital-004"]
    assert all(not i["expected"].isascii() for i, _ in wrong if i["group"] == "multilingual")
    assert all(ok for i, (ok, _) in results.values() if i["group"] == "multilingual" and i["expected"].isascii())
    assert len([1 for i, _ in wrong if i["group"] == "tool_json"]) == 100
    whys = {why.split(":")[0].split(" (")[0] for i, why in wrong if i["group"] != "facts"}
    assert whys == {"a replacement character", "a script mix-up", "not a JSON object"}


def test_partial_quality_at_runtime_through_the_fault_file(tmp_path, monkeypatch):
    f = tmp_path / "faults"
    monkeypatch.setenv("SGLANG_SIM_FAULT_FILE", str(f))
    assert all(right(i, textgen.answer(i["prompt"])) for i in ITEMS)
    f.write_text("partial-quality=1\n")
    assert not any(right(i, textgen.answer(i["prompt"])) for i in ITEMS)
    os.utime(f, ns=(1, 1))
    f.write_text("")
    assert all(right(i, textgen.answer(i["prompt"])) for i in ITEMS)


def test_partial_quality_is_parsed_named_and_refused_out_of_range(tmp_path, capfd):
    f = faults.parse_faults("partial-quality=0.25, nan-output")
    assert f.partial_quality == 0.25 and f.nan_output
    assert f.names() == ["nan-output", "partial-quality=0.25"]
    for bad in ("partial-quality", "partial-quality=0", "partial-quality=1.5", "partial-quality=x"):
        with pytest.raises(faults.FaultError, match=r"partial-quality needs a share \(partial-quality=SHARE\)"):
            faults.parse_faults(bad)
    assert "partial-quality=SHARE" in faults.KNOWN and "partial-quality=SHARE" in faults.RUNTIME
    path = tmp_path / "faults"
    path.write_text("partial-quality=2\nwrong-answer")
    src = faults.FaultSource(faults.Faults(partial_quality=0.1), path=str(path))
    cur = src.current()
    assert cur.wrong_answer and cur.partial_quality == 0.1  # the bad value refused, the start-time one kept
    assert "refused 'partial-quality=2' (partial-quality needs a share (partial-quality=SHARE) in (0, 1]" in (
        capfd.readouterr().err
    )
    assert faults.merge(faults.Faults(partial_quality=0.2), faults.Faults(partial_quality=0.6)).partial_quality == 0.6


def test_the_served_engine_degrades_the_share_and_lists_the_fault(make_sim):
    sim = make_sim(["--served-model-name", "glm-5"], env={"SGLANG_SIM_FAULT": "partial-quality=0.5"})
    sim.wait_log("The server is fired up and ready to roll", timeout=30)
    assert "partial-quality=0.5" in sim.get("/get_server_info").json()["simulator_faults"]
    for item in ITEMS[:12]:
        body = {
            "model": "glm-5",
            "messages": [{"role": "user", "content": item["prompt"]}],
            "max_tokens": 32,
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        got = sim.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
        assert right(item, got) is not quality.degraded(item["prompt"], 0.5), (item, got)


def test_logprobs_have_sglangs_shape_differ_a_little_run_to_run_and_move_with_a_perturbed_kernel(make_sim, tmp_path):
    body = {
        "model": "glm-5",
        "messages": [{"role": "user", "content": "Explain in two sentences why a rolling deploy drains a server."}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    sim_fault_file = tmp_path / "faults"
    sim = make_sim(["--served-model-name", "glm-5"], env={"SGLANG_SIM_FAULT_FILE": str(sim_fault_file)})
    sim.wait_log("The server is fired up and ready to roll", timeout=30)

    def ask():
        choice = sim.post("/v1/chat/completions", body).json()["choices"][0]
        return choice["message"]["content"], choice["logprobs"]["content"]

    text, first = ask()
    assert len(first) == 8 and "".join(c["token"] for c in first) == text
    for c in first:
        assert set(c) == {"token", "bytes", "logprob", "top_logprobs"} and c["bytes"] == list(c["token"].encode())
        assert len(c["top_logprobs"]) == 3 and c["top_logprobs"][0]["token"] == c["token"]
        assert [t["logprob"] for t in c["top_logprobs"]] == sorted(
            (t["logprob"] for t in c["top_logprobs"]), reverse=True
        )
        assert c["logprob"] < 0
    _, second = ask()
    moved = [abs(a["logprob"] - b["logprob"]) for a, b in zip(first, second, strict=True)]
    assert 0 < max(moved) < 0.02  # run-to-run noise
    sim_fault_file.write_text("kernel-perturbation=0.01\n")
    text_perturbed, perturbed = ask()
    assert text_perturbed == text
    assert sum(abs(a["logprob"] - b["logprob"]) for a, b in zip(first, perturbed, strict=True)) / 8 > 0.03
    plain = sim.post("/v1/chat/completions", {**body, "logprobs": False}).json()["choices"][0]
    assert plain["logprobs"] is None
