"""sglang-sim: command line (built from sglang 0.5.9's argparse dump), faults, answers, speed model."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from sglang_sim import cli, engine, faults, textgen
from sglang_sim.cli import SimFatal
from sglang_sim.launch_server import check_gpus
from sglang_sim_helpers import SIM_SRC, tiny_model, write_profile

SEED_LAUNCH = """--model lukealonso/GLM-5-NVFP4 --served-model-name glm-5 \
  --reasoning-parser glm45 --tool-call-parser glm47 --trust-remote-code --tp 8 \
  --mem-fraction-static 0.92 --max-running-requests 64 --kv-cache-dtype auto \
  --quantization modelopt_fp4 --attention-backend flashinfer --fp8-gemm-backend cutlass \
  --nsa-decode-backend trtllm --nsa-prefill-backend trtllm --moe-runner-backend flashinfer_cutlass \
  --disable-custom-all-reduce --enable-flashinfer-allreduce-fusion --host 0.0.0.0 --port 8000"""


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_SIM_", "GPUSIM_"))}
    full_env["PYTHONPATH"] = str(SIM_SRC)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sglang_sim.launch_server", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=30,
    )


def parse_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.parse(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


# ---------------------------------------------------------------- parser from the dump
def test_parser_has_every_argument_of_the_dump():
    spec = cli.load_arg_spec()
    assert spec["version"] == "0.5.9"
    assert len(spec["arguments"]) == 331
    parser = cli.build_parser(spec)
    option_strings = {o for a in parser._actions for o in a.option_strings}
    for arg in spec["arguments"]:
        for opt in arg["options"]:
            assert opt in option_strings, opt


@pytest.mark.parametrize("extra", [[], ["--disable-cuda-graph"]])
def test_seed_launch_is_accepted(extra):
    args = cli.parse(shlex.split(SEED_LAUNCH) + extra)
    assert args.model_path == "lukealonso/GLM-5-NVFP4"
    assert args.served_model_name == "glm-5"
    assert args.tensor_parallel_size == 8
    assert args.mem_fraction_static == pytest.approx(0.92)
    assert args.max_running_requests == 64
    assert args.nsa_decode_backend == "trtllm"
    assert args.enable_flashinfer_allreduce_fusion is True
    assert args.disable_custom_all_reduce is True
    assert args.port == 8000 and args.host == "0.0.0.0"
    assert args.disable_cuda_graph is bool(extra)
    cli.validate(cli.finalize(args))


def test_defaults_match_sglang():
    args = cli.finalize(cli.parse(["--model-path", "/m"]))
    assert (args.host, args.port) == ("127.0.0.1", 30000)
    assert args.served_model_name == "/m" and args.tokenizer_path == "/m"
    # resolved later from the GPUs (resolve.py, server_args.py:1020); 0.88 only when the GPU memory is unknown
    assert args.mem_fraction_static is None and cli.DEFAULT_MEM_FRACTION == 0.88
    assert args.nnodes == 1 and args.base_gpu_id == 0


def test_unknown_flag_exits_2(capsys):
    err = parse_error(capsys, ["--model", "/m", "--no-such-flag", "1"])
    assert "launch_server.py: error: unrecognized arguments: --no-such-flag 1" in err
    assert "gpufleet lab simulator (not SGLang)" in err


def test_abbreviations_like_argparse(capsys):
    args = cli.parse(["--model", "/m", "--nsa-decode-backen", "trtllm"])
    assert args.nsa_decode_backend == "trtllm"
    for bad in ("--nsa-decode-backendx", "--nsa-decod-backend"):
        err = parse_error(capsys, ["--model", "/m", bad, "trtllm"])
        assert f"unrecognized arguments: {bad} trtllm" in err


def test_types_and_choices_are_enforced(capsys):
    assert "invalid int value" in parse_error(capsys, ["--model", "/m", "--port", "http"])
    assert "invalid choice" in parse_error(capsys, ["--model", "/m", "--kv-cache-dtype", "fp7"])
    args = cli.parse(["--model", "/m", "--cuda-graph-bs", "1", "2", "4", "--extra-metric-labels", '{"a": "b"}'])
    assert args.cuda_graph_bs == [1, 2, 4] and args.extra_metric_labels == {"a": "b"}
    args = cli.parse(["--model", "/m", "--lora-paths", "a=/x", "/y"])
    assert args.lora_paths == {"a": "/x", "/y": "/y"}


def test_model_path_required(capsys):
    assert "--model-path" in parse_error(capsys, ["--port", "1234"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mem-fraction-static", "1.2"], "--mem-fraction-static must be in (0, 1)"),
        (["--mem-fraction-static", "0"], "--mem-fraction-static must be in (0, 1)"),
        (["--served-model-name", "glm:5"], "must not contain ':'"),
        (["--tp", "3", "--nnodes", "2"], "must be divisible by nnodes"),
    ],
)
def test_semantic_validation(argv, message):
    args = cli.finalize(cli.parse(["--model", "/m", *argv]))
    with pytest.raises(SimFatal) as exc:
        cli.validate(args)
    assert message in exc.value.exc_line


def test_tp_larger_than_the_host_profile(tmp_path):
    from sglang_sim import gpus

    profile = gpus.load_profile(str(write_profile(tmp_path, n_gpus=2)))
    assert profile is not None and len(profile.gpus) == 2
    check_gpus(cli.finalize(cli.parse(["--model", "/m", "--tp", "2"])), profile)
    check_gpus(cli.finalize(cli.parse(["--model", "/m", "--tp", "4", "--nnodes", "2"])), profile)
    for argv in (["--tp", "4"], ["--tp", "2", "--pp-size", "2"], ["--tp", "2", "--base-gpu-id", "1"]):
        with pytest.raises(SimFatal) as exc:
            check_gpus(cli.finalize(cli.parse(["--model", "/m", *argv])), profile)
        assert "invalid device ordinal" in exc.value.exc_line


def test_config_file_is_merged(tmp_path):
    cfg = tmp_path / "sglang.yaml"
    cfg.write_text("# comment\nserved-model-name: glm-5\ntp-size: 2\ndisable-cuda-graph: true\ncuda-graph-bs: [1, 2]\n")
    args = cli.parse(["--model", "/m", "--config", str(cfg), "--tp-size", "1"])
    assert args.served_model_name == "glm-5"
    assert args.tensor_parallel_size == 1  # CLI wins
    assert args.disable_cuda_graph is True and args.cuda_graph_bs == [1, 2]


def test_config_keys_are_written_as_flags_verbatim_like_0_5_9(tmp_path, capsys):
    # ConfigArgumentMerger turns each key into f"--{key}": underscores are not translated
    cfg = tmp_path / "sglang.yaml"
    cfg.write_text("tp_size: 2\n")
    with pytest.raises(SystemExit) as e:
        cli.parse(["--model", "/m", "--config", str(cfg)])
    assert e.value.code == 2
    assert "unrecognized arguments: --tp_size 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "api_key"),
    [
        ("api-key: 00017", "15"),
        ("api-key: yes", "true"),
        ("api-key: abc #tail", "abc"),
        ("api-key: 1e3", "1e3"),
        ("api-key: 0x1F", "31"),
        ("api-key: '00017'", "00017"),
        ("api-key: 'x #y'", "x #y"),
        ("api-key: 'it''s'", "it's"),
    ],
)
def test_config_values_are_typed_by_yaml_safe_load_like_0_5_9(tmp_path, line, api_key):
    cfg = tmp_path / "secret-args.yaml"
    cfg.write_text(line + "\n")
    assert cli.parse(["--model", "/m", "--config", str(cfg)]).api_key == api_key


@pytest.mark.parametrize(
    ("name", "body", "error"),
    [
        ("a.yaml", "api-key: *k\n", "yaml.composer.ComposerError: found undefined alias 'k'"),
        ("a.json", "{}", "ValueError: Config file must be YAML format, got: .json"),
        ("a.yaml", "- 1\n", "ValueError: Config file must contain a dictionary at root level"),
        ("a.yaml", "lora-paths: [a]\n", "ValueError: Unsupported config option 'lora_paths'"),
    ],
)
def test_config_errors_are_0_5_9s(tmp_path, name, body, error):
    cfg = tmp_path / name
    cfg.write_text(body)
    with pytest.raises(SimFatal) as e:
        cli.parse(["--model", "/m", "--config", str(cfg)])
    assert e.value.exc_line.startswith(error)


def test_help_and_version_subprocess():
    r = run_cli("--help")
    assert r.returncode == 0
    assert "gpufleet lab simulator (not SGLang)" in r.stdout
    for arg in cli.load_arg_spec()["arguments"]:
        assert arg["options"][0] in r.stdout
    r = run_cli("--version")
    assert r.returncode == 0 and "gpufleet lab simulator (not SGLang)" in r.stdout


def test_cli_errors_subprocess(tmp_path):
    r = run_cli("--model", "/m", "--bogus")
    assert r.returncode == 2 and "error: unrecognized arguments: --bogus" in r.stderr
    model = str(tiny_model())
    r = run_cli("--model", model, "--mem-fraction-static", "1.5")
    assert r.returncode == 1 and "--mem-fraction-static must be in (0, 1)" in r.stderr
    assert r.stderr.splitlines()[0].endswith(
        "gpufleet lab simulator (not SGLang), emulating `python -m sglang.launch_server` of sglang 0.5.9"
    )
    env = {"GPUSIM_PROFILE_DIR": str(tmp_path / "none"), "GPUSIM_STATE_DIR": str(tmp_path / "state")}
    r = run_cli("--model", model, env=env)
    assert r.returncode == 1 and "RuntimeError: No CUDA GPUs are available" in r.stderr
    write_profile(tmp_path / "prof", n_gpus=2)
    env["GPUSIM_PROFILE_DIR"] = str(tmp_path / "prof")
    r = run_cli("--model", model, "--tp", "8", env=env)
    assert r.returncode == 1 and "invalid device ordinal" in r.stderr and "has 2 GPUs" in r.stderr
    r = run_cli("--model", model, env={**env, "SGLANG_SIM_FAULT": "crash-on-start,explode"})
    assert r.returncode == 2 and "unknown fault 'explode'" in r.stderr


# ---------------------------------------------------------------- faults
def test_fault_parsing():
    f = faults.parse_faults(" nan-output, slow-start=2.5,leak-gpu-memory ")
    assert f.nan_output and f.leak_gpu_memory and f.slow_start == 2.5
    assert not f.crash_on_start
    assert faults.parse_faults("").names() == []
    for bad in ("nope", "slow-start", "slow-start=x", "nan-output=1", "slow-start=-1"):
        with pytest.raises(faults.FaultError):
            faults.parse_faults(bad)


# ---------------------------------------------------------------- answers and tokens
def test_answers_are_sensible_and_deterministic():
    assert "Paris" in textgen.answer("What is the capital of France?")
    assert "Berlin" in textgen.answer("What is the capital of France?", wrong=True)
    a = textgen.answer("Tell me about llamas")
    assert a == textgen.answer("Tell me about llamas") != textgen.answer("Tell me about alpacas")


def _extract_code(text: str) -> str:
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_is_prime_answer_is_working_python():
    text = textgen.answer("Write a Python function is_prime with docstrings and type hints")
    code = _extract_code(text)
    assert '"""' in code and "def is_prime(n: int) -> bool:" in code
    ns: dict = {}
    exec(compile(code, "<answer>", "exec"), ns)  # noqa: S102 - our own fixed text
    primes = [n for n in range(60) if ns["is_prime"](n)]
    assert primes == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]
    wrong = _extract_code(textgen.answer("Write is_prime in Python", wrong=True))
    ns = {}
    exec(compile(wrong, "<answer>", "exec"), ns)  # noqa: S102
    assert ns["is_prime"](9) is True  # deterministic but wrong


def test_token_model_and_truncation():
    assert textgen.count_tokens("Hello, world!") == 4
    text = textgen.IS_PRIME
    assert "".join(textgen.tokenize(text)) == text
    pieces, finish = textgen.plan_output("capital of France", 3)
    assert finish == "length" and "".join(pieces) == "The capital of"
    pieces, finish = textgen.plan_output("capital of France", None)
    assert finish == "stop" and "".join(pieces) == textgen.PARIS
    pieces, finish = textgen.plan_output("anything", 50, ignore_eos=True)
    assert len(pieces) == 50 and finish == "length"
    # broken kernels: token 0 ("!") at every step, never EOS, no "NaN" text
    pieces, finish = textgen.plan_output("anything", 40, nan=True)
    assert "".join(pieces) == "!" * 40 and finish == "length"
    pieces, finish = textgen.plan_output("anything", None, nan=True)
    assert "".join(pieces) == "!" * textgen.NAN_DEFAULT_TOKENS and "NaN" not in "".join(pieces)


def test_thinking_answer_and_0_5_9_reasoning_split():
    prompt = "What is the capital of France? Answer in one word."
    pieces, finish = textgen.plan_output(prompt, None, think=True)
    text = "".join(pieces)
    assert finish == "stop" and text.startswith("<think>") and "</think>" in text
    assert textgen.parse_reasoning(text, True)[1] == textgen.PARIS
    assert textgen.parse_reasoning(text, False)[1] == textgen.PARIS  # <think> in the text starts reasoning
    # a small budget ends inside the thinking: all of it is reasoning, no answer
    pieces, finish = textgen.plan_output(prompt, 20, think=True)
    reasoning, answer = textgen.parse_reasoning("".join(pieces), True)
    assert finish == "length" and answer == "" and reasoning.startswith("The user asks")
    # garbage under a reasoning parser that forces reasoning lands in reasoning_content
    assert textgen.parse_reasoning("!!!!", True) == ("!!!!", "")
    assert textgen.parse_reasoning("!!!!", False) == ("", "!!!!")
    # streaming increments give the same split
    sp = textgen.StreamingReasoningParser(True)
    parts = [sp.feed(p) for p in textgen.plan_output(prompt, None, think=True)[0]]
    assert "".join(r for r, _ in parts).strip() == textgen.parse_reasoning(text, True)[0].strip()
    assert "".join(t for _, t in parts).strip() == textgen.PARIS


def test_speed_model_saturates(monkeypatch):
    monkeypatch.setenv("SGLANG_SIM_TOKENS_PER_S", "60")
    monkeypatch.setenv("SGLANG_SIM_SATURATION", "32")
    e = engine.Engine("m", faults.Faults())
    assert e.per_request_rate(1) == pytest.approx(60)
    agg = [c * e.per_request_rate(c) for c in (1, 8, 16, 32, 64, 128, 1024)]
    assert agg == sorted(agg)
    assert agg[-1] < 60 * 32  # bounded by R * K
    assert e.per_request_rate(64) < e.per_request_rate(8) < e.per_request_rate(1)
