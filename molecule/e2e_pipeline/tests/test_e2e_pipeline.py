"""deploy.yml end to end on a lab host, then the operations playbooks as separate runs (as an operator
would run them, with the facts deploy.yml cached): each ends with the server proven by a generation, and
each changes what it should and nothing else.

  converge   deploy.yml: preflight, cuda_toolkit (lab CUDA mirror), ml_env (lab wheelhouse), model_weights
             (lab test hub), sglang_server
  again      deploy.yml right after: the new host is proven in place, no stage runs
  restart    playbooks/restart.yml: a new server process, same unit, release, model and flags
  deploy B   playbooks/deploy_server.yml with another flag value (the server stage alone)
  rollback   playbooks/rollback.yml: version A serves again, with the staged model
  hand edit  the unit edited by hand: the next deploy.yml goes through every stage, restores it and records it
  no-op      deploy.yml again: the host is as recorded, proven in place by a generation, no stage runs
  hung       one scheduler rank killed (the unit stays active, the engine no longer generates): a plain deploy.yml
             restarts it and it answers; the same with a new version that fails to start rolls back to the last good
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "roles" / "sglang_server" / "molecule" / "shared"))

from sglang_molecule import ROOT, UNIT_PATH, ask, flag, health, props, report, run_playbook, serving  # noqa: E402

HOST = "e2e-01"
CUDA_HOME = "/usr/local/cuda-12.8"
MODEL_DIR = "/srv/models/gpufleet-lab--tiny-model/93e8c171601ec816319e60454f222900eb5c1d96"


def unit_sha(host) -> str:
    return hashlib.sha256(host.file(UNIT_PATH).content).hexdigest()


def assert_answers(host) -> None:
    assert health(host) == "200"
    assert "Paris" in ask(host, "What is the capital of France?")


@pytest.fixture(scope="module")
def deployed(host):
    """What deploy.yml left: the ml-env release, the serving engine, the unit's checksum."""
    release = host.file("/opt/ml-env/current").linked_to
    return {"release": release, "serving": serving(host), "unit_sha": unit_sha(host), "props": props(host)}


def test_deploy_ran_every_stage_and_the_server_uses_their_results(host, deployed):
    # cuda_toolkit: the toolkit from the lab mirror, held
    assert host.file(f"{CUDA_HOME}/bin/nvcc").exists
    assert "cuda-toolkit-12-8" in host.check_output("apt-mark showhold").split()
    # ml_env: a release built from the lab wheelhouse, `current` pointing at it
    release = deployed["release"]
    assert release.startswith("/opt/ml-env/releases/")
    assert host.run(f"{release}/bin/python -c 'import sglang_sim'").rc == 0
    # model_weights: the pinned commit of the test model, staged and verified
    assert "commit 1" in host.file(f"{MODEL_DIR}/config.json").content_string
    assert host.file(f"{MODEL_DIR}/.gpufleet-manifest.json").exists
    # sglang_server: the engine runs that release, that model, that CUDA
    engine = deployed["serving"]["engine"]
    assert engine is not None, deployed["serving"]["processes"]
    assert engine["argv"][0] == f"{release}/bin/python"
    assert flag(engine["argv"], "--model-path") == MODEL_DIR
    assert engine["env"]["CUDA_HOME"] == CUDA_HOME
    assert deployed["serving"]["server_info"]["model_path"] == MODEL_DIR
    r = report(HOST)
    assert r["result"] == "ok" and r["health"]["ok"] is True
    assert r["versions"]["ml_env_release"] == release
    assert r["comm_profile"] == "no-p2p"  # preflight's derivation for the 8x RTX PRO 6000 PCIe VM
    assert_answers(host)
    # sglang_server_liveness_enabled: false (host_vars): no liveness service beside the server
    assert not host.file("/etc/systemd/system/sglang-server-liveness.service").exists
    assert not host.service("sglang-server-liveness").is_running


def test_a_second_deploy_right_after_the_first_proves_the_new_host_in_place(host, deployed):
    """The first deploy.yml on a new host (the converge) recorded its inputs as they template at its end, with the
    facts its stages gathered (the lab's addresses come from ansible_facts): the next deploy.yml templates them the
    same way and runs no stage. Recorded as the first play saw them (no facts yet on a new host), they differed and
    the second deploy.yml ran every stage again."""
    rc, out = run_playbook("deploy.yml")
    assert rc == 0, out[-4000:]
    assert f"{HOST}: converged, proven in place by a generation" in out, out[-4000:]
    assert serving(host)["engine"]["pid"] == deployed["serving"]["engine"]["pid"]


def test_restart_playbook_restarts_the_same_version(host, deployed):
    rc, out = run_playbook("playbooks/restart.yml")
    assert rc == 0, out[-4000:]
    now = serving(host)
    assert now["engine"] is not None and now["engine"]["pid"] != deployed["serving"]["engine"]["pid"]
    # what changed: only the process; the unit, the release, the model and the flags are the deployed ones
    assert now["engine"]["argv"] == deployed["serving"]["engine"]["argv"]
    assert unit_sha(host) == deployed["unit_sha"]
    assert host.file("/opt/ml-env/current").linked_to == deployed["release"]
    r = report(HOST)
    assert r["result"] == "ok" and "forced (sglang_server_force_restart)" in r["restart_reasons"]
    assert_answers(host)


def test_deploy_b_then_rollback_playbook_restores_a(host, deployed):
    rc, out = run_playbook("playbooks/deploy_server.yml", {"sglang_server_args_host": {"max-running-requests": 32}})
    assert rc == 0, out[-4000:]
    b = serving(host)
    assert flag(b["engine"]["argv"], "--max-running-requests") == "32"
    assert flag(b["engine"]["argv"], "--model-path") == MODEL_DIR  # the server stage alone finds the staged model
    assert_answers(host)

    rc, out = run_playbook("playbooks/rollback.yml")
    assert rc == 0, out[-4000:]
    a = serving(host)
    assert a["engine"] is not None and a["engine"]["pid"] != b["engine"]["pid"]
    assert a["engine"]["argv"] == deployed["serving"]["engine"]["argv"]  # release, model, flags of A
    assert unit_sha(host) == deployed["unit_sha"]
    assert host.file("/opt/ml-env/current").linked_to == deployed["release"]
    r = report(HOST)
    assert r["result"] == "rolled_back" and r["rollback"]["healthy"] is True
    assert_answers(host)


STAGE_PLAYS = 7  # preflight, validate, cuda_toolkit, ml_env, model_weights, server plan, server restart


def test_a_hand_edited_unit_sends_the_next_deploy_through_every_stage_which_repairs_it(host, deployed):
    host.run(f"echo '# edited by hand' >> {UNIT_PATH}")
    before = serving(host)
    rc, out = run_playbook("deploy.yml")
    assert rc == 0, out[-4000:]
    why = re.search(rf"{HOST}: every stage runs: (.*?)'\n", out, re.S)
    assert why and f"{UNIT_PATH} changed" in " ".join(why[1].split()), out[-4000:]
    assert "skipping: no hosts matched" not in out.split("PLAY [SGLang server - restart")[0]
    assert unit_sha(host) == deployed["unit_sha"]  # the rendered unit is back
    assert serving(host)["engine"]["pid"] != before["engine"]["pid"]  # restarted onto it
    r = report(HOST)
    assert r["result"] == "ok" and "converged" not in r and r["health"]["ok"] is True
    assert_answers(host)


def test_the_next_deploy_proves_the_host_in_place_and_skips_every_stage(host, deployed):
    # The deploy.yml of the hand-edit test made the host converged again and recorded it; this one compares inputs
    # and unit with that record, proves the server by a generation and runs no stage at all.
    before = serving(host)
    rc, out = run_playbook("deploy.yml")
    assert rc == 0, out[-4000:]
    assert f"{HOST}: converged, proven in place by a generation" in out, out[-4000:]
    stages = out.split("PLAY [Preflight", 1)[1]
    assert stages.count("skipping: no hosts matched") >= STAGE_PLAYS and "TASK [" not in stages, out[-4000:]
    recap = re.search(rf"^{HOST}\s+: ok=(\d+)\s+changed=(\d+)\s", out, re.M)
    # the check's few tasks, no stage; two of them are the run's own refusals, run once (no server host in the
    # inventory or the --limit, playbooks/servers_present.yml; sglang_server_serial's range, converged.yml), one puts
    # the proven host into the in-memory group sglang_servers_converged that every stage play leaves out
    assert recap and int(recap[1]) <= 8 and recap[2] == "0", out[-2000:]
    assert serving(host)["engine"]["pid"] == before["engine"]["pid"]  # nothing restarted
    r = report(HOST)
    assert r["result"] == "unchanged" and r["health"]["ok"] is True and r["converged"]["fast_path"] is True
    assert r["versions"]["ml_env_release"] == deployed["release"] and r["restart_reasons"] == []
    # the record on the host holds keyed digests (HMAC with the controller's key), never a plain hash of an input
    record = json.loads(host.file("/var/lib/gpufleet/sglang-server/converged.json").content_string)
    assert record["inputs"]["digest"].startswith("hmac-sha256:")
    assert host.file("/var/lib/gpufleet/sglang-server/converged.json").mode == 0o600


def kill_scheduler_rank(host, rank: int) -> None:
    """SIGKILL of one tensor-parallel rank's scheduler (the simulated engine runs one scheduler process per rank, as
    SGLang does): the unit stays active, nothing restarts it, and the engine no longer generates."""
    pid = host.check_output(
        f"ps -eo pid=,args= | grep -E -- 'sglang_sim[.]scheduler .*--tp-rank {rank}( |$)' | awk '{{print $1}}'"
    ).split()
    assert len(pid) == 1, pid
    host.check_output(f"kill -9 {pid[0]}")
    host.check_output("for i in $(seq 60); do curl -s -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health "
                      "| grep -qx 200 || exit 0; sleep 0.5; done; exit 1")  # fmt: skip
    assert props(host)["ActiveState"] == "active" and props(host)["NRestarts"] == "0"


def test_a_killed_scheduler_rank_is_healed_by_a_plain_deploy(host, deployed):
    """A running server with nothing to change that fails its proof is broken: deploy.yml restarts it through the safe
    path (stop with the engine's drain, start, proof; a failed restart rolls back) and says why in the report."""
    kill_scheduler_rank(host, 3)
    before = props(host)
    rc, out = run_playbook("deploy.yml")
    flat = " ".join(out.split())
    assert rc == 0, out[-4000:]
    assert f"{HOST}: restart: running server failed its health check by generation" in flat, out[-4000:]
    assert props(host)["MainPID"] != before["MainPID"]
    assert_answers(host)
    r = report(HOST)
    assert r["result"] == "ok" and r["health"]["ok"] is True
    assert any("running server failed its health check by generation" in x for x in r["restart_reasons"]), r


def test_a_killed_scheduler_rank_and_a_failing_restart_roll_back_to_the_last_good_version(host, deployed):
    """The same broken server, and a deploy whose new version fails to start: the last-known-good version (the one
    the broken server ran) serves again, healthy, and the deploy says it rolled back."""
    env = yaml.safe_load((ROOT / "inventory/lab/group_vars/gpufleet_lab/sglang_server.yml").read_text())
    fault = {**env["sglang_server_environment"], "SGLANG_SIM_FAULT": "crash-after-load"}
    kill_scheduler_rank(host, 3)
    rc, out = run_playbook("deploy.yml", {"sglang_server_environment": fault,
                                          "sglang_server_args_host": {"max-running-requests": 48}})  # fmt: skip
    assert rc != 0, out[-4000:]
    r = report(HOST)
    assert r["result"] == "rolled_back" and r["rollback"]["healthy"] is True, r
    unit = host.file(UNIT_PATH).content_string
    assert "SGLANG_SIM_FAULT" not in unit and "--max-running-requests 48" not in unit
    assert unit_sha(host) == deployed["unit_sha"]
    assert_answers(host)
