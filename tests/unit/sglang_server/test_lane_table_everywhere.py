"""sglang_server reads every flag with the argument table of the host's engine lane (vars/main.yml _sglang_server_lane):
the layers' merge (tasks/flags.yml), the communication flags on top (tasks/comm_flags.yml), the unit's argv
(tasks/validate.yml) and the exact-flag check (tasks/validate_inputs.yml). Run by ansible-playbook through the role's
own entry points (tests/support/role_flags.py), so what is asserted is what a deploy renders or refuses."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from role_flags import PLAY, local_ansible_env  # tests/support

REPO = Path(__file__).resolve().parents[3]
TASKS = REPO / "roles" / "sglang_server" / "tasks"
TABLE = "_sglang_server_lane.table"
# the filters that read an argument table, and the position of their table argument (after the piped value)
TABLE_FILTERS = {
    "sglang_arg": 3, "sglang_argv": 1, "sglang_merge_flags": 1, "sglang_parallel": 1, "sglang_gpu_indices": 2,
    "sglang_flag_layer": 2, "sglang_resolved_policy_problems": 1,
}  # fmt: skip


def _validate_expr(name: str) -> str:
    """The expression that roles/sglang_server/tasks/validate.yml sets ``name`` with (the unit's argv, ...)."""
    tasks = yaml.safe_load((TASKS / "validate.yml").read_text())
    for task in tasks:
        facts = task.get("ansible.builtin.set_fact") or {}
        if name in facts:
            return facts[name]
    raise AssertionError(f"validate.yml sets no {name}")


def run(tmp_path: Path, lock: str, layers: dict, expr: str) -> tuple[int, str, object]:
    """Run the role's flags + comm_flags entry points on one host of lane ``lock`` and render ``expr``."""
    import gpu_facts_helpers as h  # tests/support

    comm = h.gff.gpu_comm_settings(h.facts_for("rtx-pro-6000x8-vm"), {}, 1)
    host = {"ansible_connection": "local", "ml_env_lock": lock, "gpu_facts_comm": comm, **layers}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-01": host}}}))
    (tmp_path / "play.yml").write_text(PLAY.format(hosts="gpu-01", repo=REPO, expr=json.dumps(expr)))
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
         str(tmp_path / "play.yml")],
        cwd=REPO, env=local_ansible_env(ANSIBLE_STDOUT_CALLBACK="json"), capture_output=True, text=True, check=False,
    )  # fmt: skip
    doc, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("\n{") + 1 :])
    last = doc["plays"][0]["tasks"][-1]["hosts"].get("gpu-01", {})
    failed = [h["msg"] for t in doc["plays"][0]["tasks"] for h in t["hosts"].values() if h.get("failed")]
    return proc.returncode, " | ".join(str(m) for m in failed), last.get("msg")


GLM5_DSA = {
    "sglang_server_args_model": {"model-path": "zai-org/GLM-5-FP8", "tp-size": 8, "reasoning-parser": "glm45"},
    "sglang_server_args_gpu_class": {
        "attention-backend": "dsa", "dsa-decode-backend": "trtllm", "dsa-prefill-backend": "trtllm",
    },
}  # fmt: skip


def test_attention_backend_dsa_renders_on_the_cuda_13_lane(tmp_path):
    rc, failed, argv = run(tmp_path, "sglang-cu130", GLM5_DSA, _validate_expr("sglang_server_argv"))
    assert rc == 0, failed
    assert argv[argv.index("--attention-backend") + 1] == "dsa"
    assert argv[argv.index("--dsa-decode-backend") + 1] == "trtllm"


def test_attention_backend_dsa_is_refused_on_the_0_5_9_lane_naming_its_choices(tmp_path):
    rc, failed, _ = run(tmp_path, "sglang-cu128", GLM5_DSA, _validate_expr("sglang_server_argv"))
    assert rc != 0
    assert "--attention-backend='dsa' is not one of its choices: " in failed
    assert "nsa" in failed.split("is not one of its choices: ")[1]


def test_the_merge_knows_the_lanes_aliases(tmp_path):
    """0.5.23 spells --enable-hierarchical-cache also --enable-hicache (0.5.9 has no such alias): a host layer's
    ``enable-hicache: false`` replaces the GPU class's ``enable-hierarchical-cache: true`` on that lane only."""
    layers = {
        "sglang_server_args_model": {"model-path": "m", "tp-size": 8},
        "sglang_server_args_gpu_class": {"enable-hierarchical-cache": True},
        "sglang_server_args_host": {"enable-hicache": False},
    }
    rc, failed, argv = run(tmp_path, "sglang-cu130", layers, _validate_expr("sglang_server_argv"))
    assert rc == 0, failed
    assert "--enable-hierarchical-cache" not in argv and "--enable-hicache" not in argv
    rc, failed, _ = run(tmp_path, "sglang-cu128", layers, _validate_expr("sglang_server_argv"))
    assert rc == 0, failed  # unknown to 0.5.9's table: kept as written, the exact-flag check names it
    rc, failed, flags = run(tmp_path, "sglang-cu128", layers, "{{ sglang_server_flags }}")
    assert flags["enable-hierarchical-cache"] is True


@pytest.mark.parametrize("path", sorted(TASKS.glob("*.yml")), ids=lambda p: p.name)
def test_every_table_reading_filter_of_the_role_gets_the_lanes_table(path):
    """No call in the role's tasks falls back to the pinned default table (0.5.9) silently."""
    text = path.read_text()
    for name, position in TABLE_FILTERS.items():
        for m in re.finditer(rf"gpufleet\.fleet\.{name}\b(\(?)", text):
            assert m.group(1) == "(", f"{path.name}: {name} without arguments (the lane's table is its {position}.)"
            depth, i = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            assert text[m.end() : i - 1].rstrip().endswith(TABLE), f"{path.name}: {text[m.start() : i]}"
