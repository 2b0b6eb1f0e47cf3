"""A baseline run's baseline comes from all the hosts of its GPU class, model and lane (docs/quality-gate.md,
"Writing baselines"): with rollout_quality_gate_baseline_rule agree nothing is written while they score differently,
and the run fails naming each host's score; max and median write the best or the median host's record and warn.
The filter rollout_quality_baselines, then roles/rollout/tasks/quality_baseline.yml's own tasks run by
ansible-playbook on three local hosts (the issue's case: one host 37/38, two 38/38)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter.rollout_quality import rollout_quality_baselines
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_quality_eval import baseline_record
from role_flags import local_ansible_env  # tests/support

REPO = Path(__file__).resolve().parents[3]
# The case was a set of 38 items: the first 38 of the project's set (the rule does not depend on the items)
_PROJECT_SET = json.loads((REPO / "roles/rollout/files/quality_eval/gpufleet-eval-v2.json").read_text())
EVAL_SET = {**_PROJECT_SET, "items": _PROJECT_SET["items"][:38]}
IDS = [item["id"] for item in EVAL_SET["items"]]
H200 = {"gpu_class": "NVIDIA H200 x8", "model": "glm-5", "lane": "sglang-cu128"}
FILE = "nvidia-h200-x8--glm-5--sglang-cu128.json"


def record(host: str, missed=(), key=H200) -> dict:
    """A host's baseline record as module sglang_quality_eval returns it, every item right but ``missed``."""
    measured = {"items": [{"id": i, "ok": i not in missed} for i in IDS], "engine_version": "0.5.9"}
    return baseline_record(measured, key, EVAL_SET, host, "2026-12-06T08:00:00Z")


def test_hosts_that_disagree_write_no_baseline_and_each_hosts_score_is_named():
    """The issue's case: gpu-01 37/38 first in the inventory, gpu-02 and gpu-03 38/38. The first host's 0.974 used to
    become the baseline (and a lower floor) without a word."""
    records = [record("gpu-01", missed=["arith-003"]), record("gpu-02"), record("gpu-03")]
    out = rollout_quality_baselines(records, "agree")
    assert out["write"] == [] and out["warnings"] == []
    assert out["refused"] == [
        "NVIDIA H200 x8, glm-5, sglang-cu128: the hosts disagree: gpu-01 0.974 (37/38), gpu-02 1.000 (38/38), "
        "gpu-03 1.000 (38/38) (gpu-01 missed arith-003, which gpu-02 answered)"
    ]
    # another key whose hosts agree is not written either: the run writes all its baselines or none
    b200 = {**H200, "gpu_class": "NVIDIA B200 x8"}
    out = rollout_quality_baselines(records + [record("gpu-09", key=b200)], "agree")
    assert out["write"] == [] and len(out["refused"]) == 1


def test_hosts_that_agree_write_one_baseline_listing_every_host():
    out = rollout_quality_baselines([record("gpu-01", ["arith-012"]), record("gpu-02", ["arith-012"])], "agree")
    assert out["refused"] == [] and out["warnings"] == []
    (written,) = out["write"]
    assert written["file"] == FILE
    assert written["record"]["host"] == "gpu-01" and written["record"]["correct"] == 37
    assert written["record"]["hosts"] == {"gpu-01": 0.9737, "gpu-02": 0.9737}
    assert written["record"]["baseline_rule"] == "agree"


@pytest.mark.parametrize(
    ("rule", "missed", "host", "correct"),
    [
        ("max", {"gpu-01": ["arith-003"]}, "gpu-02", 38),
        ("median", {"gpu-01": ["arith-003"]}, "gpu-02", 38),
        ("median", {"gpu-01": ["arith-003", "arith-011"], "gpu-02": ["arith-003"]}, "gpu-02", 37),
        ("median", {"gpu-02": ["arith-003"], "gpu-03": ["arith-003"]}, "gpu-02", 37),
    ],
    ids=["max", "median-one-low", "median-of-three-scores", "median-two-low"],
)
def test_max_and_median_write_the_chosen_hosts_record_and_warn(rule, missed, host, correct):
    records = [record(h, missed.get(h, ())) for h in ("gpu-01", "gpu-02", "gpu-03")]
    out = rollout_quality_baselines(records, rule)
    assert out["refused"] == []
    (written,) = out["write"]
    assert written["record"]["host"] == host and written["record"]["correct"] == correct
    assert written["record"]["baseline_rule"] == rule and set(written["record"]["hosts"]) == {
        "gpu-01",
        "gpu-02",
        "gpu-03",
    }
    (warning,) = out["warnings"]
    assert warning.startswith("NVIDIA H200 x8, glm-5, sglang-cu128: the hosts disagree: gpu-01 ")
    assert warning.endswith(f"the baseline is {host} {correct / 38:.3f} ({correct}/38) "
                            f"(rollout_quality_gate_baseline_rule={rule})")  # fmt: skip


def test_the_median_of_two_hosts_is_the_higher():
    out = rollout_quality_baselines([record("gpu-01", ["arith-003"]), record("gpu-02")], "median")
    assert out["write"][0]["record"]["host"] == "gpu-02"


def test_an_unknown_rule_is_an_error_naming_the_variable_and_the_choices():
    with pytest.raises(AnsibleFilterError, match=r"rollout_quality_gate_baseline_rule='min': choose one of agree, max"):
        rollout_quality_baselines([record("gpu-01")], "min")


# ---------------------------------------------------------------- the role's tasks, run by ansible-playbook

FIRST = "Quality baseline - one baseline per GPU class, model and lane, from all the hosts of each"


def baseline_run(tmp_path: Path, rule: str) -> tuple[subprocess.CompletedProcess, Path]:
    """quality_baseline.yml from its baseline task on, on three local hosts whose measured records are the issue's."""
    tasks = yaml.safe_load((REPO / "roles/rollout/tasks/quality_baseline.yml").read_text())
    start = next(i for i, t in enumerate(tasks) if t["name"] == FIRST)
    (tmp_path / "tasks.yml").write_text(yaml.safe_dump(tasks[start:], sort_keys=False))
    hosts = {
        h: {"ansible_connection": "local", "rollout_quality_measured": {"baseline_record": record(h, missed)}}
        for h, missed in (("gpu-01", ["arith-003"]), ("gpu-02", []), ("gpu-03", []))
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.import_tasks": str(tmp_path / "tasks.yml")}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    out = tmp_path / "baselines"
    extra = {"rollout_quality_gate_baseline_rule": rule, "rollout_quality_gate_baseline_dir": str(out),
             "rollout_report_dir": str(tmp_path / "reports" / "rollout")}  # fmt: skip
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
         str(tmp_path / "play.yml"), "-e", json.dumps(extra)],
        cwd=REPO, env=local_ansible_env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc, out


def test_the_baseline_run_refuses_hosts_that_disagree_and_writes_nothing(tmp_path):
    proc, out = baseline_run(tmp_path, "agree")
    text = " ".join(proc.stdout.split())
    assert proc.returncode != 0
    assert (
        "QUALITY BASELINE NOT WRITTEN (rollout_quality_gate_baseline_rule=agree): NVIDIA H200 x8, glm-5, sglang-cu128: "
        "the hosts disagree: gpu-01 0.974 (37/38), gpu-02 1.000 (38/38), gpu-03 1.000 (38/38) (gpu-01 missed "
        "arith-003, which gpu-02 answered)" in text
    ), text[-3000:]
    assert "choose -e rollout_quality_gate_baseline_rule=median" in text
    assert not out.exists()


def test_the_baseline_run_with_median_writes_the_median_host_and_warns(tmp_path):
    proc, out = baseline_run(tmp_path, "median")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0, text[-3000:]
    written = json.loads((out / FILE).read_text())
    assert written["host"] == "gpu-02" and written["score"] == 1.0 and written["baseline_rule"] == "median"
    assert written["hosts"] == {"gpu-01": 0.9737, "gpu-02": 1.0, "gpu-03": 1.0}
    assert f"{out}/{FILE}: score 1.000 (38/38) from gpu-02" in text
    assert "WARNING: NVIDIA H200 x8, glm-5, sglang-cu128: the hosts disagree: gpu-01 0.974 (37/38)" in text
