"""The bench_serving parser over real captures (tests/unit/fixtures/bench-serving/README.md says where each is from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.gpufleet.fleet.plugins.module_utils.serving_bench_parse import (
    ParseError,
    combine,
    parse_block,
    parse_json_lines,
    redact,
)

# Not imported from conftest: with several conftest modules, "conftest" may be another directory's.
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench-serving"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_sglang_059_block_c64():
    block = parse_block(read("sglang-0.5.9-c64.stdout.txt"))
    assert block["backend"] == "sglang"
    assert block["max_concurrency"] == "64"
    assert block["completed"] == 128
    assert block["output_throughput"] == 1176.43
    assert block["total_throughput"] == 5882.15
    assert block["request_throughput"] == 36.76
    assert block["median_ttft_ms"] == 152.26
    assert block["p99_ttft_ms"] == 238.04
    assert block["p95_itl_ms"] == 51.09
    assert block["p99_itl_ms"] == 60.24
    # "Peak output token throughput" must not be taken for the output throughput
    assert block["output_throughput"] != 1283.0


def test_capital_token_variant_gives_the_same_numbers():
    lower = parse_block(read("sglang-0.5.9-c64.stdout.txt"))
    capital = parse_block(read("capital-token-c64.stdout.txt"))
    assert "Total Token throughput" in read("capital-token-c64.stdout.txt")
    assert capital == lower


def test_sglang_02_style_block_without_total_line():
    block = parse_block(read("sglang-0.2.15-style-c64.stdout.txt"))
    assert block["total_throughput"] == pytest.approx(4705.72 + 1176.43)
    assert block["total_throughput_derived"] is True
    assert "p95_itl_ms" not in block


def test_json_line_c16_and_block_agree():
    block = parse_block(read("sglang-0.5.9-c16.stdout.txt"))
    (record,) = parse_json_lines(read("sglang-0.5.9-c16.jsonl"))
    assert record["max_concurrency"] == 16
    result = combine(block, record, 32)
    assert result["completed"] == 32 and result["failed"] == 0
    assert result["output_throughput"] == pytest.approx(block["output_throughput"], abs=0.006)
    assert result["mean_itl_ms"] == record["mean_itl_ms"]  # full precision from the JSON


def test_failed_requests_are_prompts_minus_completed():
    (record,) = parse_json_lines(read("sglang-0.5.9-c64.jsonl"))
    result = combine(None, record, 130)
    assert result["failed"] == 2


def test_block_and_json_of_different_runs_refused():
    block = parse_block(read("sglang-0.5.9-c64.stdout.txt"))
    (record,) = parse_json_lines(read("sglang-0.5.9-c16.jsonl"))
    with pytest.raises(ParseError, match="differ"):
        combine(block, record, 128)


def test_wrong_key_output_has_no_block():
    text = read("sglang-0.5.9-wrong-key.output.txt")
    assert "Warmup failed" in text
    with pytest.raises(ParseError, match="no 'Serving Benchmark Result' block"):
        parse_block(text)
    with pytest.raises(ParseError):
        combine(None, None, 16)


def test_json_line_server_info_holds_the_key_and_redact_removes_it():
    raw = read("sglang-0.5.9-c64.jsonl")
    assert '"api_key": "sk-test-123"' in raw  # sglang 0.5.9's /get_server_info: dataclasses.asdict(server_args)
    cleaned = redact(parse_json_lines(raw), ["sk-test-123"])
    assert "sk-test-123" not in json.dumps(cleaned)
    assert cleaned[0]["server_info"]["api_key"] == "<redacted>"
    assert cleaned[0]["server_info"]["admin_api_key"] is None


def test_not_json_is_refused():
    with pytest.raises(ParseError, match="line 2"):
        parse_json_lines('{"a": 1}\nnot json\n')
