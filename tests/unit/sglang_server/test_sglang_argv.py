"""Filters of roles/sglang_server: flags as data -> argv, exact-flag check, systemd quoting."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as f  # noqa: E402

SIM_DUMP = REPO / "lab" / "sglang-sim" / "src" / "sglang_sim" / "data" / "server-args-0.5.9.json"


def test_argument_table_matches_the_sglang_0_5_9_dump():
    dump = json.loads(SIM_DUMP.read_text())
    table = f.load_table()
    assert {o for a in dump["arguments"] for o in a["options"]} == set(table)
    for arg in dump["arguments"]:
        entry = table[arg["options"][0]]
        assert entry["dest"] == arg["dest"]
        if arg["action"] == "_StoreTrueAction":
            assert entry["kind"] == "flag"
        if arg["nargs"] in ("+", "*"):
            assert entry["kind"] == "list"


def test_rendering_rules():
    argv = f.sglang_argv(
        {
            "trust-remote-code": True,
            "disable-cuda-graph": False,
            "enable-metrics": None,
            "cuda-graph-bs": [1, 2, 4],
            "json-model-override-args": {"rope_scaling": {"type": "yarn", "factor": 2.0}},
            "mem-fraction-static": 0.92,
            "port": 8000,
            "--host": "0.0.0.0",
        }
    )
    assert argv == [
        "--trust-remote-code",
        "--cuda-graph-bs", "1", "2", "4",
        "--json-model-override-args", '{"rope_scaling":{"type":"yarn","factor":2.0}}',
        "--mem-fraction-static", "0.92",
        "--port", "8000",
        "--host", "0.0.0.0",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"tp-size": True}, "takes a value"),
        ({"trust-remote-code": "yes"}, "is a switch"),
        ({"port": [1, 2]}, "takes one value"),
        ({"model": "/m", "model-path": "/n"}, "are the same SGLang option"),
        ({"api-key": "k"}, "sglang_server_api_key"),
        ({"config": "/x.yaml"}, "passes --config itself"),
        ({"hybrid-kvcache-ratio": True}, "deprecated"),
        ({"kv-cache-dtype": "fp9"}, "not one of its choices"),
        ({"served-model-name": "a\nb"}, "multi-line"),
    ],
)
def test_bad_shapes_are_refused_with_the_option_named(args, words):
    with pytest.raises(f.SglangArgsError, match=words):
        f.sglang_argv(args)


@pytest.mark.parametrize(
    ("version", "option"),
    [("0.5.9", "hybrid-kvcache-ratio"), ("0.5.10.post1", "enable-piecewise-cuda-graph"),
     ("0.5.10.post1", "prefill-round-robin-balance")],
)  # fmt: skip
def test_a_deprecated_option_is_refused_saying_what_the_engine_does_with_it(version, option):
    """sglang's DeprecatedAction only warns (0.5.9 server_args.py:5729, 0.5.10.post1 server_args.py:6673): the
    message says the engine ignores it, not that it exits."""
    with pytest.raises(f.SglangArgsError) as err:
        f.sglang_argv({option: True}, version)
    assert str(err.value) == (
        f"--{option} is deprecated in SGLang {version}: the engine only logs a warning and ignores it "
        "(its parser exits if it is given a value): remove it"
    )
    assert "exit: remove" not in str(err.value)


def test_0_5_23_has_no_deprecated_no_op_option():
    from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_args_table import load_table

    assert [o for o, e in load_table("0.5.23").items() if e["kind"] == "deprecated"] == []


def test_a_null_layer_value_removes_a_lower_layer_flag():
    assert f.sglang_argv({"model": "/m", "model-path": None}) == ["--model", "/m"]


# The real `python -m sglang.launch_server --help` of sglang 0.5.9 (make real-engine; fixtures/sglang-0.5.9/README.md).
REAL_HELP = REPO / "tests" / "unit" / "fixtures" / "sglang-0.5.9" / "launch_server-help.txt"


def test_exact_flags_and_suggestions():
    help_options = f.sglang_help_options(REAL_HELP.read_text())
    assert f.sglang_flag_problems({"tp-size": 8, "port": 1}, help_options) == []
    args = {"nsa-decode-backen": "trtllm", "tp": 8, "port": None, "xyzzy-plugh": 1}
    problems = f.sglang_flag_problems(args, help_options)
    assert len(problems) == 3  # port is omitted (null): not rendered, not checked
    assert "--nsa-decode-backen is not an option" in problems[0]
    assert "did you mean --nsa-decode-backend" in problems[0]
    assert "abbreviation of --tp-size" in problems[1]
    assert "--xyzzy-plugh is not an option" in problems[2] and "did you mean" not in problems[2]


def test_help_options_are_read_from_real_help_text():
    options = f.sglang_help_options(REAL_HELP.read_text())
    assert {"--api-key", "--tensor-parallel-size", "--tp-size", "--nsa-decode-backend", "--help"} <= set(options)
    # prose wrapped at a hyphen ("'--tokenizer-" + newline + "metrics-custom-labels-header'") is no option
    assert not [o for o in options if o.endswith("-")] and "--tokenizer" not in options


def test_arg_lookup_by_any_alias_and_gpu_indices():
    args = {"tensor-parallel-size": 4, "model": "/m", "base-gpu-id": 2}
    assert f.sglang_arg(args, "tp-size") == 4
    assert f.sglang_arg(args, "model-path") == "/m"
    assert f.sglang_gpu_indices(args, 8) == [2, 3, 4, 5]
    assert f.sglang_gpu_indices({"tp-size": 8}, 8) == list(range(8))
    assert f.sglang_gpu_indices({"tp-size": 2, "dp-size": 2}, 8) == [0, 1, 2, 3]
    assert f.sglang_gpu_indices({"tp-size": 4, "dp-size": 2, "enable-dp-attention": True}, 8) == [0, 1, 2, 3]
    assert f.sglang_gpu_indices({"tp-size": 8, "nnodes": 2}, 8) == [0, 1, 2, 3]


def test_systemd_quoting_round_trips_through_a_shell_like_split():
    argv = ["/opt/p/bin/python", "-m", "x", "--json", '{"a": "b c"}', "--pct", "50%", "--d", "$HOME", "plain"]
    line = f.systemd_exec_args(argv)
    assert "%%" in line and "$$HOME" in line
    # systemd unescapes %% and $$; after that the quoting is shell-compatible
    assert shlex.split(line.replace("%%", "%").replace("$$", "$")) == argv


def test_environment_lines_are_sorted_quoted_and_drop_nulls():
    lines = f.systemd_environment({"B": "x y", "A": 1, "C": None, "P": "100%", "T": True})
    assert lines == ['"A=1"', '"B=x y"', '"P=100%%"', '"T=1"']
    with pytest.raises(f.SglangArgsError):
        f.systemd_environment({"bad-name": "x"})


def test_env_file_lines_escape_shell_and_quotes():
    assert f.env_file_line("K", 'a"b$c\\d') == 'K="a\\"b\\$c\\\\d"'


def test_local_model_detection():
    assert f.sglang_model_is_local("/srv/models/glm-5")
    assert not f.sglang_model_is_local("lukealonso/GLM-5-NVFP4")


def test_merge_flags_layers_lowest_first_with_alias_replacement_and_null_removal():
    merged = f.sglang_merge_flags(
        {
            "sglang_server_args_common": {"--port": 8000, "host": "0.0.0.0", "tp-size": 8},
            "sglang_server_args_gpu_class": {"tensor-parallel-size": 4, "mem-fraction-static": 0.9},
            "sglang_server_args_model": None,
            "sglang_server_args_host": {"mem-fraction-static": None, "nnodes": 2},
        }
    )
    assert merged == {"port": 8000, "host": "0.0.0.0", "tensor-parallel-size": 4, "nnodes": 2}
    assert f.sglang_parallel(merged)["tp"] == 4 and f.sglang_parallel(merged)["nnodes"] == 2


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"tp-size": 8, "tensor-parallel-size": 8}, "sglang_server_args_host sets one SGLang option twice"),
        (["tp-size"], "sglang_server_args_host must be a mapping"),
    ],
)
def test_merge_flags_refuses_naming_the_layer(layer, message):
    with pytest.raises(f.SglangArgsError, match=message):
        f.sglang_merge_flags({"sglang_server_args_common": {}, "sglang_server_args_host": layer})


def test_merge_keeps_a_typo_for_validate_inputs_to_report_and_the_layout_ignores_it():
    merged = f.sglang_merge_flags({"sglang_server_args_common": {"tp-size": 8}, "sglang_server_args_host": {"tp": 16}})
    assert merged == {"tp-size": 8, "tp": 16}
    assert f.sglang_parallel(merged)["tp"] == 8
    assert "abbreviation of --tp-size" in f.sglang_flag_problems(merged, f.sglang_table_options(None), "x")[0]


def test_parallel_layout_problems_name_the_flag():
    assert f.sglang_parallel({"tp-size": "x"})["problems"] == [
        "tp-size='x' must be a positive integer (sglang_server_args_*.tp-size)"
    ]
    par = f.sglang_parallel({"tp-size": 8, "dp-size": 2, "enable-dp-attention": True, "nnodes": 2})
    assert (par["world"], par["per_node"], par["problems"]) == (8, 4, [])
    assert "not divisible by nnodes=3" in f.sglang_parallel({"tp-size": 8, "nnodes": 3})["problems"][0]


def test_a_merged_value_names_the_layer_that_set_it():
    """A refusal of a merged flag names the variable to fix: the highest layer that sets the option, in any
    spelling; a layer that removes it (null) does not count; none: the layers' family name."""
    layers = {
        "sglang_server_args_common": {"mem-fraction-static": 0.9, "tp-size": 8, "pp-size": 1},
        "sglang_server_args_gpu_class": {"mem-fraction-static": 1.2, "tensor-parallel-size": 4},
        "sglang_server_args_model": {},
        "sglang_server_args_host": {"pp-size": None},
    }
    assert f.sglang_flag_layer(layers, "mem-fraction-static") == "sglang_server_args_gpu_class"
    assert f.sglang_flag_layer(layers, "tp-size") == "sglang_server_args_gpu_class"  # the other spelling
    assert f.sglang_flag_layer(layers, "pp-size") == "sglang_server_args_common"
    assert f.sglang_flag_layer(layers, "port") == "sglang_server_args_*"
