"""Bad monitor input is refused before any change, naming the variable and the fix: thresholds for a GPU class no
server has, a threshold that is not a number of seconds, Prometheus and Alertmanager on every interface without the
setting that says so, the former single probe question, a probe without a question (playbooks/monitoring.yml's first
play, which deploy.yml runs in its validation stage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from role_flags import local_ansible_env

REPO = Path(__file__).resolve().parents[3]
LOCAL = f"ansible_connection: local, ansible_python_interpreter: {sys.executable}"
INVENTORY = f"""
all:
  children:
    sglang_servers:
      hosts:
        gpu-01: {{ansible_host: 192.0.2.11, serving_bench_gpu_class: "NVIDIA H200 x8", {LOCAL}}}
    fleet_monitors:
      hosts:
        mon-01: {{ansible_host: 192.0.2.5, {LOCAL}}}
"""


def run(tmp_path: Path, extra: dict, playbook: str = "playbooks/monitoring.yml") -> tuple[int, str]:
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), playbook,
         "-e", f"@{tmp_path / 'extra.json'}", "--check"],
        cwd=REPO, env=local_ansible_env(), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"fleet_monitor_thresholds": {"NVIDIA B200 x8": {"ttft_p99_s": 2}}},
         "fleet_monitor_thresholds names GPU class \"NVIDIA B200 x8\", which no server has (the fleet's classes: "
         "[\"NVIDIA H200 x8\"]); fix the key or remove the entry."),
        ({"fleet_monitor_thresholds": {"NVIDIA H200 x8": {"ttft_p99_s": "fast"}}},
         "\"NVIDIA H200 x8\": ttft_p99_s must be a number of seconds above 0, got \"fast\"."),
        ({"fleet_monitor_thresholds": {"NVIDIA H200 x8": {"ttft_p99": 2}}},
         "\"NVIDIA H200 x8\": unknown threshold ttft_p99 (known: ttft_p99_s, itl_p99_s)."),
        ({"fleet_monitor_thresholds": {"NVIDIA H200 x8": 3}},
         "fleet_monitor_thresholds[\"NVIDIA H200 x8\"] must be a mapping {ttft_p99_s, itl_p99_s}, got 3."),
        ({"fleet_monitor_listen_host": "0.0.0.0"},
         "fleet_monitor_listen_host=0.0.0.0 would expose Prometheus (9090) and Alertmanager (9093) on every interface "
         "of mon-01"),
        ({"fleet_monitor_probe_prompt": "Who wrote Hamlet?"},
         "fleet_monitor_probe_prompt / fleet_monitor_probe_expect are no longer inputs: the probe takes turns over "
         "fleet_monitor_probe_questions. Fix: fleet_monitor_probe_questions as a list of {prompt, expect}"),
        ({"fleet_monitor_probe_questions": []},
         "fleet_monitor_probe_questions is empty: the generation probe needs at least one question."),
    ],
)  # fmt: skip
def test_bad_monitor_input_is_refused_before_any_change(tmp_path, extra, message):
    rc, out = run(tmp_path, extra)
    assert rc == 2, out[-3000:]
    assert message in out, out[-3000:]
    # the refusal is in the first play: node-exporter and the monitor never started
    assert "Monitoring - node-exporter on every host" not in out


def test_listening_on_every_interface_is_accepted_when_the_inventory_says_so(tmp_path):
    extra = {"fleet_monitor_listen_host": "0.0.0.0", "fleet_monitor_listen_on_all_interfaces": True,
             "fleet_monitor_thresholds": {"NVIDIA H200 x8": {"ttft_p99_s": 2.5}}}  # fmt: skip
    rc, out = run(tmp_path, extra, "playbooks/monitoring_validate.yml")
    assert rc == 0 and "mon-01 : ok=" in out and "failed=0" in out, out[-3000:]
