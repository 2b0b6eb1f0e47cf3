"""The staging module's logic (model_weights_stage.Stager) against the lab test hub on loopback."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import GOOD, NOACCESS, params

needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("huggingface_hub") is None, reason="needs huggingface_hub (project dev dependency)"
)


def stage(stage_mod, hub, dest, check_mode=False, **overrides):
    p = params(dest=str(dest), endpoint=hub.url, **overrides)
    return stage_mod.Stager(p, check_mode=check_mode).run()


@needs_hf
def test_stage_verify_and_idempotent_offline(stage_mod, hub, tmp_path, token_file):
    dest = tmp_path / "model"
    commit = hub.refs["v1"]
    res = stage(stage_mod, hub, dest, revision=commit, token_file=token_file(GOOD))
    assert res["changed"] and res["revision"] == commit and len(res["fetched"]) == 9
    manifest = json.loads((dest / ".gpufleet-manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == hub.manifest(commit)
    before = len(hub.log())
    again = stage(stage_mod, hub, dest, revision=commit, token_file=None)  # no token, no network needed
    assert not again["changed"] and again["offline"] and len(hub.log()) == before


@needs_hf
def test_check_mode_plans_without_writing(stage_mod, hub, tmp_path, token_file):
    dest = tmp_path / "model"
    res = stage(stage_mod, hub, dest, check_mode=True, revision=hub.refs["main"], token_file=token_file(GOOD))
    assert res["changed"] and len(res["would_fetch"]) == 9 and not dest.exists()
    assert not [e for e in hub.log() if "/resolve/" in e["path"]]


@needs_hf
@pytest.mark.parametrize(
    ("token", "expect"),
    [("hf_unknown_0000", "401 invalid credentials"), (NOACCESS, "has no access"), (None, "no token was given")],
)
def test_refusals_name_the_variable_and_download_nothing(stage_mod, hub, tmp_path, token_file, token, expect):
    dest = tmp_path / "model"
    with pytest.raises(stage_mod.StageError) as exc:
        stage(stage_mod, hub, dest, revision=hub.refs["main"], token_file=token_file(token) if token else None)
    assert "model_weights_hf_token" in str(exc.value) and expect in str(exc.value)
    assert "Nothing was downloaded" in str(exc.value) or token is None
    assert not dest.exists() and not [e for e in hub.log() if "/resolve/" in e["path"]]
    if token:
        assert token not in str(exc.value)


@needs_hf
def test_too_little_space_is_refused_first(stage_mod, hub, tmp_path, token_file, monkeypatch):
    monkeypatch.setattr(stage_mod, "free_space", lambda dest: 4 * 1024 * 1024)
    with pytest.raises(stage_mod.StageError) as exc:
        stage(stage_mod, hub, tmp_path / "m", revision=hub.refs["main"], token_file=token_file(GOOD))
    msg = str(exc.value)
    assert "not enough disk space" in msg and "model_weights_root" in msg and "model_weights_headroom" in msg
    assert not [e for e in hub.log() if "/resolve/" in e["path"]]


@needs_hf
def test_unknown_revision_names_the_variable(stage_mod, hub, tmp_path, token_file):
    with pytest.raises(stage_mod.StageError, match="model_weights_revision"):
        stage(stage_mod, hub, tmp_path / "m", revision="0" * 40, token_file=token_file(GOOD))


@needs_hf
def test_corrupt_local_file_is_refetched(stage_mod, hub, tmp_path, token_file):
    dest = tmp_path / "model"
    commit = hub.refs["main"]
    stage(stage_mod, hub, dest, revision=commit, token_file=token_file(GOOD))
    shard = dest / "model-00001-of-00003.safetensors"
    with shard.open("r+b") as fh:
        fh.seek(100)
        fh.write(b"corrupt")
    res = stage(stage_mod, hub, dest, revision=commit, token_file=token_file(GOOD))
    assert res["fetched"] == [shard.name] and res["refetched"][0].startswith(shard.name + ": sha256")
    assert json.loads((dest / ".gpufleet-manifest.json").read_text())


@needs_hf
def test_corrupt_transfer_is_detected_and_refetched(stage_mod, hub, tmp_path, token_file):
    hub.faults(corrupt_once={"path": "model-00002-of-00003.safetensors"})
    res = stage(stage_mod, hub, tmp_path / "m", revision=hub.refs["main"], token_file=token_file(GOOD))
    assert any("after download 1" in r for r in res["refetched"])


@needs_hf
def test_file_that_stays_corrupt_fails(stage_mod, hub, tmp_path, token_file, monkeypatch):
    monkeypatch.setattr(stage_mod, "hash_file", lambda path: ("0" * 64, "0" * 40))
    with pytest.raises(stage_mod.StageError, match="still corrupt"):
        stage(stage_mod, hub, tmp_path / "m", revision=hub.refs["main"], token_file=token_file(GOOD), retries=1)


@needs_hf
def test_interrupted_download_resumes(stage_mod, hub, tmp_path, token_file):
    hub.faults(drop_once={"path": "model-00003-of-00003.safetensors", "after_bytes": 11_000_000})
    res = stage(stage_mod, hub, tmp_path / "m", revision=hub.refs["main"], token_file=token_file(GOOD))
    assert res["resumed"] and not res["refetched"]


@needs_hf
def test_progress_file(stage_mod, hub, tmp_path, token_file):
    progress = tmp_path / "progress.json"
    stage(
        stage_mod,
        hub,
        tmp_path / "m",
        revision=hub.refs["main"],
        token_file=token_file(GOOD),
        progress_file=str(progress),
    )
    data = json.loads(progress.read_text())
    assert data["phase"] == "done" and data["bytes_total"] == data["bytes_done"] > 0


def test_http_mirror_with_manifest_and_resume(stage_mod, hub, tmp_path):
    commit = hub.refs["main"]
    mirror = f"{hub.url}/mirror/gpufleet-lab/tiny-model/{commit}"
    dest = tmp_path / "m"
    partial = dest / ".gpufleet-partial"
    partial.mkdir(parents=True)
    src = hub.data / "repos" / "gpufleet-lab/tiny-model" / commit / "model-00003-of-00003.safetensors"
    (partial / "model-00003-of-00003.safetensors.part").write_bytes(src.read_bytes()[:5_000_000])
    res = stage(stage_mod, hub, dest, source="http", mirror_url=mirror, revision=commit)
    assert any("resumed at byte 5000000" in r for r in res["resumed"]) and res["revision"] == commit
    assert not stage(stage_mod, hub, dest, source="http", mirror_url=mirror, revision=commit)["changed"]
    with pytest.raises(stage_mod.StageError, match="model_weights_revision"):
        stage(stage_mod, hub, tmp_path / "x", source="http", mirror_url=mirror, revision="a" * 40)


def test_path_source_copies_and_verifies(stage_mod, hub, tmp_path):
    commit = hub.refs["main"]
    src = hub.data / "repos" / "gpufleet-lab/tiny-model" / commit
    res = stage(stage_mod, hub, tmp_path / "m", source="path", source_path=str(src))
    assert res["changed"] and len(res["fetched"]) == 9
    assert (tmp_path / "m" / "config.json").read_bytes() == (src / "config.json").read_bytes()


def test_unsafe_manifest_paths_are_refused(stage_mod, hub, tmp_path):
    bad = {"format": "gpufleet-model-manifest/1", "files": [{"path": "../etc/x", "size": 1, "sha256": "0" * 64}]}
    with pytest.raises(stage_mod.StageError, match="unsafe path"):
        stage(stage_mod, hub, tmp_path / "m", source="http", mirror_url=hub.url, manifest=bad)


def test_token_file_is_read_not_passed(stage_mod, tmp_path):
    path = tmp_path / "tok"
    path.write_text("hf_secret\n")
    s = stage_mod.Stager(params(dest=str(tmp_path / "m"), token_file=str(path)))
    assert s.token() == "hf_secret"
    assert stage_mod.Stager(params(dest=str(tmp_path / "m"), token_file=None)).token() is False
    assert "hf_secret" not in json.dumps(s.result)
    assert os.stat(path)


def test_filter_and_human(stage_mod):
    files = importlib.import_module("ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files")
    assert files.filter_paths(["a.json", "b.bin", "c/d.json"], ["*.json"], ["c/*"]) == ["a.json"]
    assert stage_mod.human(1536) == "1.50 KiB" and files.is_commit("a" * 40) and not files.is_commit("main")


def test_wait_plugin_progress_line():
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "plugins/action/job_wait.py"
    spec = importlib.util.spec_from_file_location("job_wait", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    line = mod.progress_line(
        "model_weights",
        "h1",
        "m@abc",
        {
            "phase": "download",
            "bytes_done": 1 << 30,
            "bytes_total": 4 << 30,
            "rate_bps": 50 << 20,
            "eta_s": 61,
            "files_done": 1,
            "files_total": 4,
            "current": ["a.safetensors"],
        },
    )
    assert line == (
        "model_weights [h1] m@abc: 1.0 GiB / 4.0 GiB (25%), 50.0 MiB/s, ETA 1m01s, files 1/4 (a.safetensors)"
    )
