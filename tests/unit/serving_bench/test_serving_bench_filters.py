"""serving_bench filters: configuration identity from the unit, GPU class, baseline comparison, gate, ranking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter.serving_bench import (
    compare,
    config_hash,
    gate,
    gpu_class,
    input_problems,
    rank,
    unit_config,
)

# Not imported from conftest: with several conftest modules, "conftest" may be another directory's.
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench-serving"

UNIT = """[Service]
EnvironmentFile=/etc/sglang-server/secrets.env
Environment="CUDA_HOME=/usr/local/cuda-12.8" "NCCL_P2P_LEVEL=PHB"
Environment=SGLANG_SIM_TOKENS_PER_S=60
ExecStart=/opt/ml-env/releases/abc123/bin/python -m sglang.launch_server --model-path /srv/m \\
  --tp-size 8 --mem-fraction-static 0.92
"""


def seed_baseline() -> dict:
    """The seed's measurement as a baseline (reference/seed-story.md: 225 output / 516 total tok/s at 64)."""
    return {
        "host": "seed-vm",
        "config_hash": "seed",
        "results": [
            {"max_concurrency": 32, "output_throughput": 144.0, "total_throughput": 304.0, "failed": 0},
            {"max_concurrency": 64, "output_throughput": 225.0, "total_throughput": 516.0, "failed": 0},
        ],
    }


def run(out64: float, failed: int = 0) -> dict:
    return {
        "host": "canary",
        "gpu_class": "NVIDIA RTX PRO 6000 Blackwell Server Edition x8",
        "config_hash": "new",
        "results": [{"max_concurrency": 64, "output_throughput": out64, "failed": failed, "num_prompts": 256}],
    }


def test_unit_config_reads_flags_environment_and_release():
    cfg = unit_config(UNIT)
    assert cfg["argv"][-4:] == ["--tp-size", "8", "--mem-fraction-static", "0.92"]
    assert cfg["environment"] == {
        "CUDA_HOME": "/usr/local/cuda-12.8",
        "NCCL_P2P_LEVEL": "PHB",
        "SGLANG_SIM_TOKENS_PER_S": "60",
    }
    assert cfg["release"] == "/opt/ml-env/releases/abc123"


def test_config_hash_changes_with_flags_environment_and_release():
    base = config_hash(unit_config(UNIT))
    assert base == config_hash(unit_config(UNIT))
    assert base != config_hash(unit_config(UNIT.replace("0.92", "0.85")))
    assert base != config_hash(unit_config(UNIT.replace("=60", "=20")))
    assert base != config_hash(unit_config(UNIT.replace("abc123", "def456")))
    with pytest.raises(AnsibleFilterError, match="no ExecStart"):
        unit_config("[Service]\n")


def test_gpu_class_from_facts_or_override():
    facts = {"gpus": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]}
    assert gpu_class(facts) == "NVIDIA H200 x2"
    assert gpu_class(facts, "h200-sxm") == "h200-sxm"
    with pytest.raises(AnsibleFilterError, match="serving_bench_gpu_class"):
        gpu_class({})


def test_gate_against_the_seed_baseline():
    ok = gate(run(210.0), seed_baseline(), 64, 10)
    assert ok["ok"] is True and ok["delta_pct"] == -6.7
    bad = gate(run(180.0), seed_baseline(), 64, 10)
    assert bad["ok"] is False
    assert bad["reason"] == (
        "canary: output_throughput at concurrency 64 is 180.00, 20.0% below the baseline 225.00 of GPU class "
        "'NVIDIA RTX PRO 6000 Blackwell Server Edition x8' (allowed: 10% below)"
    )


def test_gate_refuses_failed_requests_missing_point_and_missing_baseline():
    assert "3 of 256 requests failed" in gate(run(300.0, failed=3), seed_baseline(), 64, 10)["reason"]
    missing = gate(run(300.0), seed_baseline(), 16, 10)
    assert missing["ok"] is False and "serving_bench_gate_concurrency" in missing["reason"]
    nobase = gate(run(300.0), None, 64, 10)
    assert nobase["ok"] is False and "serving_bench_save_baseline=true" in nobase["reason"]
    assert gate(run(300.0), None, 64, 10, require_baseline=False)["ok"] is True


def test_compare_with_baseline_per_concurrency():
    cmp = compare([{"max_concurrency": 64, "output_throughput": 450.0}, {"max_concurrency": 16}], seed_baseline())
    assert cmp == [
        {"max_concurrency": 64, "value": 450.0, "baseline": 225.0, "delta_pct": 100.0},
        {"max_concurrency": 16, "value": None, "baseline": None, "delta_pct": None},
    ]


def test_rank_best_first_failed_last():
    variants = [
        {"name": "a", "results": [{"max_concurrency": 64, "output_throughput": 100.0, "failed": 0}]},
        {"name": "b", "results": [{"max_concurrency": 64, "output_throughput": 900.0, "failed": 5}]},
        {"name": "c", "results": [{"max_concurrency": 64, "output_throughput": 300.0, "failed": 0}]},
    ]
    assert [v["name"] for v in rank(variants, 64)] == ["c", "a", "b"]


def test_input_problems_name_the_variable():
    good = {
        "serving_bench_concurrencies": [16, 32, 64],
        "serving_bench_input_len": 256,
        "serving_bench_output_len": 64,
        "serving_bench_prompts_per_concurrency": 4,
        "serving_bench_gate_max_regression_pct": 10,
        "serving_bench_gate_metric": "output_throughput",
        "serving_bench_backend": "sglang",
    }
    assert input_problems(good) == []
    bad = input_problems(good | {"serving_bench_concurrencies": [16, 0], "serving_bench_gate_max_regression_pct": 120})
    assert any(p.startswith("serving_bench_concurrencies must be") for p in bad)
    assert any(p.startswith("serving_bench_gate_max_regression_pct must be") for p in bad)


def test_real_json_line_feeds_the_gate():
    record = json.loads((FIXTURES / "sglang-0.5.9-c64.jsonl").read_text())
    mine = {"host": "lab", "gpu_class": "x", "results": [record | {"failed": 0}]}
    base = {"results": [{"max_concurrency": 64, "output_throughput": record["output_throughput"] * 2}]}
    verdict = gate(mine, base, 64, 10)
    assert verdict["ok"] is False and verdict["delta_pct"] == -50.0
