"""Each engine lane's argument table against that version's REAL parser and --help.

The captures (tests/unit/fixtures/sglang-<version>/README.md says how and when) came from throwaway venvs of the lanes'
hashed locks: sglang 0.5.10.post1 (locks/sglang-cu128-0.5.10) and 0.5.23 (locks/sglang-cu130). The parser dumps are
lab/sglang-sim/src/sglang_sim/data/server-args-<version>.json (lab/real-engine/dump_parser.py), the role's tables
plugins/module_utils/sglang_args/sglang-args-<version>.json (lab/real-engine/reduce_table.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as f
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_args_table

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "lab" / "sglang-sim" / "src" / "sglang_sim" / "data"
TABLES = REPO / "plugins" / "module_utils" / "sglang_args"
REDUCE = REPO / "lab" / "real-engine" / "reduce_table.py"
VERSIONS = ["0.5.10.post1", "0.5.23"]
# What the help shows that the parser does not take, and the reverse, per version (README of each fixture):
# 0.5.23 prints no help for two options (argparse.SUPPRESS) and mentions a non-option in --sidecar-args' prose.
HELP_ONLY = {"0.5.10.post1": set(), "0.5.23": {"--sidecar-shutdown-timeout"}}
PARSER_ONLY = {"0.5.10.post1": set(), "0.5.23": {"--forward-pass-metrics-worker-id", "--forward-pass-metrics-ipc-name"}}


def dump(version: str) -> dict:
    return json.loads((DATA / f"server-args-{version}.json").read_text())


def help_text(version: str) -> str:
    return (REPO / "tests" / "unit" / "fixtures" / f"sglang-{version}" / "launch_server-help.txt").read_text()


def parser_options(version: str) -> set[str]:
    return {o for a in dump(version)["arguments"] for o in a["options"]}


def reduce(path: Path) -> str:
    proc = subprocess.run([sys.executable, str(REDUCE), str(path)], capture_output=True, text=True, check=True)
    return proc.stdout


def test_the_reducer_reproduces_the_committed_0_5_9_table_byte_for_byte():
    """reduce_table.py is the way a table is made: it gives sglang-args-0.5.9.json from the 0.5.9 dump exactly."""
    assert reduce(DATA / "server-args-0.5.9.json") == (TABLES / "sglang-args-0.5.9.json").read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_committed_table_is_the_reduction_of_the_versions_dump(version):
    assert reduce(DATA / f"server-args-{version}.json") == (TABLES / f"sglang-args-{version}.json").read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_captures_are_of_that_version(version):
    assert dump(version)["version"] == version
    assert help_text(version).startswith("usage: sglang serve ")  # 0.5.10+ names its parser after `sglang serve`
    assert "--model-path MODEL_PATH, --model MODEL_PATH" in help_text(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_role_table_is_the_real_parser(version):
    """Every option string, dest, kind and choices of the table against the real parser's dump."""
    table = sglang_args_table.load_table(version)
    assert set(table) == parser_options(version)
    for arg in dump(version)["arguments"]:
        entry = table[arg["options"][0]]
        assert entry["dest"] == arg["dest"] and entry["options"] == arg["options"], arg
        if arg["action"] == "DeprecatedAction":
            assert entry["kind"] == "deprecated", arg
        elif arg["nargs"] == 0:
            assert entry["kind"] == "flag", arg
        else:
            want = {"+": "list", "*": "list", "?": "optional", None: "value"}[arg["nargs"]]
            assert entry["kind"] == want, arg
        assert entry.get("choices") == arg["choices"], arg
        still_works = arg["action"] in ("DeprecatedStoreTrueAction", "DeprecatedStoreConstAction")
        assert entry.get("deprecated", False) == still_works, arg


@pytest.mark.parametrize("version", VERSIONS)
def test_help_options_are_the_parsers_options_but_for_the_known_differences(version):
    """What the exact-flag check on a host reads (the engine's --help) against the parser: equal for 0.5.10.post1; for
    0.5.23 the help hides two real options and its prose names one that is none (the README says which)."""
    options = set(f.sglang_help_options(help_text(version))) - {"--help"}
    assert options - parser_options(version) == HELP_ONLY[version]
    assert parser_options(version) - options == PARSER_ONLY[version]


def test_0_5_23s_plugin_options_are_in_its_table():
    """launch_server loads sglang.srt.plugins before it parses: smg-grpc-servicer's options are real options."""
    assert "smg-servicer = smg_grpc_servicer.sglang.plugin:register" in dump("0.5.23")["plugins"]
    table = sglang_args_table.load_table("0.5.23")
    assert {"--servicer-impl", "--metrics-port", "--metrics-host"} <= set(table)
    assert table["--servicer-impl"]["choices"] == ["python", "rust"]


def test_the_new_options_of_0_5_23_and_the_ones_it_retired():
    """The facts the migration table (module_utils/sglang_flag_migration.py) is built on, as the user meets them."""
    new, old = sglang_args_table.load_table("0.5.23"), sglang_args_table.load_table("0.5.9")
    assert {"--dsa-prefill-backend", "--dsa-decode-backend", "--flashinfer-allreduce-fusion-backend"} <= set(new)
    assert not {"--nsa-prefill-backend", "--nsa-decode-backend"} & set(new)
    assert {"--nsa-prefill-backend", "--nsa-decode-backend"} <= set(old)
    assert "nsa" in new["--attention-backend"]["choices"] and "dsa" in new["--attention-backend"]["choices"]
    assert "dsa" not in old["--attention-backend"]["choices"]
    assert new["--enable-dp-attention"].get("deprecated") is True
    assert sglang_args_table.load_table("0.5.10.post1")["--enable-piecewise-cuda-graph"]["kind"] == "deprecated"


def test_the_seeds_flags_are_refused_by_the_0_5_23_table_naming_the_nsa_options():
    """Without migration, the seed's GLM-5 flags fail the exact-flag check of the CUDA 13 lane, naming each option."""
    seed = {
        "tp-size": 8,
        "nsa-decode-backend": "trtllm",
        "nsa-prefill-backend": "trtllm",
        "attention-backend": "flashinfer",
    }
    problems = f.sglang_flag_problems(
        seed, f.sglang_table_options(None, "0.5.23"), "SGLang 0.5.23 (its argument table)"
    )
    assert len(problems) == 2
    assert any("--nsa-decode-backend is not an option" in p for p in problems)
    assert any("--nsa-prefill-backend is not an option" in p for p in problems)


def test_table_versions_are_ordered_as_releases():
    assert sglang_args_table.table_versions() == ["0.5.9", "0.5.10.post1", "0.5.23"]
    order = ["0.5.9", "0.5.10rc0", "0.5.10", "0.5.10.post1", "0.5.23"]
    assert sorted(reversed(order), key=sglang_args_table.version_order) == order
