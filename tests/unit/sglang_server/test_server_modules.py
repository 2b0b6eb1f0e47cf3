"""The sglang_server modules run in-process (their main(), as Ansible runs them) against real programs:
sglang_server_smoke against the lab's simulated engine on loopback (healthy, wrong answers, NaN output,
an API key), sglang_server_engine_help against the simulator's real `python -m ... --help`."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml
from conftest import REPO, ROLE

DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
SIM_SRC = REPO / "lab" / "sglang-sim" / "src"
KEY = "unit-Key-00017 #x"


def smoke_args(sim, **extra):
    return {
        "base_url": f"http://127.0.0.1:{sim.port}",
        "served_name": "glm-5",
        "prompts": DEFAULTS["sglang_server_smoke_prompts"],
        "garbage_patterns": DEFAULTS["sglang_server_garbage_patterns"],
        "min_tokens_per_s": 1,
        "timeout": 30,
        **extra,
    }


@pytest.fixture
def serve(make_sim):
    def _serve(fault=None, args=()):
        env = {"SGLANG_SIM_FAULT": fault} if fault else {}
        sim = make_sim(["--served-model-name", "glm-5", *args], env=env)
        sim.wait_log("The server is fired up and ready to roll", timeout=30)
        return sim

    return _serve


# ---------------------------------------------------------------- sglang_server_smoke


def test_smoke_passes_on_a_healthy_engine(serve, run_module):
    sim = serve()
    result, failed = run_module("sglang_server_smoke", smoke_args(sim))
    assert not failed, result
    assert result["ok"] is True and result["failures"] == []
    assert result["health_status"] == 200 and result["models"] == ["glm-5"]
    (prompt,) = result["prompts"]
    assert prompt["ok"] and "Paris" in prompt["answer"] and prompt["tokens"] > 0 and prompt["tokens_per_s"] > 1
    assert result["simulator"] is True and result["engine_version"]


@pytest.mark.parametrize(
    ("fault", "problem"),
    [("wrong-answer", "answer does not match /(?i)\\bparis\\b/"), ("nan-output", "answer looks like garbage")],
)
def test_smoke_fails_on_a_broken_engine_that_is_up(serve, run_module, fault, problem):
    sim = serve(fault)
    result, failed = run_module("sglang_server_smoke", smoke_args(sim))
    assert failed and result["ok"] is False
    assert result["health_status"] == 200  # up and "healthy": only the generation shows the fault
    assert result["msg"].startswith("health by generation failed: prompt 'What is the capital of France?")
    assert problem in result["msg"]
    assert result["prompts"][0]["ok"] is False


def test_smoke_fails_below_the_speed_floor(serve, run_module):
    sim = serve()
    result, failed = run_module("sglang_server_smoke", smoke_args(sim, min_tokens_per_s=1_000_000))
    assert failed and "tokens/s is below the floor of 1000000" in result["msg"]


def test_smoke_reads_the_api_key_from_the_secrets_file_and_never_prints_it(serve, run_module, tmp_path):
    sim = serve(args=("--api-key", KEY))
    result, failed = run_module("sglang_server_smoke", smoke_args(sim))
    assert failed and "/v1/models answered 401 (API key refused)" in result["msg"]
    secrets = tmp_path / "secrets.env"
    secrets.write_text('SGLANG_SERVER_API_KEY="unit-Key-00017 #x"\nHF_TOKEN="hf_x"\n')
    result, failed = run_module("sglang_server_smoke", smoke_args(sim, secrets_file=str(secrets)))
    assert not failed, result
    assert result["models"] == ["glm-5"] and result["prompts"][0]["ok"]
    assert KEY not in json.dumps(result)


def test_smoke_when_nothing_listens(run_module):
    args = {"base_url": "http://127.0.0.1:9", "served_name": "glm-5", "prompts": [{"prompt": "hi"}], "timeout": 2}
    result, failed = run_module("sglang_server_smoke", args)
    assert failed and "/health answered nothing (expected 200)" in result["msg"]
    assert "/v1/models answered nothing" in result["msg"]


def test_read_env_file_unescapes_systemd_values(tmp_path):
    # the smoke module reads the key with module_utils' reader (sglang_server_http.server_api)
    from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_files import read_env_file

    f = tmp_path / "secrets.env"
    f.write_text('# comment\nSGLANG_SERVER_API_KEY="a\\"b\\\\c $x"\nBROKEN=unquoted\nHF_TOKEN=""\n')
    assert read_env_file(str(f)) == {"SGLANG_SERVER_API_KEY": 'a"b\\c $x', "HF_TOKEN": ""}
    assert read_env_file(str(tmp_path / "missing")) == {}
    assert read_env_file("") == {}


@pytest.mark.parametrize(
    ("answer", "problems"),
    [
        ("The capital of France is Paris.", []),
        ("The capital of France is Berlin.", ["answer does not match /(?i)\\bparis\\b/"]),
        ("Paris " + "!" * 12, ["answer looks like garbage (matches /!{6,}/)"]),
        ("Paris NaN NaN", ["answer looks like garbage (matches /\\bNaN\\b/)"]),
        ("Paris " + "the " * 9, ["answer looks like garbage (matches /\\b(\\w+)(\\s+\\1\\b){7,}/)"]),
        ("", ["answer does not match /(?i)\\bparis\\b/", "empty answer"]),
    ],
)
def test_check_answer(answer, problems):
    from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_smoke import check_answer

    assert check_answer(answer, "(?i)\\bparis\\b", DEFAULTS["sglang_server_garbage_patterns"])[0] == problems


# ---------------------------------------------------------------- sglang_server_engine_help


@pytest.fixture
def sim_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(SIM_SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_engine_help_lists_the_engine_options_and_caches_them(run_module, tmp_path, sim_on_path):
    args = {"python": sys.executable, "module": "sglang_sim.launch_server", "cache_dir": str(tmp_path / "c")}
    first, failed = run_module("sglang_server_engine_help", args)
    assert not failed, first
    assert first["cached"] is False and first["changed"] is False
    assert {"--tp-size", "--model-path", "--disable-custom-all-reduce", "--api-key"} <= set(first["options"])
    assert "--nsa-decode-backen" not in first["options"]
    assert len(list((tmp_path / "c").iterdir())) == 1
    again, failed = run_module("sglang_server_engine_help", args)
    assert not failed and again["cached"] is True and again["options"] == first["options"]


def test_engine_help_runs_with_the_units_environment_each_cached_apart(run_module, tmp_path, sim_on_path):
    """The engine's environment (sglang_server_environment) is set for --help as the unit sets it: the simulator's
    SGLANG_SIM_ENGINE_VERSION picks the parser it prints (0.5.23 has --dsa-decode-backend, 0.5.9 not)."""
    base = {"python": sys.executable, "module": "sglang_sim.launch_server", "cache_dir": str(tmp_path / "c")}
    old, failed = run_module("sglang_server_engine_help", base)
    assert not failed and "--dsa-decode-backend" not in old["options"]
    new, failed = run_module(
        "sglang_server_engine_help", {**base, "environment": {"SGLANG_SIM_ENGINE_VERSION": "0.5.23"}}
    )
    assert not failed and new["cached"] is False
    assert "--dsa-decode-backend" in new["options"] and "--nsa-decode-backend" not in new["options"]
    assert len(list((tmp_path / "c").iterdir())) == 2


def test_engine_help_check_mode_writes_no_cache(run_module, tmp_path, sim_on_path):
    args = {"python": sys.executable, "module": "sglang_sim.launch_server", "cache_dir": str(tmp_path / "c"),
            "_ansible_check_mode": True}  # fmt: skip
    result, failed = run_module("sglang_server_engine_help", args)
    assert not failed and "--tp-size" in result["options"]
    assert not (tmp_path / "c").exists()


def test_engine_help_refuses_a_release_without_the_engine(run_module, tmp_path):
    args = {"python": sys.executable, "module": "no_such_engine.launch_server", "cache_dir": str(tmp_path)}
    result, failed = run_module("sglang_server_engine_help", args)
    assert failed and "the engine is not installed in this release?" in result["msg"]
    assert "No module named 'no_such_engine'" in result["msg"]
    assert list(tmp_path.iterdir()) == []  # a failure is not cached
    args["python"] = str(tmp_path / "bin" / "python")
    result, failed = run_module("sglang_server_engine_help", args)
    assert failed and result["msg"] == f"the engine's Python {tmp_path}/bin/python does not exist or is not executable"


def test_smoke_records_the_resolved_settings_and_holds_them_to_the_policy(serve, run_module):
    """/get_server_info after SGLang resolved its `auto` values: recorded (never the key), and a policy the engine
    did not resolve to fails the check, naming the field, what it resolved and what the policy needs."""
    sim = serve(args=["--kv-cache-dtype", "fp8_e4m3", "--api-key", KEY])
    result, failed = run_module("sglang_server_smoke", smoke_args(sim, api_key=KEY))
    assert not failed and result["ok"], result
    assert result["resolved"]["kv_cache_dtype"] == "fp8_e4m3" and result["resolved"]["enable_metrics"] is False
    assert KEY not in json.dumps(result["resolved"])
    result, _ = run_module(
        "sglang_server_smoke", smoke_args(sim, api_key=KEY, resolved_policy={"kv_cache_dtype": "fp8_e4m3"})
    )
    assert result["ok"] is True, result
    policy = {"kv_cache_dtype": "bfloat16", "page_size": 64}
    result, _ = run_module("sglang_server_smoke", smoke_args(sim, api_key=KEY, resolved_policy=policy))
    assert result["ok"] is False
    assert (
        "the engine resolved kv_cache_dtype='fp8_e4m3' where sglang_server_resolved_policy needs 'bfloat16'"
        in (result["failures"])
    )


def test_resolved_policy_names_are_checked_before_any_change():
    from ansible_collections.gpufleet.fleet.plugins.filter.sglang_server import sglang_resolved_policy_problems

    assert sglang_resolved_policy_problems({"*": {"kv_cache_dtype": "bfloat16"}, "H200 x8": {"page_size": 64}}) == []
    problems = sglang_resolved_policy_problems(
        {"*": {"kv-cache-dtype": "bf16", "kv_cache_type": "x"}, "H200 x8": "bfloat16", "B": {"page_size": [64]}}
    )
    assert problems == [
        "sglang_server_resolved_policy['*']: 'kv-cache-dtype' is no server argument of SGLang 0.5.9 (written with "
        "dashes: use the /get_server_info name)",
        "sglang_server_resolved_policy['*']: 'kv_cache_type' is no server argument of SGLang 0.5.9",
        "sglang_server_resolved_policy['H200 x8'] must be a mapping {field: value}, got 'bfloat16'",
        "sglang_server_resolved_policy['B']: page_size must be a value (a string, number or boolean), {not: value}, "
        "{in: [values]} or {not_in: [values]}, got the list [64] (for one of several values write {in: [...]})",
    ]


def test_resolved_policy_rules_other_than_equality_are_checked_before_any_change():
    """A field's rule may be {not: value}, {in: [values]} or {not_in: [values]}; a malformed one is refused before any
    change, naming the entry, the field and the forms a rule may take."""
    from ansible_collections.gpufleet.fleet.plugins.filter.sglang_server import sglang_resolved_policy_problems

    good = {"*": {"kv_cache_dtype": {"not": "fp8_e4m3"}, "page_size": {"in": [1, 64]}},
            "H200 x8": {"attention_backend": {"not_in": ["triton", "torch_native"]},
                        "enable_metrics": True}}  # fmt: skip
    assert sglang_resolved_policy_problems(good) == []
    bad = {"*": {"kv_cache_dtype": {"nott": "fp8_e4m3"}, "dtype": {"not": ["float16", "float32"]},
                 "page_size": {"in": []}, "attention_backend": {"not_in": "triton"},
                 "quantization": {"in": ["fp8"], "not": "fp4"}}}  # fmt: skip
    assert sglang_resolved_policy_problems(bad) == [
        "sglang_server_resolved_policy['*']: kv_cache_dtype: {'nott': 'fp8_e4m3'} has the operator(s) 'nott'; a rule "
        "has exactly one of not, in, not_in",
        "sglang_server_resolved_policy['*']: dtype: not takes one value (a string, number or boolean), got "
        "['float16', 'float32'] (for several values write {not_in: [...]})",
        "sglang_server_resolved_policy['*']: page_size: in takes a non-empty list of strings, numbers or booleans, "
        "got []",
        "sglang_server_resolved_policy['*']: attention_backend: not_in takes a non-empty list of strings, numbers or "
        "booleans, got 'triton'",
        "sglang_server_resolved_policy['*']: quantization: {'in': ['fp8'], 'not': 'fp4'} has the operator(s) 'in', "
        "'not'; a rule has exactly one of not, in, not_in",
    ]


def test_smoke_holds_the_resolved_settings_to_not_and_in_rules(serve, run_module):
    """The engine resolved kv_cache_dtype fp8_e4m3: 'anything but fp8_e4m3' and 'none of fp8_e4m3, fp8_e5m2' fail the
    check naming what it resolved and what the rule needs; 'one of bfloat16, fp8_e4m3' passes (case-insensitively,
    as the plain value does)."""
    sim = serve(args=["--kv-cache-dtype", "fp8_e4m3"])

    def failures(rule):
        result, _ = run_module("sglang_server_smoke", smoke_args(sim, resolved_policy={"kv_cache_dtype": rule}))
        return result["failures"]

    assert failures({"in": ["bfloat16", "FP8_E4M3"]}) == []
    assert failures({"not": "bfloat16"}) == []
    assert failures({"not": "fp8_e4m3"}) == [
        "the engine resolved kv_cache_dtype='fp8_e4m3' where sglang_server_resolved_policy needs anything but "
        "'fp8_e4m3'"
    ]
    assert failures({"not_in": ["fp8_e4m3", "fp8_e5m2"]}) == [
        "the engine resolved kv_cache_dtype='fp8_e4m3' where sglang_server_resolved_policy needs none of 'fp8_e4m3', "
        "'fp8_e5m2'"
    ]
    assert failures({"in": ["auto", "bfloat16"]}) == [
        "the engine resolved kv_cache_dtype='fp8_e4m3' where sglang_server_resolved_policy needs one of 'auto', "
        "'bfloat16'"
    ]
