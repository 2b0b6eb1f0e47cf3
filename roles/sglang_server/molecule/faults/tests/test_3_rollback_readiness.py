"""The rollback's readiness bound comes from the version it restores: the last good version
needs longer to get ready than the new version's short sglang_server_ready_timeout_s allows. The new version
fails its readiness wait; the rollback waits as long as the restored version needs (its manifest records
ready_after_s and the ready_timeout_s it was proven under) and it serves again."""

import json
import re

import pytest
from sglang_molecule import LAB_ENV, UNIT_PATH, ask, health, props, report, run_playbook, serving

HOST = "sglang-01"
SLOW = {"sglang_server_environment": {**LAB_ENV, "SGLANG_SIM_FAULT": "slow-start=16"}}  # about 18 s to ready
SHORT = 4  # the new version's readiness timeout: shorter than the slow version needs


@pytest.fixture(scope="module")
def slow_good_run(host):
    rc, out = run_playbook("playbooks/deploy_server.yml", SLOW)
    assert rc == 0, out[-3000:]
    return out


@pytest.fixture(scope="module")
def slow_good(host, slow_good_run):
    return json.loads(host.file("/var/lib/gpufleet/sglang-server/last-good/manifest.json").content_string)


def test_a_slow_start_prints_its_phase_while_the_playbook_waits(slow_good_run):
    # job_wait's progress lines (every sglang_server_progress_interval_s, 5 s on the lab) name the phase while
    # /health does not answer 200 yet; the last line may be the final record (ready), when the job wrote it
    # just before job_wait's look (a loaded lab)
    lines = re.findall(r"sglang_server \[sglang-01\] sglang-server.service: (.+)", slow_good_run)
    waiting = [line for line in lines if re.search(r"after [\d.]+ s \(/health (503|no answer)\)", line)]
    assert waiting, slow_good_run[-3000:]
    assert lines[: len(waiting)] == waiting and len(lines) - len(waiting) <= 1, lines


def test_last_good_records_what_it_needed(slow_good):
    assert slow_good["ready_after_s"] > SHORT + 2
    assert slow_good["ready_timeout_s"] >= slow_good["ready_after_s"]


def test_rollback_waits_for_the_slow_last_good_version(host, slow_good):
    new = {**SLOW, "sglang_server_args_host": {"max-running-requests": 32}, "sglang_server_ready_timeout_s": SHORT}
    rc, out = run_playbook("playbooks/deploy_server.yml", new)
    assert rc != 0
    assert "ROLLED BACK: restored the last-known-good version" in out, out[-3000:]
    r = report(HOST)
    assert r["result"] == "rolled_back" and r["failure"]["phase"] == "start"
    assert r["rollback"]["healthy"] is True
    assert r["restart"]["rollback"]["engine_start_to_ready_s"] > SHORT  # it needed more than the new bound
    assert props(host)["ActiveState"] == "active" and health(host) == "200"
    assert "--max-running-requests 64" in host.file(UNIT_PATH).content_string
    assert serving(host)["engine"]["env"]["SGLANG_SIM_FAULT"] == SLOW["sglang_server_environment"]["SGLANG_SIM_FAULT"]
    assert "Paris" in ask(host, "What is the capital of France?")
