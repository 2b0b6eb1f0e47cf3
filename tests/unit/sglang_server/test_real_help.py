"""The exact-flag check against the REAL `python -m sglang.launch_server --help` of sglang 0.5.9.

The help was captured from the production lock's ml-env (locks/sglang-cu128) on a lab host by
`make real-engine` (tests/unit/fixtures/sglang-0.5.9/README.md says how and when), and sglang's own parser
dumped there; that dump matched the simulator's data file (lab/sglang-sim/src/sglang_sim/data/server-args-0.5.9.json),
its one copy, pinned here by the capture's digest.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from seed_flags import SEED_GLM5_FLAGS  # tests/support

REPO = Path(__file__).resolve().parents[3]

from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as f  # noqa: E402

FIXTURES = REPO / "tests" / "unit" / "fixtures" / "sglang-0.5.9"
HELP = (FIXTURES / "launch_server-help.txt").read_text()
ROLE_TABLE = REPO / "plugins" / "module_utils" / "sglang_args" / "sglang-args-0.5.9.json"
SIM_DUMP = REPO / "lab" / "sglang-sim" / "src" / "sglang_sim" / "data" / "server-args-0.5.9.json"
# The real parser's dump: the simulator's data, which the dump `make real-engine` took on the lab host
# (lab/real-engine/dump_parser.py, 331 arguments) matched argument for argument.
PARSER_DUMP = json.loads(SIM_DUMP.read_text())
# sha256 of that capture's arguments in comparable() form (canonical JSON, sorted keys), taken from the capture
# itself (tests/unit/fixtures/sglang-0.5.9/parser-dump.json until it was deleted as a second copy).
REAL_ARGUMENTS_SHA256 = "4c65836e604f9d6999191264de1e4809ddf128163061da4df18cd67d1dd1185e"


def real_options() -> set[str]:
    return {o for a in PARSER_DUMP["arguments"] for o in a["options"]}


def test_the_fixture_is_the_real_0_5_9_help():
    assert PARSER_DUMP["version"] == "0.5.9"
    assert HELP.startswith("usage: ")
    assert "--nsa-decode-backend" in HELP and "--model-path MODEL_PATH, --model MODEL_PATH" in HELP


def test_help_options_read_by_the_role_are_exactly_the_real_parsers_options():
    """The regex of the exact-flag check takes every option of the real help and nothing from its prose."""
    options = set(f.sglang_help_options(HELP))
    assert options - {"--help"} == real_options()


def test_the_engine_help_module_reads_exactly_the_real_parsers_options():
    """The module that reads the installed engine's --help on a host (sglang_server_engine_help) against the real
    parser dump, not against the filter: both call module_utils' help_options, so comparing them compared a function
    with itself."""
    path = REPO / "plugins" / "modules" / "sglang_server_engine_help.py"
    spec = importlib.util.spec_from_file_location("sglang_server_engine_help", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.help_options(HELP)) - {"--help"} == real_options()


def test_the_role_argument_table_is_the_real_parser():
    """plugins/module_utils/sglang_args/sglang-args-0.5.9.json (what the role renders with) against the real parser."""
    table = f.load_table(ROLE_TABLE)
    assert set(table) == real_options()
    for arg in PARSER_DUMP["arguments"]:
        entry = table[arg["options"][0]]
        assert entry["dest"] == arg["dest"], arg
        assert (entry["kind"] == "flag") == (arg["action"] == "_StoreTrueAction"), arg
        if arg["nargs"] in ("+", "*"):
            assert entry["kind"] == "list", arg
        if arg["choices"] is not None and entry.get("choices") is not None:
            assert set(entry["choices"]) == set(arg["choices"]), arg


def comparable(arguments: list[dict]) -> list[dict]:
    """Choices as sets: 0.5.9 builds some from a Python set (SAMPLING_BACKEND_CHOICES), whose order changes
    from one process to the next; argparse only tests membership."""
    return [{**a, "choices": None if a["choices"] is None else sorted(map(str, a["choices"]))} for a in arguments]


def test_the_simulators_dump_is_the_real_parser():
    """lab/sglang-sim builds its parser from this dump: it must be the real parser, argument for argument (any
    change to any argument's options, dest, action, nargs, type, choices or default changes the digest)."""
    canonical = json.dumps(comparable(PARSER_DUMP["arguments"]), sort_keys=True)
    assert hashlib.sha256(canonical.encode()).hexdigest() == REAL_ARGUMENTS_SHA256
    assert len(PARSER_DUMP["arguments"]) == 331


def test_the_seeds_flags_are_exact_options_of_the_real_engine():
    assert f.sglang_flag_problems(SEED_GLM5_FLAGS, f.sglang_help_options(HELP)) == []


def test_typos_and_abbreviations_are_refused_against_the_real_help():
    options = f.sglang_help_options(HELP)
    typo, abbreviation, unknown = f.sglang_flag_problems(
        {"nsa-decode-backen": "trtllm", "tp": 8, "tensor-parallel": 8, "port": None, "bogus-flag": 1}, options
    )[:3]
    assert "--nsa-decode-backen is not an option" in typo and "did you mean --nsa-decode-backend" in typo
    assert "--tp is not an option" in abbreviation and "abbreviation of --tp-size" in abbreviation
    assert "--tensor-parallel is not an option" in unknown and "--tensor-parallel-size" in unknown
    assert len(f.sglang_flag_problems({"bogus-flag": 1, "port": None}, options)) == 1
