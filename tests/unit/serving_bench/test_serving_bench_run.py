"""serving_bench_run: the real sglang 0.5.9 bench_serving (controller client) against a simulated engine."""

from __future__ import annotations

import json


def test_sweep_with_api_key(run_module, make_sim_bench, bench_python, tokenizer_dir, tmp_path):
    sim = make_sim_bench(["--api-key", "sk-unit-key-42", "--served-model-name", "glm-5"])
    out = tmp_path / "out"
    result, failed = run_module(
        "serving_bench_run",
        {
            "python": bench_python,
            "base_url": f"http://127.0.0.1:{sim.port}",
            "concurrencies": [1, 8],
            "prompts_per_concurrency": 2,
            "min_prompts": 4,
            "input_len": 32,
            "output_len": 8,
            "tokenizer_dir": str(tokenizer_dir),
            "served_model_name": "glm-5",
            "api_key": "sk-unit-key-42",
            "output_dir": str(out),
        },
    )
    assert not failed, result
    r1, r8 = result["results"]
    assert (r1["max_concurrency"], r8["max_concurrency"]) == (1, 8)
    assert 0 < r8["concurrency"] <= 8  # measured mean concurrency
    assert r1["error"] == "" and r8["error"] == "", result
    assert r8["completed"] == 16 and r8["failed"] == 0
    assert r8["output_throughput"] > r1["output_throughput"] > 0
    assert r8["total_throughput"] > r8["output_throughput"]
    for key in ("median_ttft_ms", "p99_ttft_ms", "p95_itl_ms", "p99_itl_ms", "request_throughput"):
        assert r8[key] > 0, key
    saved = json.loads((out / "c8.json").read_text())
    assert saved["max_concurrency"] == 8
    assert saved["server_info"]["api_key"] == "<redacted>"
    everything = json.dumps(result) + "".join(p.read_text() for p in out.iterdir())
    assert "sk-unit-key-42" not in everything
    assert "OPENAI_API_KEY" not in " ".join(result["commands"])


def test_wrong_key_counts_every_prompt_failed(run_module, make_sim_bench, bench_python, tokenizer_dir, tmp_path):
    sim = make_sim_bench(["--api-key", "right-key"])
    result, failed = run_module(
        "serving_bench_run",
        {
            "python": bench_python,
            "base_url": f"http://127.0.0.1:{sim.port}",
            "concurrencies": [4],
            "prompts_per_concurrency": 1,
            "min_prompts": 4,
            "input_len": 16,
            "output_len": 4,
            "tokenizer_dir": str(tokenizer_dir),
            "served_model_name": "x",
            "api_key": "wrong-key",
            "output_dir": str(tmp_path / "out"),
        },
    )
    assert not failed
    (r,) = result["results"]
    assert r["failed"] == 4 and r["completed"] == 0
    assert "Warmup failed" in r["error"] and "Unauthorized" in r["error"]
    assert "wrong-key" not in json.dumps(result)
