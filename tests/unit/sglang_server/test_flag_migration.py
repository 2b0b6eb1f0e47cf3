"""Server flags from one engine lane to another: the migration table (module_utils/sglang_flag_migration.py)
and its filters (plugins/filter/sglang_migrate.py), against the real argument tables of 0.5.9, 0.5.10.post1, 0.5.23."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as f
from ansible_collections.gpufleet.fleet.plugins.filter.sglang_migrate import FilterModule
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_flag_migration as m
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_args_table import load_table, table_versions
from seed_flags import SEED_GLM5_FLAGS  # tests/support

REPO = Path(__file__).resolve().parents[3]
FILTERS = FilterModule().filters()
migrate, diff, lane = FILTERS["sglang_migrate_flags"], FILTERS["sglang_migrate_diff"], FILTERS["sglang_migrate_lane"]
NEWEST = table_versions()[-1]


def inventory_flags(*files: str) -> dict:
    flags: dict = {}
    for name in files:
        data = yaml.safe_load((REPO / name).read_text())
        for key, value in data.items():
            if key.startswith("sglang_server_args_") and isinstance(value, dict):
                flags.update(value)
    return flags


def test_the_seeds_glm5_flags_reach_the_newest_lane_with_nothing_unknown():
    result = migrate(SEED_GLM5_FLAGS, "0.5.9", NEWEST)
    assert result["unmapped"] == []
    flags = result["flags"]
    assert flags["dsa-decode-backend"] == flags["dsa-prefill-backend"] == "trtllm"
    assert flags["flashinfer-allreduce-fusion-backend"] == "auto"
    assert not {"nsa-decode-backend", "nsa-prefill-backend", "enable-flashinfer-allreduce-fusion"} & set(flags)
    # the rest as it was, in its place
    assert list(flags)[:6] == [
        "host",
        "port",
        "tp-size",
        "mem-fraction-static",
        "attention-backend",
        "fp8-gemm-backend",
    ]
    assert list(flags)[6:8] == ["dsa-decode-backend", "dsa-prefill-backend"]
    # checked against the newest table: every flag an option, none deprecated, argv renders with its choices
    table = load_table(NEWEST)
    assert f.sglang_flag_problems(flags, sorted(table), f"SGLang {NEWEST}") == []
    assert not [k for k in flags if table[f"--{k}"].get("deprecated") or table[f"--{k}"]["kind"] == "deprecated"]
    assert "--dsa-prefill-backend" in f.sglang_argv(flags, NEWEST)
    # each change says what, why and where sglang says so
    by_option = {c["option"]: c for c in result["changes"]}
    assert set(by_option) == {"--nsa-decode-backend", "--nsa-prefill-backend", "--enable-flashinfer-allreduce-fusion"}
    fusion = by_option["--enable-flashinfer-allreduce-fusion"]
    assert fusion["from"] == {"enable-flashinfer-allreduce-fusion": True}
    assert fusion["to"] == {"flashinfer-allreduce-fusion-backend": "auto"}
    assert "deprecated in 0.5.23" in fusion["why"] and "serving_hook.py" in fusion["source"]


def test_the_newest_flags_go_back_to_the_seeds_exactly():
    forward = migrate(SEED_GLM5_FLAGS, "0.5.9", NEWEST)["flags"]
    back = migrate(forward, NEWEST, "0.5.9")
    assert back["unmapped"] == []
    assert list(back["flags"].items()) == list(SEED_GLM5_FLAGS.items())
    assert {c["option"] for c in back["changes"]} == {
        "--dsa-decode-backend", "--dsa-prefill-backend", "--enable-flashinfer-allreduce-fusion",
    }  # fmt: skip
    assert all(c["why"].startswith("back to before 0.5.23: ") for c in back["changes"])


def test_the_cuda_12_step_takes_the_seeds_flags_as_they_are():
    result = migrate(SEED_GLM5_FLAGS, "0.5.9", "0.5.10.post1")
    assert result == {"flags": SEED_GLM5_FLAGS, "changes": [], "unmapped": []}
    onward = migrate(result["flags"], "0.5.10.post1", NEWEST)
    assert onward["flags"] == migrate(SEED_GLM5_FLAGS, "0.5.9", NEWEST)["flags"]


@pytest.mark.parametrize(
    "files",
    [
        ("inventory/examples/glm5-rtxpro6000/group_vars/rtx_pro_6000/sglang_server.yml",
         "inventory/examples/glm5-rtxpro6000/group_vars/glm5/sglang_server.yml"),
        ("inventory/lab/group_vars/gpufleet_lab/sglang_server.yml",),
    ],
    ids=["glm5-rtxpro6000", "lab"],
)  # fmt: skip
def test_the_inventories_flags_migrate_with_nothing_unknown(files):
    flags = inventory_flags(*files)
    assert "nsa-prefill-backend" in flags
    result = migrate(flags, "0.5.9", NEWEST)
    assert result["unmapped"] == []
    assert "dsa-prefill-backend" in result["flags"] and "nsa-prefill-backend" not in result["flags"]


def test_keys_written_with_dashes_keep_them():
    result = migrate({"--nsa-prefill-backend": "trtllm", "--port": 1}, "0.5.9", NEWEST)
    assert result["flags"] == {"--dsa-prefill-backend": "trtllm", "--port": 1}


def test_attention_backend_nsa_is_dsa_in_0_5_23_and_back():
    result = migrate({"attention-backend": "nsa", "decode-attention-backend": "nsa"}, "0.5.9", NEWEST)
    assert result["flags"] == {"attention-backend": "dsa", "decode-attention-backend": "dsa"}
    assert "choices.py:74-75" in result["changes"][0]["source"]
    assert migrate(result["flags"], NEWEST, "0.5.9")["flags"] == {
        "attention-backend": "nsa",
        "decode-attention-backend": "nsa",
    }


def test_dp_attention_becomes_the_attention_dp_width_and_back():
    result = migrate({"tp-size": 8, "dp-size": 4, "enable-dp-attention": True}, "0.5.9", NEWEST)
    assert result["flags"] == {"tp-size": 8, "attn-dp-size": 4}
    assert {c["option"] for c in result["changes"]} == {"--dp-size", "--enable-dp-attention"}
    assert migrate(result["flags"], NEWEST, "0.5.9")["flags"] == {
        "tp-size": 8,
        "dp-size": 4,
        "enable-dp-attention": True,
    }
    # without --dp-size the width is 1: no attention DP, the switch just goes
    assert migrate({"enable-dp-attention": True}, "0.5.9", NEWEST)["flags"] == {}


def test_disable_cuda_graph_is_both_phases_disabled_and_back():
    result = migrate({"disable-cuda-graph": True, "port": 1}, "0.5.9", NEWEST)
    assert result["flags"] == {
        "cuda-graph-backend-decode": "disabled",
        "cuda-graph-backend-prefill": "disabled",
        "port": 1,
    }
    assert migrate(result["flags"], NEWEST, "0.5.9")["flags"] == {"disable-cuda-graph": True, "port": 1}
    # one phase disabled is not the old switch: nothing to fold back, and 0.5.9 has no such option
    half = migrate({"cuda-graph-backend-decode": "disabled"}, NEWEST, "0.5.9")
    assert [u["option"] for u in half["unmapped"]] == ["--cuda-graph-backend-decode"]


def test_the_0_5_10_renames_and_the_switch_that_became_the_default():
    result = migrate(
        {"stream-output": True, "enable-piecewise-cuda-graph": True, "cuda-graph-max-bs": 64}, "0.5.9", "0.5.10.post1"
    )
    assert result["flags"] == {"incremental-streaming-output": True, "cuda-graph-max-bs": 64}
    dropped = next(c for c in result["changes"] if c["option"] == "--enable-piecewise-cuda-graph")
    assert dropped["to"] == {} and "on by default from 0.5.10" in dropped["why"]
    assert diff(result)[2:] == [
        "- --enable-piecewise-cuda-graph",
        "+ (nothing)  # " + dropped["why"],
    ]
    assert migrate(result["flags"], "0.5.10.post1", NEWEST)["flags"] == {
        "incremental-streaming-output": True, "cuda-graph-max-bs-decode": 64,
    }  # fmt: skip


def test_a_retired_option_without_a_mapping_is_reported_by_name_and_left_as_it_was():
    result = migrate({"enable-nan-detection": True, "port": 1, "torchao-config": "int4wo-128"}, "0.5.9", NEWEST)
    assert [u["option"] for u in result["unmapped"]] == ["--enable-nan-detection", "--torchao-config"]
    why = result["unmapped"][0]["why"]
    assert why.startswith("--enable-nan-detection is not an option of SGLang 0.5.23 (retired in 0.5.23: deprecated in")
    # 0.5.23's own variables (environ.py:516, 1511), not 0.5.10's SGLANG_SPEC_* (0.5.23 has neither)
    assert "0.5.23, which has neither variable: set SGLANG_SANITIZE_NAN_LOGITS=1 in sglang_server_environment" in why
    assert "SGLANG_ENABLE_NAN_LOGITS_CHECK=1" in why
    assert why.endswith("server_args.py:5520) and no migration rule maps it")
    assert result["flags"]["enable-nan-detection"] is True
    assert diff(result)[-1].startswith("! --torchao-config int4wo-128: --torchao-config is not an option")


def test_a_value_the_target_no_longer_takes_is_reported():
    result = migrate({"attention-backend": "cutlass_mla"}, "0.5.9", NEWEST)
    assert result["unmapped"] == [{
        "option": "--attention-backend", "value": "cutlass_mla",
        "why": "--attention-backend=cutlass_mla is not one of its choices in SGLang 0.5.23; no migration rule maps it",
    }]  # fmt: skip


def test_a_retired_switch_of_0_5_10_is_reported_there():
    result = migrate({"hybrid-kvcache-ratio": True}, "0.5.9", "0.5.10.post1")
    assert "--hybrid-kvcache-ratio is retired in SGLang 0.5.10.post1" in result["unmapped"][0]["why"]


def test_backward_a_newer_option_the_older_version_lacks_is_unmapped_and_a_typo_is_called_one():
    result = migrate({"smg-grpc-mode": True, "dsa-prefil-backend": "trtllm"}, NEWEST, "0.5.9")
    whys = {u["option"]: u["why"] for u in result["unmapped"]}
    assert set(whys) == {"--smg-grpc-mode", "--dsa-prefil-backend"}
    assert (
        "typo" not in whys["--smg-grpc-mode"]
        and "nor is it an option of SGLang 0.5.23: a typo?" in whys["--dsa-prefil-backend"]
    )


def test_omitted_flags_move_with_their_option_or_go():
    result = migrate({"nsa-prefill-backend": None, "enable-nan-detection": False}, "0.5.9", NEWEST)
    assert result == {"flags": {"dsa-prefill-backend": None}, "changes": [], "unmapped": []}


@pytest.mark.parametrize(("args", "message"), [
    (({}, "0.5.9", "0.5.99"),
     "sglang_migrate_flags: to_version '0.5.99' has no SGLang argument table (versions with one: 0.5.9, 0.5.10.post1, "
     "0.5.23): dump its parser (lab/real-engine/dump_parser.py)"),
    (({}, "latest", "0.5.23"), "sglang_migrate_flags: 'latest' is not an engine version"),
    ((["--port"], "0.5.9", "0.5.23"), "sglang_migrate_flags: the flags must be a mapping of option -> value, got list"),
])  # fmt: skip
def test_bad_input_is_refused_naming_it(args, message):
    with pytest.raises(
        AnsibleFilterError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        migrate(*args)


@pytest.mark.parametrize("rule", m.RULES, ids=lambda r: f"{r['option']}@{r['since']}")
def test_every_rule_agrees_with_the_real_tables(rule):
    """A rule's old spelling is an option before ``since``, its new spelling one from ``since`` on (the tables are the
    real parsers'), and respelled values are choices on their side. Guards the hand mapping against typos."""
    versions = table_versions()
    assert rule["since"] in versions and rule["since"] != versions[0]
    before = load_table(versions[versions.index(rule["since"]) - 1])
    since = load_table(rule["since"])
    assert rule["option"] in before, f"{rule['option']} is not an option before {rule['since']}"
    if rule["kind"] == "rename" or rule["kind"] == "dp_attention":
        assert rule["to"] in since
    if rule["kind"] == "switch_to":
        for option, value in rule["to"].items():
            assert value in since[option]["choices"]
        assert before[rule["option"]]["kind"] == "flag"
    if rule["kind"] == "values":
        for old, new in rule["values"].items():
            assert old in before[rule["option"]]["choices"] and new in since[rule["option"]]["choices"]
    if rule["kind"] == "drop":
        assert since[rule["option"]]["kind"] == "deprecated"
    assert rule["why"] and rule["source"]


def test_a_lane_is_its_locks_pinned_sglang_and_cuda():
    locks = REPO / "locks"
    assert lane("sglang-cu130", str(locks)) == {
        "lock": "sglang-cu130", "dir": str(locks / "sglang-cu130"), "engine_version": "0.5.23", "cuda_version": "13.0",
        "table": "0.5.23", "problem": "",
    }  # fmt: skip
    assert lane("sglang-cu128-0.5.10", str(locks))["table"] == "0.5.10.post1"
    assert (lane("sglang-cu128", str(locks))["engine_version"], lane("sglang-cu128", str(locks))["cuda_version"]) == (
        "0.5.9",
        "12.8",
    )
    # the lab's simulator locks pin no sglang: lock.yml's engine_version (what the simulator emulates there) decides
    for lock, engine, cuda in (("lab-sim", "0.5.9", "12.8"), ("lab-sim-cu130", "0.5.23", "13.0")):
        sim = lane(lock, str(locks))
        assert (sim["engine_version"], sim["cuda_version"], sim["table"], sim["problem"]) == (engine, cuda, engine, "")


def test_a_lock_with_neither_a_pin_nor_an_engine_version_gets_the_pinned_default_table(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "lock.yml").write_text('name: tools\ncuda_version: "13.0"\n')
    (tmp_path / "tools" / "requirements.in").write_text("torch==2.11.0\n")
    found = lane("tools", str(tmp_path))
    assert (found["engine_version"], found["table"], found["problem"]) == (None, "0.5.9", "")


def test_a_declared_engine_version_without_a_table_is_refused_saying_so(tmp_path):
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "lock.yml").write_text('name: sim\nengine_version: "0.6.0"  # emulated\n')
    (tmp_path / "sim" / "requirements.in").write_text("sglang-sim==0.1.0\n")
    found = lane("sim", str(tmp_path))
    assert found["engine_version"] == "0.6.0"
    assert found["problem"].startswith("ml_env_lock 'sim' declares engine_version 0.6.0, which has no argument table")


@pytest.mark.parametrize("name", ["sglang-cu131", "", "../locks/sglang-cu128", None])
def test_an_unknown_lane_is_refused_naming_ml_env_lock_and_the_folders(name):
    problem = lane(name, str(REPO / "locks"))["problem"]
    assert problem.startswith(f"ml_env_lock {str(name or '')!r} names no lock folder under ")
    assert "set ml_env_lock to one of " in problem and "sglang-cu128, sglang-cu128-0.5.10, sglang-cu130" in problem


def test_a_lane_whose_sglang_has_no_table_says_how_to_make_one(tmp_path):
    (tmp_path / "next").mkdir()
    (tmp_path / "next" / "lock.yml").write_text('name: next\ncuda_version: "13.1"\n')
    (tmp_path / "next" / "requirements.in").write_text("sglang==0.6.0\n")
    found = lane("next", str(tmp_path))
    assert (found["engine_version"], found["cuda_version"]) == ("0.6.0", "13.1")
    assert "pins sglang 0.6.0, which has no argument table" in found["problem"]
    assert "lab/real-engine/dump_parser.py" in found["problem"] and "reduce_table.py" in found["problem"]


def test_layers_migrate_one_by_one_each_change_naming_its_layer():
    layers = {
        "sglang_server_args_common": {"port": 8000},
        "sglang_server_args_gpu_class": {"nsa-prefill-backend": "trtllm", "enable-flashinfer-allreduce-fusion": True},
        "sglang_server_args_model": None,
        "sglang_server_args_host": {"nsa-prefill-backend": None, "enable-nan-detection": True},
    }
    result = FILTERS["sglang_migrate_layers"](layers, "0.5.9", NEWEST)
    assert result["layers"] == {
        "sglang_server_args_common": {"port": 8000},
        "sglang_server_args_gpu_class": {
            "dsa-prefill-backend": "trtllm",
            "flashinfer-allreduce-fusion-backend": "auto",
        },
        "sglang_server_args_model": {},
        "sglang_server_args_host": {"dsa-prefill-backend": None, "enable-nan-detection": True},
    }
    assert {c["layer"] for c in result["changes"]} == {"sglang_server_args_gpu_class"}
    assert [(u["layer"], u["option"]) for u in result["unmapped"]] == [
        ("sglang_server_args_host", "--enable-nan-detection")
    ]
    assert diff(result) == [
        "sglang_server_args_gpu_class:",
        "- --nsa-prefill-backend trtllm",
        "+ --dsa-prefill-backend trtllm  # " + result["changes"][0]["why"],
        "- --enable-flashinfer-allreduce-fusion",
        "+ --flashinfer-allreduce-fusion-backend auto  # " + result["changes"][1]["why"],
        "sglang_server_args_host:",
        "! --enable-nan-detection: " + result["unmapped"][0]["why"],
    ]


def test_dp_attention_split_over_two_layers_is_unmapped_saying_so():
    layers = {"sglang_server_args_gpu_class": {"dp-size": 4}, "sglang_server_args_model": {"enable-dp-attention": True}}
    result = FILTERS["sglang_migrate_layers"](layers, "0.5.9", NEWEST)
    assert result["layers"] == layers and result["changes"] == []
    (held,) = result["unmapped"]
    assert (held["layer"], held["option"]) == ("sglang_server_args_model", "--enable-dp-attention")
    assert "--dp-size 4 in another layer" in held["why"] and "--attn-dp-size 4" in held["why"]
    # in one layer it migrates
    one = FILTERS["sglang_migrate_layers"]({"x": {"dp-size": 4, "enable-dp-attention": True}}, "0.5.9", NEWEST)
    assert one["layers"] == {"x": {"attn-dp-size": 4}} and one["unmapped"] == []


def test_a_layer_that_is_not_a_mapping_is_refused_naming_it():
    with pytest.raises(
        AnsibleFilterError, match="^sglang_migrate_layers: sglang_server_args_host: the flags must be a mapping"
    ):
        FILTERS["sglang_migrate_layers"]({"sglang_server_args_host": ["port"]}, "0.5.9", NEWEST)


def test_every_option_gone_between_two_tables_is_mapped_or_named_retired():
    """The migration table is the whole diff: each option string of a table that the next table lacks has a rule (of
    that version or, deprecated first, an earlier one) or a RETIRED entry of the version it went in; a RETIRED option
    is gone in its version, and no option is both ruled and retired."""
    versions = table_versions()
    ruled = {r["option"]: r["since"] for r in m.RULES if r["kind"] != "values"}
    for older, newer in zip(versions, versions[1:], strict=False):
        gone = set(load_table(older)) - set(load_table(newer))
        by_rule = {o for o, since in ruled.items() if m.version_key(since) <= m.version_key(newer)}
        retired = {o for o, r in m.RETIRED.items() if r["since"] == newer}
        assert gone - by_rule - retired == set(), f"gone in {newer} without a rule or a RETIRED entry"
        assert retired <= gone, f"RETIRED in {newer} but still an option there: {sorted(retired - gone)}"
    assert not set(ruled) & set(m.RETIRED)


def test_a_retired_option_says_why_and_where():
    result = migrate({"enable-double-sparsity": True, "piecewise-cuda-graph-max-tokens": 4096}, "0.5.10.post1", NEWEST)
    whys = [u["why"] for u in result["unmapped"]]
    assert "(retired in 0.5.23: double-sparsity attention is gone; absent from 0.5.23's parser" in whys[0]
    assert "--cuda-graph-backend-prefill" in whys[1] and "no one-to-one value" in whys[1]


def test_the_newer_renames_of_0_5_10_and_0_5_23():
    flags = {
        "reasoning-parser": "nano_v3",
        "mamba-scheduler-strategy": "extra_buffer",
        "enable-prefill-context-parallel": True,
    }
    result = migrate(flags, "0.5.9", NEWEST)
    assert result["flags"] == {
        "reasoning-parser": "nemotron_3", "mamba-radix-cache-strategy": "extra_buffer", "enable-prefill-cp": True,
    }  # fmt: skip
    assert result["unmapped"] == []
