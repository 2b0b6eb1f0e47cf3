"""The unit file the role renders for the example inventory (the seed's launch), parsed by SGLang 0.5.9's parser.

The real template (roles/sglang_server/templates/sglang-server.service.j2) is rendered by Ansible with the
example inventory's variables, the role's defaults and the values the role derives in validate.yml; its
ExecStart line is split the way systemd splits it, and the arguments after `-m sglang.launch_server` are
parsed with the parser built from the 0.5.9 argument dump (lab/sglang-sim: the real parser's dump, checked
against the real engine by tests/unit/sglang_server/test_real_help.py). This runs in every CI run; the
real engine itself runs in `make real-engine`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import yaml
from role_flags import render

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "inventory" / "examples" / "glm5-rtxpro6000"
sys.path.insert(0, str(REPO / "lab" / "sglang-sim" / "src"))
sys.path.insert(0, str(REPO / "tests" / "unit" / "gpu_facts"))

SEED_ARGV = shlex.split(
    "--model lukealonso/GLM-5-NVFP4 --served-model-name glm-5 --reasoning-parser glm45 --tool-call-parser glm47"
    " --trust-remote-code --tp 8 --mem-fraction-static 0.92 --max-running-requests 64 --kv-cache-dtype auto"
    " --quantization modelopt_fp4 --attention-backend flashinfer --fp8-gemm-backend cutlass"
    " --nsa-decode-backend trtllm --nsa-prefill-backend trtllm --moe-runner-backend flashinfer_cutlass"
    " --disable-custom-all-reduce --enable-flashinfer-allreduce-fusion --host 0.0.0.0 --port 8000"
)
RELEASE = "/opt/ml-env/releases/2026-11-30-sglang-cu128"
# What validate.yml derives, taken from the role itself (its "Derive names, paths and the unit's environment" task),
# never a copy: the unit's environment, the release's python, the served name.
ROLE_DERIVED = next(
    t["ansible.builtin.set_fact"]
    for t in yaml.safe_load((REPO / "roles/sglang_server/tasks/validate.yml").read_text())
    if t.get("name") == "Derive names, paths and the unit's environment"
)
# What validate.yml reads on the host (the release behind the current link), and the redactor left out.
DERIVED = {
    "sglang_server_release": RELEASE,
    "sglang_server_argv": "{{ sglang_server_flags | gpufleet.fleet.sglang_argv }}",
    "sglang_server_model": "{{ sglang_server_flags | gpufleet.fleet.sglang_arg('model-path', '') | string }}",
    "sglang_server_use_redactor": False,
    "sglang_server_redactor_sha256": "",
    "sglang_server_runtime_dir_name": "{{ sglang_server_service_name }}",
    "sglang_server_secrets_file": "{{ sglang_server_config_dir }}/secrets.env",
    **{
        k: ROLE_DERIVED[k]
        for k in ("sglang_server_python", "sglang_server_release_id", "sglang_server_served_name",
                  "sglang_server_unit_environment")
    },
}  # fmt: skip


def systemd_split(line: str) -> list[str]:
    """ExecStart= as systemd reads it: %% and $$ unescaped, then split with shell-like quoting."""
    return shlex.split(line.replace("%%", "%").replace("$$", "$"))


@pytest.fixture(scope="module")
def unit(tmp_path_factory) -> str:
    import gpu_facts_helpers as h

    tmp = tmp_path_factory.mktemp("unit")
    inventory_keys = set()
    for path in (EXAMPLE / "group_vars").glob("*/*.yml"):
        inventory_keys |= set(yaml.safe_load(path.read_text()) or {})
    defaults = yaml.safe_load((REPO / "roles" / "sglang_server" / "defaults" / "main.yml").read_text())
    extra = {k: v for k, v in defaults.items() if k not in inventory_keys}
    extra.update(DERIVED)
    extra["gpu_facts_comm"] = h.gff.gpu_comm_settings(h.facts_for("rtx-pro-6000x8-vm"), {}, 1)
    template = REPO / "roles" / "sglang_server" / "templates" / "sglang-server.service.j2"
    return render(EXAMPLE, "glm5-rtxpro-01", f"{{{{ lookup('ansible.builtin.template', '{template}') }}}}", extra, tmp)


def exec_start(unit: str) -> list[str]:
    lines = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, unit
    return systemd_split(lines[0].removeprefix("ExecStart="))


def test_the_unit_starts_the_release_python_with_the_engine_module(unit):
    argv = exec_start(unit)
    assert argv[:3] == [RELEASE + "/bin/python", "-m", "sglang.launch_server"]


def test_sglang_0_5_9_parses_the_units_command_line_as_the_seeds(unit):
    from sglang_sim import cli

    parser = cli.build_parser()
    parsed = vars(parser.parse_args(exec_start(unit)[3:]))
    # the seed's, and metrics on (sglang_server_metrics, the flags' lowest layer, which the seed lacked)
    assert parsed == vars(parser.parse_args([*SEED_ARGV, "--enable-metrics"]))
    assert parsed["model_path"] == "lukealonso/GLM-5-NVFP4" and parsed["tensor_parallel_size"] == 8


def test_the_units_environment_is_the_roles(unit):
    """Every variable the role puts in the unit (validate.yml's derivation, not a copy of it): CUDA_HOME, the caches
    under the server's cache folder, HOME, the NCCL settings gpu_facts derived for the host, HF_HUB_OFFLINE only for
    a local model (the example serves a Hugging Face id)."""
    env = dict(
        line.removeprefix("Environment=").strip('"').split("=", 1)
        for line in unit.splitlines()
        if line.startswith("Environment=")
    )
    wanted = ["CUDA_HOME", "OMP_NUM_THREADS", "SAFETENSORS_FAST_GPU", "XDG_CACHE_HOME", "TRITON_CACHE_DIR",
              "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH", "HF_HOME", "FLASHINFER_WORKSPACE_BASE", "HOME"]  # fmt: skip
    assert [name for name in wanted if name not in env] == [], env
    assert env["TRITON_CACHE_DIR"] == env["XDG_CACHE_HOME"] + "/triton"
    assert any(k.startswith("NCCL_") for k in env) and "HF_HUB_OFFLINE" not in env


def test_a_flag_the_0_5_9_parser_does_not_know_fails_to_parse(unit):
    from sglang_sim import cli

    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args([*exec_start(unit)[3:], "--dsa-decode-backend", "trtllm"])  # a newer SGLang's name
