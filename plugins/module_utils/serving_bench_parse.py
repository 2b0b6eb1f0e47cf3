"""Parse the output of SGLang's ``python -m sglang.bench_serving``: the printed result block and its JSON line.

Two sources, cross-checked:

* the printed block (``============ Serving Benchmark Result ============`` ... ``=====``), lines of the form
  ``"{:<40} {:<10.2f}".format(label, value)`` (sglang 0.5.9 ``bench_serving.py: benchmark``). Labels are matched
  case-insensitively, because their spelling differs between the versions that print them: sglang >= 0.3
  prints ``Total token throughput (tok/s):``; vLLM's ``benchmarks/benchmark_serving.py`` (from which sglang's
  was copied) prints ``Total Token throughput (tok/s):``; sglang 0.2.x prints no total line at all (the total
  is then input + output throughput). tests/unit/serving_bench holds a capture of each.
* the JSON line that ``--output-file`` appends (one per run: ``duration, completed, total_input_tokens,
  total_output_tokens, request_throughput, input_throughput, output_throughput, total_throughput,
  mean/median/p99 ttft, mean/median/p95/p99 itl, ... , server_info``). It has no count of failed requests
  and no number of prompts: failed = prompts sent - ``completed``.

The JSON's ``server_info`` is the server's ``/get_server_info``, which in sglang 0.5.9 is
``dataclasses.asdict(server_args)`` and so holds ``api_key`` in clear text: ``redact`` removes it.
"""

from __future__ import annotations

import json
import math
import re

BLOCK_START = re.compile(r"^=+\s*Serving Benchmark Result\s*=+\s*$", re.IGNORECASE | re.MULTILINE)
LINE = re.compile(r"^(?P<label>[A-Za-z0-9][^:]*?):\s+(?P<value>\S+)\s*$")

# printed label (lower case) -> metric key
LABELS = {
    "backend": "backend",
    "traffic request rate": "request_rate",
    "max request concurrency": "max_concurrency",
    "successful requests": "completed",
    "failed requests": "failed",
    "benchmark duration (s)": "duration",
    "total input tokens": "total_input_tokens",
    "total generated tokens": "total_output_tokens",
    "request throughput (req/s)": "request_throughput",
    "input token throughput (tok/s)": "input_throughput",
    "output token throughput (tok/s)": "output_throughput",
    "total token throughput (tok/s)": "total_throughput",
    "concurrency": "concurrency",
    "mean e2e latency (ms)": "mean_e2e_latency_ms",
    "median e2e latency (ms)": "median_e2e_latency_ms",
    "p90 e2e latency (ms)": "p90_e2e_latency_ms",
    "p99 e2e latency (ms)": "p99_e2e_latency_ms",
    "mean ttft (ms)": "mean_ttft_ms",
    "median ttft (ms)": "median_ttft_ms",
    "p99 ttft (ms)": "p99_ttft_ms",
    "mean tpot (ms)": "mean_tpot_ms",
    "median tpot (ms)": "median_tpot_ms",
    "p99 tpot (ms)": "p99_tpot_ms",
    "mean itl (ms)": "mean_itl_ms",
    "median itl (ms)": "median_itl_ms",
    "p95 itl (ms)": "p95_itl_ms",
    "p99 itl (ms)": "p99_itl_ms",
    "max itl (ms)": "max_itl_ms",
}
TEXT_KEYS = {"backend", "request_rate", "max_concurrency"}
INT_KEYS = {"completed", "failed", "total_input_tokens", "total_output_tokens"}
# The metrics a gpufleet result keeps (in this order), all numbers.
KEPT = [
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "concurrency",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p95_itl_ms",
    "p99_itl_ms",
    "max_itl_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
]
SECRET_KEYS = ("api_key", "admin_api_key")


class ParseError(ValueError):
    pass


def _number(text: str) -> float | int | str:
    try:
        value = float(text)
    except ValueError:
        return text
    if value.is_integer() and "." not in text and "e" not in text.lower():
        return int(value)
    return value


def parse_block(stdout: str) -> dict:
    """The metrics of the last printed result block in ``stdout`` (keys as in the JSON line)."""
    starts = list(BLOCK_START.finditer(stdout))
    if not starts:
        raise ParseError("no 'Serving Benchmark Result' block in the output of bench_serving")
    body = stdout[starts[-1].end() :]
    metrics: dict = {}
    for raw in body.splitlines():
        line = raw.strip()
        if line.startswith("=" * 10):
            break
        m = LINE.match(line)
        if not m:
            continue
        key = LABELS.get(m.group("label").strip().lower())
        if key is None:
            continue
        value = m.group("value")
        metrics[key] = value if key in TEXT_KEYS else _number(value)
    if "output_throughput" not in metrics:
        raise ParseError("the result block has no 'Output token throughput (tok/s)' line")
    if "total_throughput" not in metrics and "input_throughput" in metrics:
        # sglang 0.2.x prints no total line: total = input + output tokens per second
        metrics["total_throughput"] = round(metrics["input_throughput"] + metrics["output_throughput"], 2)
        metrics["total_throughput_derived"] = True
    return metrics


def parse_json_lines(text: str) -> list[dict]:
    """Every JSON object of an ``--output-file`` (one per line; bench_serving appends)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)  # bench_serving writes Infinity for an unbounded request rate
        except json.JSONDecodeError as err:
            raise ParseError(f"line {n} of the output file is not JSON: {err}") from err
        if not isinstance(obj, dict):
            raise ParseError(f"line {n} of the output file is not a JSON object")
        out.append(obj)
    return out


def redact(obj, secrets: list[str] | tuple[str, ...] = ()):
    """A copy with ``api_key``-like fields replaced and every secret string masked wherever it appears."""
    if isinstance(obj, dict):
        return {
            k: ("<redacted>" if k in SECRET_KEYS and v not in (None, "") else redact(v, secrets))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        for s in secrets:
            if s:
                obj = obj.replace(s, "<redacted>")
        return obj
    return obj


def _close(a: float, b: float) -> bool:
    # the block prints 2 decimals
    return abs(float(a) - float(b)) <= 0.006 + 1e-9 * abs(float(b))


def combine(block: dict | None, record: dict | None, num_prompts: int) -> dict:
    """One gpufleet result from the printed block and/or the JSON record of the same run.

    Both present: every metric both have must agree (to the block's 2 decimals), else ParseError. The JSON's
    full precision wins. failed = num_prompts - completed.
    """
    if block is None and record is None:
        raise ParseError("bench_serving printed no result block and wrote no JSON line")
    merged: dict = {}
    if block:
        merged.update({k: block[k] for k in KEPT if k in block})
    if record:
        for key in KEPT:
            value = record.get(key)
            if value is None:
                continue
            if block and isinstance(block.get(key), (int, float)) and not _close(block[key], value):
                raise ParseError(f"printed {key} {block[key]} and the JSON line's {value} differ: not the same run")
            merged[key] = value
    for key in KEPT:
        if key in merged and isinstance(merged[key], float) and not math.isfinite(merged[key]):
            merged[key] = None
    completed = int(merged.get("completed") or 0)
    merged["num_prompts"] = num_prompts
    merged["failed"] = max(0, num_prompts - completed)
    return merged
