"""The documented commands are the tested commands: the README's first commands and the lab's day-two commands
(docs/lab.md, "Operating the lab"), run exactly as written (tests/support/doc_commands.py) in a user's shell, on the
default lab they create, with no variable a user would not set.

In order, on one lab (the default one, `gpufleet`, as `make deploy` brings it up: 2 servers and a gateway host that
also runs the monitor):
1. `make deploy` sets the machine up, brings the lab up and runs deploy.yml; every stage ends, each server's deploy
   report (reports/lab/deploy/) says ok with health by generation;
2. the README's curl through the router gets an answer;
3. `ansible-playbook deploy.yml` again changes nothing (every host proven in place), and so does deploy.yml run by
   ansible-runner (the engine of AWX and Automation Platform) with the project and the inventory;
4. a flag written into each server's host layer, then `ansible-playbook playbooks/rollout.yml`: ROLLOUT OK, the
   report (reports/lab/rollout/last.json) of this run with both servers updated, the flag in both units, each server
   restarted once, the locks given back, both workers back in the router;
5. `ansible-playbook playbooks/bench.yml`: reports/lab/fleet-report.html with both servers and their plots;
6. `ansible-playbook playbooks/restart.yml -l gpufleet-02`: that server restarted and healthy in the router again,
   the other untouched;
7. `ansible-playbook playbooks/rollback.yml -l gpufleet-02` brings back the version before the rollout there;
8. `ansible-playbook playbooks/upgrade_plan.yml -e upgrade_plan_to=lab-sim-cu130` shows the migrated flags and
   changes nothing;
9. the quality baseline written from gpufleet-01 as it runs (nothing restarted), then a flag change rolled out with
   the quality gate: the canary passes it against that baseline and both servers run the change;
10. two variants for gpufleet-02, then `ansible-playbook playbooks/tune.yml -e serving_bench_tune_canary=gpufleet-02`:
   the ranking in reports/lab/tune/gpufleet-02.json, the canary back on the inventory's configuration (the same unit)
   and in the router, the other server untouched;
11. `make lab-down` removes the lab.

The default lab's name, subnet and inventory (inventory/lab/hosts.yml) are the user's: the test refuses to start when
a default lab is already up, inventory/lab/host_vars/ exists or a quality baseline of the lab's model and lane is in
benchmarks/baselines/quality/ (someone's lab; nothing of theirs is taken down or overwritten).
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import doc_commands
import pytest
from conftest import ROOT, lab
from fleet_lab import healthy_urls, unit_state, unit_text
from gpufleet_testinfra import changed_tasks, recap
from lab_host import on

LAB_STATE = "/var/lib/gpufleet-lab/gpufleet"
GPU_FACTS_TASK = "gpu_facts : Read GPUs, topology, P2P status and GPU processes (nvidia-smi)]"
SERVERS = ["gpufleet-01", "gpufleet-02"]
GATEWAY = "gpufleet-router-01"
REPORTS = ROOT / "reports/lab"
HOST_VARS = ROOT / "inventory/lab/host_vars"
README_CURL = (
    "curl -s http://10.123.0.4:30000/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": "
    '"glm-5", "messages": [{"role": "user", "content": "What is the capital of France?"}]}\''
)
FLAG = "printf 'sglang_server_args_host:\\n  chunked-prefill-size: 4096\\n' > inventory/lab/host_vars/{}.yml"
FLAG_8192 = "printf 'sglang_server_args_host:\\n  chunked-prefill-size: 8192\\n' > inventory/lab/host_vars/{}.yml"
TUNE_VARIANTS = (
    "printf 'serving_bench_tune_variants:\\n  - {name: mrr-4, args: {max-running-requests: 4}}\\n"
    "  - {name: mrr-32, args: {max-running-requests: 32}}\\n' >> inventory/lab/host_vars/gpufleet-02.yml"
)
BASELINES = ROOT / "benchmarks/baselines/quality"
LAB_BASELINES = "*--glm-5--lab-sim.json"  # the lab's model and lane (the GPU class comes first in the name)


def ok(proc, what: str) -> str:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-5000:]}"
    return proc.stdout


def report(path) -> dict:
    return json.loads(path.read_text())


def flat(text: str) -> str:
    """What the operator reads, whitespace folded: the YAML result format folds and quotes messages ('' for ')."""
    return " ".join(text.split()).replace("''", "'")


@pytest.fixture(scope="module")
def lab_hosts():
    if Path(LAB_STATE).exists() or HOST_VARS.exists() or [*BASELINES.glob(LAB_BASELINES)]:
        pytest.fail(
            f"a default lab ({LAB_STATE}), {HOST_VARS} or a lab baseline in {BASELINES} is there already: this test "
            "runs the README's commands on the default lab and takes it down at the end; `make lab-down` and move "
            "inventory/lab/host_vars and the baseline first",
            pytrace=False,
        )
    started = datetime.datetime.now(datetime.UTC).isoformat()
    try:
        out = ok(doc_commands.run("make deploy", timeout=2400), "make deploy")
        hosts = {h["name"]: h for h in json.loads(lab("instances").stdout)}
        yield {"hosts": hosts, "started": started, "deploy": out}
    finally:
        lab("down", check=False)
        for path in BASELINES.glob(LAB_BASELINES):  # written by the documented baseline command, not committed
            path.unlink()
        for path in HOST_VARS.glob("*.yml") if HOST_VARS.exists() else []:
            path.unlink()
        if HOST_VARS.exists():
            HOST_VARS.rmdir()


def test_make_deploy_runs_every_stage_and_the_readme_curl_answers(lab_hosts):
    assert re.search(r"PLAY RECAP", lab_hosts["deploy"]), lab_hosts["deploy"][-3000:]
    for host in SERVERS:
        r = report(REPORTS / "deploy" / f"{host}.json")
        assert r["finished_at"] >= lab_hosts["started"], r["finished_at"]
        assert r["result"] in ("ok", "unchanged") and r["health"]["ok"], r
    answer = json.loads(ok(doc_commands.run(README_CURL), "the README's curl"))
    assert answer["choices"][0]["message"]["content"].strip(), answer
    # the GPU facts are read once per host per deploy.yml (preflight; the later stages keep them)
    reads = [t for t in lab_hosts["deploy"].split("TASK [")[1:] if t.startswith(GPU_FACTS_TASK)]
    for host in SERVERS:
        assert sum(f"ok: [{host}]" in t or f"changed: [{host}]" in t for t in reads) == 1, reads
    # liveness runs beside each server (on by default) and has seen it generate
    for host in SERVERS:
        state = on(lab_hosts["hosts"][host], "systemctl is-active sglang-server-liveness; "
                   "cat /var/lib/prometheus/node-exporter/gpufleet_liveness.prom")  # fmt: skip
        assert (
            state.startswith("active\n")
            and 'gpufleet_liveness_last_round_timestamp_seconds{unit="sglang-server.service"}' in state
        ), state
    # the rulebook service beside the monitor (the lab's fleet_rulebooks), named in Alertmanager's receiver
    gateway = lab_hosts["hosts"][GATEWAY]
    assert on(gateway, "systemctl is-active gpufleet-rulebook").strip() == "active"
    assert '"http://127.0.0.1:5000/alerts"' in on(gateway, "cat /etc/prometheus/alertmanager.yml")


def test_a_second_deploy_changes_nothing(lab_hosts):
    hosts = lab_hosts["hosts"]
    before = {h: unit_state(hosts[h]) for h in SERVERS}
    out = ok(doc_commands.run("ansible-playbook deploy.yml"), "the second deploy.yml")
    counts = recap(out)
    assert set(counts) >= {*SERVERS, GATEWAY}, counts
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), changed_tasks(out)
    assert {h: unit_state(hosts[h]) for h in SERVERS} == before


def test_deploy_through_ansible_runner_as_automation_platform_runs_it(lab_hosts, tmp_path):
    """ansible-runner (the engine of AWX and Automation Platform) with the project folder and the inventory, as a job
    template gives them: deploy.yml runs with the project's ansible.cfg and changes nothing here either."""
    import ansible_runner

    hosts = lab_hosts["hosts"]
    before = {h: unit_state(hosts[h]) for h in SERVERS}
    (tmp_path / "runner").mkdir()  # the job's private data folder (artifacts, its env), as the platform makes it
    run = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"),
        project_dir=str(ROOT),
        playbook="deploy.yml",
        inventory=str(ROOT / "inventory/lab"),
        envvars={"PATH": doc_commands.user_env()["PATH"]},
        quiet=True,
    )
    assert (run.status, run.rc) == ("successful", 0), run.stdout.read()[-3000:]
    assert run.stats["failures"] == {} and run.stats["changed"] == {}, run.stats
    assert set(run.stats["ok"]) >= {*SERVERS, GATEWAY}, run.stats
    assert {h: unit_state(hosts[h]) for h in SERVERS} == before


def test_a_flag_change_rolls_out_with_the_documented_command(lab_hosts):
    hosts = lab_hosts["hosts"]
    before = {h: unit_state(hosts[h]) for h in SERVERS}
    ok(doc_commands.run("mkdir -p inventory/lab/host_vars"), "mkdir")
    for host in SERVERS:
        ok(doc_commands.run(FLAG.format(host)), "the flag")
    out = ok(doc_commands.run("ansible-playbook playbooks/rollout.yml"), "rollout.yml")
    assert "ROLLOUT OK" in out, out[-3000:]
    last = report(REPORTS / "rollout/last.json")
    assert last["started_at"] >= lab_hosts["started"] and last["result"] == "ok", last
    assert last["hosts"] == dict.fromkeys(SERVERS, "updated"), last["hosts"]
    assert [b for b in last["batches"]] == [[SERVERS[0]], [SERVERS[1]]], last["batches"]
    assert (REPORTS / "rollout" / f"{last['run_id']}.json").exists()
    for host in SERVERS:
        assert "--chunked-prefill-size 4096" in unit_text(hosts[host])
        assert unit_state(hosts[host])["start"] != before[host]["start"]
        deploy = report(REPORTS / "deploy" / f"{host}.json")
        assert deploy["finished_at"] >= last["started_at"] and deploy["result"] == "ok", deploy
    everyone = sorted(f"http://{hosts[h]['address']}:8000" for h in SERVERS)
    assert healthy_urls(hosts[GATEWAY]["address"]) == everyone
    assert last["router_workers"] == {GATEWAY: everyone}
    locks = lab("exec", GATEWAY, "--", "bash", "-c", "ls /var/lib/gpufleet/locks/ 2>/dev/null; true").stdout
    assert "rollout-fleet.lock" not in locks, locks


def test_bench_writes_the_fleet_report_of_every_server(lab_hosts):
    out = ok(doc_commands.run("ansible-playbook playbooks/bench.yml"), "bench.yml")
    assert "reports/lab/fleet-report.html" in out, out[-3000:]
    html = (REPORTS / "fleet-report.html").read_text()
    assert "No benchmark results yet" not in html
    for host in SERVERS:
        assert host in html
        latest = report(REPORTS / "bench" / host / "latest.json")
        assert latest["finished_at"] >= lab_hosts["started"], latest
    assert html.count("data:image/png;base64,") >= len(SERVERS), "the plots are missing"


def test_a_safe_restart_of_one_server(lab_hosts):
    hosts = lab_hosts["hosts"]
    before = {h: unit_state(hosts[h]) for h in SERVERS}
    ok(doc_commands.run("ansible-playbook playbooks/restart.yml -l gpufleet-02"), "restart.yml")
    assert unit_state(hosts["gpufleet-02"])["start"] != before["gpufleet-02"]["start"]
    assert unit_state(hosts["gpufleet-01"]) == before["gpufleet-01"]
    everyone = sorted(f"http://{hosts[h]['address']}:8000" for h in SERVERS)
    assert healthy_urls(hosts[GATEWAY]["address"]) == everyone


def test_rollback_restores_the_version_before_the_rollout(lab_hosts):
    hosts = lab_hosts["hosts"]
    kept = unit_state(hosts["gpufleet-01"])
    ok(doc_commands.run("ansible-playbook playbooks/rollback.yml -l gpufleet-02"), "rollback.yml")
    assert "--chunked-prefill-size 4096" not in unit_text(hosts["gpufleet-02"])
    assert "--chunked-prefill-size 4096" in unit_text(hosts["gpufleet-01"])
    assert unit_state(hosts["gpufleet-01"]) == kept
    deploy = report(REPORTS / "deploy/gpufleet-02.json")
    assert deploy["result"] == "rolled_back" and deploy["rollback"]["healthy"] is True, deploy


def test_the_upgrade_plan_shows_the_flags_of_the_cuda_13_lane_and_changes_nothing(lab_hosts):
    hosts = lab_hosts["hosts"]
    before = {h: unit_state(hosts[h]) for h in SERVERS}
    proc = doc_commands.run("ansible-playbook playbooks/upgrade_plan.yml -e upgrade_plan_to=lab-sim-cu130")
    out = " ".join(proc.stdout.split()).replace("''", "'")  # the YAML result format folds and quotes messages
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "lane lab-sim (sglang 0.5.9, CUDA 12.8) -> lab-sim-cu130 (sglang 0.5.23, CUDA 13.0)" in out
    assert "+ --dsa-decode-backend trtllm" in out
    assert all(c["changed"] == 0 for c in recap(proc.stdout).values())
    assert {h: unit_state(hosts[h]) for h in SERVERS} == before


def test_the_quality_baseline_then_a_gated_rollout_of_a_flag_change(lab_hosts):
    hosts = lab_hosts["hosts"]
    before = {h: unit_state(hosts[h]) for h in SERVERS}
    write = "ansible-playbook playbooks/rollout.yml -l gpufleet-01 -e rollout_quality_gate_write_baseline=true"
    out = flat(ok(doc_commands.run(write), "the quality baseline"))
    (baseline_file,) = BASELINES.glob(LAB_BASELINES)
    baseline = report(baseline_file)
    assert (baseline["host"], baseline["hosts"], baseline["score"]) == ("gpufleet-01", {"gpufleet-01": 1.0}, 1.0)
    written = f"QUALITY BASELINE written (nothing restarted): {baseline_file}: score 1.000 (400/400) from gpufleet-01"
    assert written in out
    assert {h: unit_state(hosts[h]) for h in SERVERS} == before
    for host in SERVERS:
        ok(doc_commands.run(FLAG_8192.format(host)), "the flag")
    out = ok(doc_commands.run("ansible-playbook playbooks/rollout.yml -e rollout_quality_gate_enabled=true"), "gated")
    assert "QUALITY GATE PASSED gpufleet-01: passed the sequential test after " in flat(out), out
    assert " token log-probabilities of 8 prompts (at most 0.02): passed" in flat(out), out
    assert "ROLLOUT OK" in out
    last = report(REPORTS / "rollout/last.json")
    assert last["result"] == "ok" and last["hosts"] == dict.fromkeys(SERVERS, "updated"), last
    assert list(last["quality_gate"]) == ["gpufleet-01"] and last["quality_gate"]["gpufleet-01"]["ok"] is True
    for host in SERVERS:
        assert "--chunked-prefill-size 8192" in unit_text(hosts[host])
        assert unit_state(hosts[host])["start"] != before[host]["start"]
    everyone = sorted(f"http://{hosts[h]['address']}:8000" for h in SERVERS)
    assert healthy_urls(hosts[GATEWAY]["address"]) == everyone


def test_tune_ranks_two_variants_on_one_server_and_leaves_it_as_the_inventory_says(lab_hosts):
    hosts = lab_hosts["hosts"]
    canary_unit, other = unit_text(hosts["gpufleet-02"]), unit_state(hosts["gpufleet-01"])
    ok(doc_commands.run(TUNE_VARIANTS), "the variants")
    tune = "ansible-playbook playbooks/tune.yml -e serving_bench_tune_canary=gpufleet-02"
    out = flat(ok(doc_commands.run(tune), "tune.yml"))
    assert "gpufleet-02 is back on its original configuration" in out, out[-3000:]
    result = report(REPORTS / "tune/gpufleet-02.json")
    assert result["finished_at"] >= lab_hosts["started"], result["finished_at"]
    # --max-running-requests caps the simulated batch (lab/sglang-sim README, "Speed model"): at the lab's top
    # concurrency (16) 4 running at once is far slower than 32
    assert [v["name"] for v in result["ranking"]] == ["mrr-32", "mrr-4"], result["ranking"]
    assert result["restored"] is True and result["control"]["ok"] is True
    assert unit_text(hosts["gpufleet-02"]) == canary_unit and "--max-running-requests 64" in canary_unit
    assert unit_state(hosts["gpufleet-01"]) == other
    everyone = sorted(f"http://{hosts[h]['address']}:8000" for h in SERVERS)
    assert healthy_urls(hosts[GATEWAY]["address"]) == everyone
    assert "Tuning on gpufleet-02" in (REPORTS / "fleet-report.md").read_text()


def test_make_lab_down_removes_the_lab(lab_hosts):
    ok(doc_commands.run("make lab-down"), "make lab-down")
    assert not Path(LAB_STATE).exists()
    # every command the docs mark for the lab ran, as written (a new one must be added to this module)
    assert sorted({c.text for c in doc_commands.marked()} - set(doc_commands.RAN)) == []
