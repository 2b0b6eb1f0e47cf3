"""The quality gate on a rollout that changes the engine lane (docs/quality-gate.md): the canary is judged against
the baseline of the lane it runs BEFORE the change, the lane of its last-known-good manifest (the version its server
runs, proven); the new lane has no baseline yet. Without a manifest (or one written before manifests kept the lane),
the inventory's lane. roles/rollout/tasks/quality_plan.yml's own expressions, rendered by ansible-playbook."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpufleet.fleet.plugins.filter.rollout_quality import rollout_quality_key
from role_flags import render  # tests/support

REPO = Path(__file__).resolve().parents[3]
FACTS = {"gpu_facts": {"gpu_count": 2, "gpus": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]}}


def test_the_key_takes_the_deployed_lane_over_the_inventorys():
    hv = {"ansible_facts": FACTS}
    assert rollout_quality_key(hv, "glm-5", "sglang-cu130", "sglang-cu128")["file"] == (
        "nvidia-h200-x2--glm-5--sglang-cu128.json"
    )
    assert rollout_quality_key(hv, "glm-5", "sglang-cu130", "")["lane"] == "sglang-cu130"


def _plan_task_vars() -> dict:
    tasks = yaml.safe_load((REPO / "roles/rollout/tasks/quality_plan.yml").read_text())
    block = tasks[0]["block"]
    task = next(t for t in block if t["name"] == "The key and the stored baseline of each canary host")
    return {k: task["vars"][k] for k in ("inventory_lane", "deployed_lane", "key")}


@pytest.mark.parametrize(
    ("manifest", "lane"),
    [({"release": "/opt/ml-env/releases/a", "lane": "lab-sim"}, "lab-sim"), (None, "lab-sim-cu130"),
     ({"release": "/opt/ml-env/releases/a"}, "lab-sim-cu130")],
    ids=["last-good-manifest", "no-manifest", "manifest-before-lanes"],
)  # fmt: skip
def test_quality_plan_keys_the_canary_by_the_lane_it_runs_before_the_change(tmp_path, manifest, lane):
    read = {"item": "gpu-01", "failed": manifest is None}
    if manifest is not None:
        read["content"] = base64.b64encode(json.dumps(manifest).encode()).decode()
    # the inventory's lane: ml_env_lock, exported by ml_env's entry point lane as ml_env_lane (the render's play runs
    # sglang_server's flags entry point first, which runs it, as rollout's plan_inputs.yml does)
    host = {"ansible_connection": "local", "ml_env_lock": "lab-sim-cu130", "serving_bench_gpu_class": "NVIDIA H200 x2"}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-01": host}}}))
    extra = {
        **_plan_task_vars(), "item": "gpu-01", "rollout_models": {"gpu-01": "glm-5"},
        "rollout_quality_lkg_read": {"results": [read]}, "rollout_project_dir": str(REPO),
    }  # fmt: skip
    key = render(tmp_path / "hosts.yml", "gpu-01", "{{ key }}", extra, tmp_path)
    assert key["lane"] == lane
    assert key["file"] == f"nvidia-h200-x2--glm-5--{lane}.json"
