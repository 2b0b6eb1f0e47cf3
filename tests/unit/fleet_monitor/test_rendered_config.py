"""The monitor's files as the fleet_monitor role renders them for an inventory (its templates, defaults and derived
vars, through Ansible), checked by the programs that read them (promtool 2.42 from Debian: `check config`,
`check rules`, and `test rules` of the alerts against the rendered thresholds): scrape targets and their labels,
the thresholds per GPU class and model, the probe's module without its key, Alertmanager's webhooks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from role_templates import render_role_templates

REPO = Path(__file__).resolve().parents[3]
FILES = ["prometheus.yml", "gpufleet-thresholds.yml", "blackbox.yml", "alertmanager.yml", "prometheus.default"]
TARGETS = {
    "servers": [
        {"host": "h200-01", "address": "10.0.0.11", "port": 8000, "gpu_class": "NVIDIA H200 x8", "model": "glm-5",
         "in_router": True},
        {"host": "h200-02", "address": "10.0.0.12", "port": 8000, "gpu_class": "NVIDIA H200 x8", "model": "glm-5",
         "in_router": True},
        {"host": "rtx-01", "address": "10.0.0.21", "port": 8000, "gpu_class": "RTX x8", "model": "glm-5",
         "in_router": False},
    ],
    "routers": [{"host": "gw-01", "address": "10.0.0.2", "port": 29000}],
    "nodes": [{"host": "h200-01", "address": "10.0.0.11", "port": 9100, "role": "server"},
              {"host": "gw-01", "address": "10.0.0.2", "port": 9100, "role": "router"}],
}  # fmt: skip


def promtool() -> str:
    return subprocess.run([sys.executable, str(REPO / "tools/promtool.py")], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def render(tmp_path: Path, **extra) -> Path:
    return render_role_templates(tmp_path, "fleet_monitor", FILES, {"fleet_monitor_targets": TARGETS, **extra},
                                 host="mon-01", host_vars={"ansible_host": "10.0.0.5"})  # fmt: skip


def test_rendered_files_are_what_prometheus_reads(tmp_path):
    out = render(
        tmp_path,
        fleet_monitor_thresholds={"NVIDIA H200 x8": {"ttft_p99_s": 2.5}},
        fleet_monitor_probe_api_key="k-123",
        fleet_monitor_webhook_urls=["https://hooks.example/a"],
    )
    tool = promtool()
    check = subprocess.run([tool, "check", "config", "--syntax-only", str(out / "prometheus.yml")],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    rules = subprocess.run([tool, "check", "rules", str(out / "gpufleet-thresholds.yml")], capture_output=True,
                           text=True, check=False)  # fmt: skip
    assert rules.returncode == 0, rules.stdout + rules.stderr

    config = yaml.safe_load((out / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert sorted(jobs) == ["alertmanager", "generation_probe", "node", "prometheus", "sglang", "smg"]
    sglang = [(c["targets"], c["labels"]) for c in jobs["sglang"]["static_configs"]]
    assert sglang[0] == (["10.0.0.11:8000"], {"instance": "h200-01", "gpu_class": "NVIDIA H200 x8", "model": "glm-5"})
    assert len(sglang) == 3  # a server kept out of the router is still watched
    # samples stored under SGLang's `sglang:` names whatever exposition format the engine answered in
    assert jobs["sglang"]["metric_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": "sglang_(.+)", "target_label": "__name__", "replacement": "sglang:$1"}
    ]
    probe = jobs["generation_probe"]
    # one target per server and question, the questions in turn: each every 3 x 15 s
    assert len(probe["static_configs"]) == 9 and probe["scrape_interval"] == "45s"
    assert probe["static_configs"][8]["targets"] == ["http://10.0.0.21:8000/v1/chat/completions"]
    assert [(c["labels"]["question"], c["labels"]["__param_module"]) for c in probe["static_configs"][:3]] == [
        ("What is the capital of France? Answer in one word.", "gpufleet_generation_0"),
        ("What is the capital of Japan? Reply with the city name only.", "gpufleet_generation_1"),
        ("What is 37 + 48? Reply with the number only.", "gpufleet_generation_2"),
    ]
    assert probe["relabel_configs"][-1]["replacement"] == "127.0.0.1:9115"
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.0.0.5:9093"]

    recorded = {}
    for rule in yaml.safe_load((out / "gpufleet-thresholds.yml").read_text())["groups"][0]["rules"]:
        recorded.setdefault(rule["record"], []).append((rule["labels"], rule["expr"]))
    assert sorted(recorded["gpufleet:ttft_p99_threshold_seconds"], key=str) == [
        ({"gpu_class": "NVIDIA H200 x8"}, "vector(2.5)"),  # the inventory's
        ({"gpu_class": "RTX x8"}, "vector(5.0)"),  # the defaults'
    ]
    assert recorded["gpufleet:itl_p99_threshold_seconds"][0] == ({"gpu_class": "NVIDIA H200 x8"}, "vector(0.2)")
    # two workers of glm-5 in the routers (rtx-01 is kept out); the 50% budget keeps 1 in
    assert recorded["gpufleet:router_expected_workers"] == [({"model": "glm-5"}, "vector(2)")]
    assert recorded["gpufleet:router_min_healthy_workers"] == [({"model": "glm-5"}, "vector(1)")]
    assert [labels["worker"] for labels, _ in recorded["gpufleet:router_worker_info"]] == [
        "http://10.0.0.11:8000", "http://10.0.0.12:8000"]  # fmt: skip

    modules = yaml.safe_load((out / "blackbox.yml").read_text())["modules"]
    assert sorted(modules) == ["gpufleet_generation_0", "gpufleet_generation_1", "gpufleet_generation_2"]
    blackbox = modules["gpufleet_generation_0"]["http"]
    assert blackbox["authorization"] == {"type": "Bearer", "credentials_file": "/etc/prometheus/gpufleet-probe.key"}
    body = json.loads(blackbox["body"])
    assert body["messages"][0]["content"].startswith("What is the capital of France?")
    assert body["chat_template_kwargs"] == {"enable_thinking": False}  # a reasoning model answers at once
    assert blackbox["fail_if_body_not_matches_regexp"] == ["(?i)\\bparis\\b"]
    assert modules["gpufleet_generation_2"]["http"]["fail_if_body_not_matches_regexp"] == ["\\b85\\b"]
    assert "k-123" not in "".join((out / f).read_text() for f in FILES)  # the key only in its own file
    am = yaml.safe_load((out / "alertmanager.yml").read_text())
    receivers = {r["name"]: r for r in am["receivers"]}
    assert receivers["gpufleet"]["webhook_configs"][0]["url"] == "https://hooks.example/a"
    # the heartbeat goes to the dead man's switch only, at every flush of its group (every minute: a repeat_interval
    # as long as the group's would send every other minute); with no URL it has no receiver outside
    assert am["route"]["routes"] == [{"matchers": ['alertname="GpufleetWatchdog"'], "receiver": "heartbeat",
                                      "group_wait": "0s", "group_interval": "1m", "repeat_interval": "1s"}]  # fmt: skip
    assert "webhook_configs" not in receivers["heartbeat"]
    (tmp_path / "beat").mkdir()
    beat = yaml.safe_load(
        (
            render(tmp_path / "beat", fleet_monitor_heartbeat_url="https://hc.example/ping/x") / "alertmanager.yml"
        ).read_text()
    )
    assert beat["receivers"][0] == {"name": "heartbeat", "webhook_configs": [{"url": "https://hc.example/ping/x",
                                                                             "send_resolved": False}]}  # fmt: skip
    # Prometheus sends a firing alert again every 15 s: a stopped one's heartbeat leaves Alertmanager within 60 s
    assert "--rules.alert.resend-delay=15s" in (out / "prometheus.default").read_text()


def test_the_rulebook_services_are_alertmanagers_receivers_their_tokens_in_files(tmp_path):
    """fleet_rulebook's webhooks (entry point webhooks): a service on the monitor's host by loopback, with no token; one
    on another host with its token sent from a file only Alertmanager reads (never in alertmanager.yml)."""
    token = "rb-token-0123456789abcdef"
    hooks = [{"host": "mon-01", "url": "http://127.0.0.1:5000/alerts", "token": ""},
             {"host": "eda-01", "url": "http://10.0.0.9:5000/alerts", "token": token}]  # fmt: skip
    out = render(tmp_path, fleet_rulebook_webhooks=hooks, fleet_monitor_webhook_urls=["https://hooks.example/a"])
    text = (out / "alertmanager.yml").read_text()
    assert token not in text
    receivers = {r["name"]: r for r in yaml.safe_load(text)["receivers"]}
    assert receivers["gpufleet"]["webhook_configs"] == [
        {"url": "https://hooks.example/a", "send_resolved": True},
        {"url": "http://127.0.0.1:5000/alerts", "send_resolved": True},
        {"url": "http://10.0.0.9:5000/alerts", "send_resolved": True,
         "http_config": {"authorization": {"credentials_file": "/etc/prometheus/gpufleet-rulebook/eda-01.token"}}},
    ]  # fmt: skip


def test_alerts_fire_against_the_rendered_thresholds(tmp_path):
    """The alert rules and the thresholds the role renders fit: a TTFT p99 above the inventory's 2.5 s fires."""
    out = render(tmp_path, fleet_monitor_thresholds={"NVIDIA H200 x8": {"ttft_p99_s": 2.5}})
    test = {
        "rule_files": [str(REPO / "roles/fleet_monitor/files/rules/gpufleet-alerts.yml"),
                       str(out / "gpufleet-thresholds.yml")],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [
                {"series": 'sglang:time_to_first_token_seconds_bucket{job="sglang",instance="h200-01",'
                           f'gpu_class="NVIDIA H200 x8",model="glm-5",le="{le}"}}', "values": f"0+{n}x40"}
                for le, n in (("1", 0), ("2", 0), ("4", 10), ("+Inf", 10))
            ],
            "alert_rule_test": [{"eval_time": "8m", "alertname": "GpufleetEngineTTFTHigh",
                                 "exp_alerts": [{"exp_labels": {"severity": "warning", "instance": "h200-01",
                                                                "gpu_class": "NVIDIA H200 x8", "model": "glm-5"},
                                                 "exp_annotations": {
                                                     "summary": "p99 time to first token high on h200-01",
                                                     "description": "p99 time to first token on h200-01 (glm-5) over "
                                                     "5m is 3.98s, above the NVIDIA H200 x8 threshold of 2.5s.",
                                                     "runbook": "curl -s http://h200-01:8000/metrics | grep -E "
                                                     "'^sglang:(num_queue_reqs|num_running_reqs|token_usage)'"}}]}],
        }],
    }  # fmt: skip
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    proc = subprocess.run([promtool(), "test", "rules", str(tmp_path / "t.yml")], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
