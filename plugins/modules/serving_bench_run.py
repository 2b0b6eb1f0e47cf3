#!/usr/bin/python
"""Ansible module: run SGLang's own ``python -m sglang.bench_serving`` over a concurrency sweep and parse it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: serving_bench_run
short_description: Run sglang.bench_serving at each concurrency of a sweep against one server; parse the results
author: gpufleet maintainers (!UNKNOWN)
description:
  - Runs on the controller (delegate it to localhost) with the benchmark client's Python (sglang 0.5.9's
    bench_serving and its imports, C(tools/bench_client.py)), once per concurrency, with the C(random-ids)
    dataset (no download), a fixed seed, a local tokenizer directory and C(--output-file).
  - "Offline: C(HF_HUB_OFFLINE), C(TRANSFORMERS_OFFLINE) and C(HF_DATASETS_OFFLINE) are set."
  - The API key goes to bench_serving as C(OPENAI_API_KEY) in its environment only (its C(get_auth_headers) sends
    C(Authorization Bearer)); never on a command line. The JSON line's C(server_info) (the server's
    C(/get_server_info), which holds C(api_key) in sglang 0.5.9) and the saved output are redacted.
  - Per concurrency it writes C(c<C>.log) (bench_serving's output) and C(c<C>.json) (its JSON line) to I(output_dir)
    and returns the metrics of the printed block and the JSON line, cross-checked, with C(failed) = prompts -
    completed. A run that fails (exit status, no result) gives C(error) and all its prompts failed.
options:
  python: {description: "Python of the benchmark client environment.", type: path, required: true}
  base_url: {description: "Server URL, e.g. http://10.0.0.5:8000.", type: str, required: true}
  backend: {description: "bench_serving --backend.", type: str, default: sglang}
  concurrencies: {description: "--max-concurrency values, one run each.", type: list, elements: int, required: true}
  prompts_per_concurrency:
    {description: "Prompts per run = this x concurrency (at least min_prompts).", type: int, default: 4}
  min_prompts: {description: "Fewest prompts in one run.", type: int, default: 16}
  input_len: {description: "--random-input-len.", type: int, default: 256}
  output_len: {description: "--random-output-len.", type: int, default: 64}
  range_ratio:
    {description: "--random-range-ratio (1.0 = every request exactly input_len/output_len).", type: float, default: 1.0}
  seed: {description: "--seed.", type: int, default: 1}
  tokenizer_dir:
    {description: "Local directory with tokenizer.json (and tokenizer_config.json).", type: path, required: true}
  served_model_name:
    {description: "Model name sent with each request (empty = bench_serving asks /v1/models).", type: str, default: ""}
  api_key: {description: "Server API key (empty = none).", type: str, default: ""}
  output_dir: {description: "Controller directory for the raw outputs.", type: path, required: true}
  timeout_s: {description: "Limit for one run (the sweep gets this times the number of runs).", type: int, default: 900}
  extra_args: {description: "More bench_serving arguments.", type: list, elements: str, default: []}
"""

EXAMPLES = r"""
- name: Sweep one server at 16, 32 and 64 concurrent requests from the controller
  gpufleet.fleet.serving_bench_run:
    python: "{{ playbook_dir }}/../.cache/bench-client/venv/bin/python"
    base_url: http://10.0.0.11:8000
    concurrencies: [16, 32, 64]
    tokenizer_dir: /var/cache/gpufleet/tokenizers/gpu-01
    served_model_name: glm-5
    api_key: "{{ sglang_server_api_key }}"
    output_dir: reports/bench/gpu-01/run-1
  delegate_to: localhost
  register: sweep
"""

RETURN = r"""
results:
  description: One entry per concurrency (metrics as bench_serving names them, plus num_prompts, failed, error).
  type: list
  returned: always
commands:
  description: The bench_serving command lines (no secrets in them).
  type: list
  returned: always
"""


import inspect
import json
import os
import subprocess
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils import serving_bench_sweep
from ansible_collections.gpufleet.fleet.plugins.module_utils.serving_bench_parse import (
    ParseError,
    combine,
    parse_block,
    parse_json_lines,
    redact,
)

# The sweep driver's source, run by the client's python with -c (Ansible ships module_utils inside the module's
# zip, so there is no file to point that python at). It holds no secret.
SWEEP_DRIVER = inspect.getsource(serving_bench_sweep)
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def bench_argv(p: dict, concurrency: int, num_prompts: int, json_path: Path) -> list[str]:
    argv = [
        "--backend", p["backend"],
        "--base-url", p["base_url"],
        "--dataset-name", "random-ids",
        "--num-prompts", str(num_prompts),
        "--random-input-len", str(p["input_len"]),
        "--random-output-len", str(p["output_len"]),
        "--random-range-ratio", str(p["range_ratio"]),
        "--max-concurrency", str(concurrency),
        "--seed", str(p["seed"]),
        "--tokenizer", p["tokenizer_dir"],
        "--output-file", str(json_path),
        "--disable-tqdm",
    ]  # fmt: skip
    if p["served_model_name"]:
        # --model is the tokenizer directory, so the chat-template check reads it and not the hub
        argv += ["--model", p["tokenizer_dir"], "--served-model-name", p["served_model_name"]]
    return argv + p["extra_args"]


def sweep(p: dict, out_dir: Path) -> tuple[list[dict], list[str]]:
    """Every concurrency through serving_bench_sweep (python -m sglang.bench_serving per job, one interpreter)."""
    secrets = [p["api_key"]] if p["api_key"] else []
    jobs, meta = [], []
    for c in p["concurrencies"]:
        num_prompts = max(p["min_prompts"], p["prompts_per_concurrency"] * c)
        json_path = out_dir / f"c{c}.jsonl.tmp"
        json_path.unlink(missing_ok=True)
        argv = bench_argv(p, c, num_prompts, json_path)
        jobs.append({"argv": argv, "log": str(out_dir / f"c{c}.log")})
        meta.append((c, num_prompts, json_path, argv))
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "API_KEY")}
    env.update(OFFLINE)
    if p["api_key"]:
        env["OPENAI_API_KEY"] = p["api_key"]
    started = time.time()
    statuses: list[int] = []
    driver_out = ""
    try:
        proc = subprocess.run(
            [p["python"], "-c", SWEEP_DRIVER],
            input=json.dumps(jobs), capture_output=True, text=True, env=env, cwd=str(out_dir),
            timeout=p["timeout_s"] * len(jobs), check=False,
        )  # fmt: skip
        driver_out = proc.stdout + proc.stderr
        try:
            statuses = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            statuses = []
    except subprocess.TimeoutExpired:
        driver_out = f"bench_serving ran past {p['timeout_s']} s per run and was stopped"
    wall = round(time.time() - started, 2)
    results, commands = [], []
    for i, (c, num_prompts, json_path, argv) in enumerate(meta):
        rc = statuses[i] if i < len(statuses) else -1
        log_path = out_dir / f"c{c}.log"
        output = log_path.read_text(errors="replace") if log_path.exists() else ""
        if rc == -1:
            output += "\n" + driver_out
        output = redact(output, secrets)
        log_path.write_text(output)
        record = None
        if json_path.exists():
            records = redact(parse_json_lines(json_path.read_text()), secrets)
            json_path.unlink()
            record = records[-1] if records else None
        if record is not None:
            (out_dir / f"c{c}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        # max_concurrency: the sweep point; "concurrency" (from bench_serving) is the measured mean concurrency
        result: dict = {"max_concurrency": c, "rc": rc, "sweep_wall_s": wall}
        try:
            block = parse_block(output) if rc == 0 else None
        except ParseError:
            block = None
        try:
            result.update(combine(block, record, num_prompts))
            result["error"] = "" if rc == 0 else f"bench_serving exited {rc}: {_tail(output, 5)}"
        except ParseError as err:
            result.update({"num_prompts": num_prompts, "completed": 0, "failed": num_prompts})
            result["error"] = f"{err}; exit status {rc}; last lines:\n{_tail(output)}"
        results.append(result)
        shown = [p["python"], "-m", "sglang.bench_serving", *argv]
        commands.append(" ".join(a if a not in secrets else "<redacted>" for a in shown))
    return results, commands


def main() -> None:
    spec = {
        "python": {"type": "path", "required": True},
        "base_url": {"type": "str", "required": True},
        "backend": {"type": "str", "default": "sglang"},
        "concurrencies": {"type": "list", "elements": "int", "required": True},
        "prompts_per_concurrency": {"type": "int", "default": 4},
        "min_prompts": {"type": "int", "default": 16},
        "input_len": {"type": "int", "default": 256},
        "output_len": {"type": "int", "default": 64},
        "range_ratio": {"type": "float", "default": 1.0},
        "seed": {"type": "int", "default": 1},
        "tokenizer_dir": {"type": "path", "required": True},
        "served_model_name": {"type": "str", "default": ""},
        "api_key": {"type": "str", "default": "", "no_log": True},
        "output_dir": {"type": "path", "required": True},
        "timeout_s": {"type": "int", "default": 900},
        "extra_args": {"type": "list", "elements": "str", "default": []},
    }
    module = AnsibleModule(argument_spec=spec, supports_check_mode=False)
    p = module.params
    if not os.access(p["python"], os.X_OK):
        module.fail_json(msg=f"benchmark client python {p['python']} is missing: run `make bench-client`")
    if not (Path(p["tokenizer_dir"]) / "tokenizer.json").is_file():
        module.fail_json(msg=f"no tokenizer.json in {p['tokenizer_dir']} (serving_bench_tokenizer_dir)")
    out_dir = Path(p["output_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(out_dir, 0o700)
    results, commands = sweep(p, out_dir)
    module.exit_json(changed=True, results=results, commands=commands)


if __name__ == "__main__":
    main()
