"""sglang_server_smoke: answers of reasoning models (content / reasoning_content / <think> in content), the
token budget for thinking, and garbage (runs of "!") — on chat completion bodies shaped like sglang 0.5.9's
(serving_chat.py ``_build_chat_response``: ``content`` None when empty, ``reasoning_content`` None when empty).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "sglang_server"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


smoke = _load("sglang_server_smoke_under_test", REPO / "plugins" / "module_utils" / "sglang_server_smoke.py")

DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
GARBAGE = DEFAULTS["sglang_server_garbage_patterns"]
PROMPT = DEFAULTS["sglang_server_smoke_prompts"][0]
REASONING_BUDGET = DEFAULTS["sglang_server_smoke_reasoning_max_tokens"]
THOUGHT = "The user asks for the capital of France in one word. France's capital city is Paris. Answer: Paris."


def completion(content, reasoning=None, finish="stop", tokens=20):
    return json.dumps(
        {
            "id": "5f0c1e0b2d8a4c5e9a7b3c2d1e0f9a8b",
            "object": "chat.completion",
            "created": 1764500000,
            "model": "glm-5",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "reasoning_content": reasoning,
                        "tool_calls": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": 151329 if finish == "stop" else None,
                }
            ],
            "usage": {"prompt_tokens": 17, "total_tokens": 17 + tokens, "completion_tokens": tokens},
        }
    )


class Server:
    """``post(body)`` answering from a list of bodies; records what was asked."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = []

    def __call__(self, body):
        self.asked.append(body)
        return 200, self.answers.pop(0), 0.5


def run(server, parser=""):
    return smoke.run_prompt(server, PROMPT, "glm-5", GARBAGE, parser, REASONING_BUDGET, 1)


def test_reasoning_parser_answer_in_content():
    server = Server(completion("Paris", THOUGHT, tokens=40))
    entry, problems, remarks = run(server, "glm45")
    assert problems == [] and remarks == [] and entry["answer_from"] == "content" and entry["answer"] == "Paris"
    assert server.asked[0]["max_tokens"] == REASONING_BUDGET >= 512  # room for the thinking


def test_without_parser_the_budget_is_the_prompts():
    server = Server(completion("Paris"))
    run(server)
    assert server.asked[0]["max_tokens"] == PROMPT["max_tokens"] == 64


def test_budget_spent_on_thinking_is_checked_on_the_thinking_with_a_remark():
    server = Server(completion(None, THOUGHT, finish="length", tokens=REASONING_BUDGET))
    entry, problems, remarks = run(server, "glm45")
    assert problems == [] and entry["answer_from"] == "reasoning_content"
    assert remarks == [
        "no answer after the thinking (finish_reason length: raise max_tokens); the expectation was checked on "
        "the thinking"
    ]


def test_budget_spent_on_thinking_that_never_names_the_answer_fails():
    server = Server(completion(None, "The user asks about a European country. Let me recall", finish="length"))
    _entry, problems, _remarks = run(server, "glm45")
    assert problems == ["answer does not match /(?i)\\bparis\\b/"]


def test_no_parser_think_block_in_content_only_the_answer_counts():
    entry, problems, _ = run(Server(completion(f"<think>{THOUGHT}</think>\n\nParis")))
    assert problems == [] and entry["answer"] == "Paris" and entry["thinking_chars"] == len(THOUGHT)
    # the thinking names Paris, the answer does not: the answer is wrong
    _entry, problems, _ = run(Server(completion(f"<think>{THOUGHT}</think>\n\nBerlin")))
    assert problems == ["answer does not match /(?i)\\bparis\\b/"]


def test_no_parser_budget_ending_inside_the_thinking_is_asked_again_with_room():
    cut = completion("<think>The user asks for the capital of France in one", finish="length", tokens=64)
    server = Server(cut, completion(f"<think>{THOUGHT}</think>\n\nParis", tokens=90))
    entry, problems, remarks = run(server)
    assert [b["max_tokens"] for b in server.asked] == [64, REASONING_BUDGET]
    assert problems == [] and entry["answer"] == "Paris" and entry["max_tokens"] == REASONING_BUDGET
    assert remarks == [f"the budget of 64 tokens ended inside the thinking; asked again with {REASONING_BUDGET}"]


def test_nan_garbage_as_sglang_returns_it_with_a_reasoning_parser():
    # the glm45 parser forces reasoning: a run of "!" with no </think> is all reasoning_content, content None
    server = Server(completion(None, "!" * REASONING_BUDGET, finish="length", tokens=REASONING_BUDGET))
    _entry, problems, _ = run(server, "glm45")
    assert "thinking looks like garbage (matches /!{6,}/)" in problems


def test_nan_garbage_in_content():
    _entry, problems, _ = run(Server(completion("!" * 64, finish="length", tokens=64)))
    assert "answer looks like garbage (matches /!{6,}/)" in problems
    assert "answer does not match /(?i)\\bparis\\b/" in problems


@pytest.mark.parametrize("text", ["Paris", "Paris!", "Paris! It is lovely!!", "The capital of France is Paris."])
def test_normal_answers_are_not_garbage(text):
    _entry, problems, _ = run(Server(completion(text)))
    assert problems == []


def test_empty_answer_and_no_thinking_fails():
    _entry, problems, _ = run(Server(completion(None)))
    assert "empty answer" in problems


def test_http_error_and_non_completion():
    _entry, problems, _ = smoke.run_prompt(lambda b: (503, "", 0.1), PROMPT, "glm-5", GARBAGE)
    assert problems == ["HTTP 503: "]
    _entry, problems, _ = smoke.run_prompt(lambda b: (200, '{"error": "x"}', 0.1), PROMPT, "glm-5", GARBAGE)
    assert problems == ["the answer is not an OpenAI chat completion"]


def test_split_message_shapes():
    assert smoke.split_message({"content": "A", "reasoning_content": "T"}) == ("A", "T")
    assert smoke.split_message({"content": None, "reasoning_content": "T"}) == ("", "T")
    assert smoke.split_message({"content": "<think>T</think>\n\nA"}) == ("A", "T")
    assert smoke.split_message({"content": "<think>T cut"}) == ("", "T cut")
    assert smoke.split_message({"content": "plain"}) == ("plain", "")
