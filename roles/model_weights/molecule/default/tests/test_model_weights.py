"""model_weights on lab hosts: staged, verified, fanned out; refusals, resume, corruption; the token stays secret.

The hub is the lab test hub (lab/testhub) started by prepare.yml; its request log (requests.jsonl in the
scenario's ephemeral directory) shows what the hosts asked for. Refusals and faults run through
ansible-playbook (refusals.yml, faults.yml) so their whole output can be searched for the token.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

import pytest
from gpufleet_testinfra import changed_tasks, recap, run_playbook

SCENARIO = Path(__file__).resolve().parents[1]
HUB_DIR = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent")) / "testhub"
COMMIT = "93e8c171601ec816319e60454f222900eb5c1d96"
MODEL_DIR = f"/srv/models/gpufleet-lab--tiny-model/{COMMIT}"
REPO = "gpufleet-lab/tiny-model"


def tokens() -> dict[str, str]:
    return {name: (HUB_DIR / f"{name}_token").read_text().strip() for name in ("good", "noaccess", "wrong")}


def hub_url() -> str:
    return json.loads((HUB_DIR / "testhub.json").read_text())["url"]


def hub_manifest() -> dict[str, str]:
    with urllib.request.urlopen(f"{hub_url()}/mirror/{REPO}/{COMMIT}/manifest.json", timeout=10) as resp:
        return {f["path"]: f["sha256"] for f in json.loads(resp.read())["files"]}


def request_log() -> list[dict]:
    path = HUB_DIR / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ansible_playbook(*args: str):
    return run_playbook(args[-1], *args[:-1], cwd=SCENARIO, env={"ANSIBLE_GATHERING": "implicit"})


def assert_no_token(text: str, where: str) -> None:
    for name, token in tokens().items():
        assert token not in text, f"the {name} token appears in {where}"


@pytest.fixture(params=["mw-seed", "mw-peer"])
def lab_host(request, host_by_name):
    return host_by_name(request.param)


def test_every_file_matches_the_hub_hashes(lab_host):
    expected = hub_manifest()
    out = lab_host.run(f"cd {MODEL_DIR} && sha256sum {' '.join(sorted(expected))}")
    assert out.rc == 0, out.stderr
    got = {line.split()[1]: line.split()[0] for line in out.stdout.splitlines()}
    assert got == expected
    manifest = json.loads(lab_host.file(f"{MODEL_DIR}/.gpufleet-manifest.json").content_string)
    assert manifest["revision"] == COMMIT and manifest["repo_id"] == REPO
    # The pinned commit 1, not main (commit 2 changed the config).
    assert "commit 1" in lab_host.file(f"{MODEL_DIR}/config.json").content_string


def test_no_partial_files_left(lab_host):
    out = lab_host.run(f"find {MODEL_DIR} -name '*.incomplete' -o -name '*.part' -type f")
    assert out.stdout.strip() == ""


def test_fetched_once_from_the_hub_and_fanned_out():
    files = [
        e for e in request_log() if "/resolve/" in e["path"] and e["method"] == "GET" and e["status"] in (200, 206)
    ]
    clients = {e["client"] for e in files}
    assert len(clients) == 1, f"more than one host downloaded from the hub: {clients}"


def test_stand_in_unit_points_at_the_local_directory(lab_host):
    unit = lab_host.file("/etc/systemd/system/mw-model-check.service").content_string
    assert f"--model {MODEL_DIR} " in unit and "--served-model-name tiny-model" in unit
    state = lab_host.run("systemctl show -p ActiveState -p Result mw-model-check.service").stdout
    assert "ActiveState=active" in state and "Result=success" in state, state
    assert "model OK: tiny-model" in lab_host.run("journalctl -u mw-model-check.service --no-pager").stdout


def test_token_file_is_root_only(host_by_name):
    seed = host_by_name("mw-seed")
    token_file = seed.file("/etc/gpufleet/model_weights/hf_token")
    assert token_file.exists and token_file.mode == 0o600 and token_file.user == "root"
    assert token_file.content_string.strip() == tokens()["good"]
    # The peer copied from the seed: it never needed the token.
    assert not host_by_name("mw-peer").file("/etc/gpufleet/model_weights/hf_token").exists


def test_token_absent_from_units_processes_logs_and_files(lab_host):
    token = tokens()["good"]
    assert token not in lab_host.run("ps -eo args").stdout
    assert token not in lab_host.run("journalctl --no-pager -o cat").stdout
    found = lab_host.run(
        f"grep -rlF -e '{token}' /etc /run /var /opt /srv /root /tmp /usr/local /home 2>/dev/null || true"
    )
    assert set(found.stdout.split()) <= {"/etc/gpufleet/model_weights/hf_token"}, found.stdout


def test_refusals_before_any_download():
    before = len(request_log())
    proc = ansible_playbook("-v", "refusals.yml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert recap(proc.stdout)["mw-seed"]["rescued"] == 6, out[-4000:]
    new = request_log()[before:]
    assert not [e for e in new if "/resolve/" in e["path"]], "a file was requested during the refusals"
    assert {e["auth"] for e in new if e["path"].startswith("/api/models/")} >= {"invalid", "valid", "none"}
    assert_no_token(out, "the output of refusals.yml")


def test_interrupted_download_resumes_and_corrupt_shards_are_refetched():
    before = len(request_log())
    proc = ansible_playbook("-v", "faults.yml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    new = request_log()[before:]
    shard3 = [e for e in new if e["path"].endswith("/model-00003-of-00003.safetensors") and e["method"] == "GET"]
    assert any(e.get("dropped") for e in shard3), shard3
    assert any(e["status"] == 206 and e["range"] == "bytes=10485760-" for e in shard3), shard3
    assert any(e.get("corrupted") for e in new), "the corrupt transfer did not happen"
    # Progress lines with bytes, rate and ETA were printed while downloading.
    assert re.search(r"model_weights \[mw-seed\] .*MiB / .*MiB \(\d+%\), .*/s, ETA ", out), out[-4000:]
    assert_no_token(out, "the output of faults.yml")


def test_check_mode_on_the_converged_hosts_changes_nothing():
    proc = ansible_playbook("--check", "converge.yml")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    for host in ("mw-seed", "mw-peer"):
        assert recap(proc.stdout)[host]["changed"] == 0, f"changed in check mode: {changed_tasks(proc.stdout)}"
    assert_no_token(proc.stdout + proc.stderr, "the output of converge.yml --check")
