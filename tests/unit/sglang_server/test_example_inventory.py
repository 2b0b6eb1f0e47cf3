"""inventory/examples/glm5-rtxpro6000 reproduces the seed's launch (seed-story.md) flag for flag.

The merged flags (the sglang_server role's `flags` entry point over the example's group_vars, plus the
communication flags gpu_facts derives for the seed machine's simulated facts) are rendered by Ansible
itself and compared with the seed's command line. The only spelling difference is the seed's `--tp`, an
abbreviation SGLang's argparse resolves to `--tp-size` (gpufleet renders exact option names); SGLang
0.5.9's own parser (the lab's dump of it) turns both command lines into the same arguments.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from role_flags import render

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "unit" / "gpu_facts"))
sys.path.insert(0, str(REPO / "lab" / "sglang-sim" / "src"))

SEED = """
python3 -m sglang.launch_server --model lukealonso/GLM-5-NVFP4 --served-model-name glm-5 \
  --reasoning-parser glm45 --tool-call-parser glm47 --trust-remote-code --tp 8 \
  --mem-fraction-static 0.92 --max-running-requests 64 --kv-cache-dtype auto \
  --quantization modelopt_fp4 --attention-backend flashinfer --fp8-gemm-backend cutlass \
  --nsa-decode-backend trtllm --nsa-prefill-backend trtllm --moe-runner-backend flashinfer_cutlass \
  --disable-custom-all-reduce --enable-flashinfer-allreduce-fusion --host 0.0.0.0 --port 8000
"""
SEED_ENV = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_LEVEL": "PHB",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1",
    "NCCL_MIN_NCHANNELS": "8",
    "OMP_NUM_THREADS": "8",
    "CUDA_HOME": "/usr/local/cuda-12.8",
}


def options(argv):
    """[(option, (values...))] of an argv after `-m module`."""
    out, i = [], 0
    while i < len(argv):
        opt, i = argv[i], i + 1
        vals = []
        while i < len(argv) and not argv[i].startswith("--"):
            vals.append(argv[i])
            i += 1
        out.append((opt, tuple(vals)))
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    import gpu_facts_helpers as h

    facts = h.facts_for("rtx-pro-6000x8-vm")
    comm = h.gff.gpu_comm_settings(facts, {}, 1)
    tmp = tmp_path_factory.mktemp("example")
    (tmp / "facts.json").write_text(json.dumps({"gpu_facts_comm": comm}))
    expr = (
        "{{ {'argv': sglang_server_flags | gpufleet.fleet.sglang_argv, 'nccl': gpu_facts_comm.nccl_env, "
        "'omp': sglang_server_omp_num_threads | string, "
        "'cuda_home': cuda_toolkit_home | default('/usr/local/cuda-' ~ cuda_toolkit_version)} }}"
    )
    return render("inventory/examples/glm5-rtxpro6000", "glm5-rtxpro-01", expr, {"gpu_facts_comm": comm}, tmp)


def seed_argv():
    argv = shlex.split(SEED)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    return argv[3:]


def test_same_flags_and_values_as_the_seed(rendered):
    seed = dict(options(seed_argv()))
    seed["--tp-size"] = seed.pop("--tp")  # the seed's abbreviation, written exactly
    seed["--enable-metrics"] = ()  # what the seed lacked: metrics on by default (sglang_server_metrics)
    got = options(rendered["argv"])
    assert len(got) == len(dict(got)), "an option is rendered twice"
    assert dict(got) == seed


def test_sglang_parses_both_command_lines_to_the_same_arguments(rendered):
    from sglang_sim import cli

    parser = cli.build_parser()
    assert vars(parser.parse_args(rendered["argv"])) == vars(parser.parse_args([*seed_argv(), "--enable-metrics"]))


def test_every_rendered_option_is_an_exact_sglang_option(rendered):
    from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as f

    table = f.load_table()
    assert [o for o, _ in options(rendered["argv"]) if o not in table] == []
    assert "--tp" not in table  # why the seed's spelling is not kept


def test_environment_is_the_seeds(rendered):
    env = {**rendered["nccl"], "OMP_NUM_THREADS": rendered["omp"], "CUDA_HOME": rendered["cuda_home"]}
    assert env == SEED_ENV
