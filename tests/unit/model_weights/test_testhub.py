"""The lab test hub against the real huggingface_hub client: metadata, auth, gating, revisions, Range."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import GOOD, NOACCESS, REPO_ID

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RevisionNotFoundError  # noqa: E402


def test_model_info_lists_sizes_and_hashes(hub):
    info = HfApi(endpoint=hub.url, token=GOOD).model_info(REPO_ID, revision="v1", files_metadata=True)
    assert info.sha == hub.refs["v1"]
    shards = [s for s in info.siblings if s.rfilename.endswith(".safetensors")]
    assert len(shards) == 3 and all(s.lfs and len(s.lfs.sha256) == 64 for s in shards)
    assert {s.rfilename: s.lfs.sha256 for s in shards} == {
        k: v for k, v in hub.manifest(hub.refs["v1"]).items() if k.endswith(".safetensors")
    }
    small = next(s for s in info.siblings if s.rfilename == "config.json")
    assert small.lfs is None and len(small.blob_id) == 40 and small.size > 0


def test_tree_listing_matches(hub):
    files = list(HfApi(endpoint=hub.url, token=GOOD).list_repo_tree(REPO_ID, revision="main", recursive=True))
    assert {f.path for f in files} == set(hub.manifest(hub.refs["main"]))


def test_snapshot_download_at_a_pinned_revision(hub, tmp_path):
    path = snapshot_download(REPO_ID, revision=hub.refs["v1"], local_dir=tmp_path / "m", token=GOOD, endpoint=hub.url)
    assert "commit 1" in (tmp_path / "m" / "config.json").read_text()
    main = snapshot_download(REPO_ID, revision="main", local_dir=tmp_path / "n", token=GOOD, endpoint=hub.url)
    assert "commit 2" in (tmp_path / "n" / "config.json").read_text()
    assert path != main


@pytest.mark.parametrize(
    ("token", "error", "status"),
    [(False, GatedRepoError, 401), (NOACCESS, GatedRepoError, 403), ("hf_unknown", HfHubHTTPError, 401)],
)
def test_gated_and_bad_tokens_are_refused(hub, token, error, status):
    with pytest.raises(error) as exc:
        HfApi(endpoint=hub.url, token=token).model_info(REPO_ID)
    assert exc.value.response.status_code == status
    assert all(e["auth"] != "valid" or token == NOACCESS for e in hub.log())


def test_unknown_revision(hub):
    with pytest.raises(RevisionNotFoundError):
        HfApi(endpoint=hub.url, token=GOOD).model_info(REPO_ID, revision="f" * 40)


def test_public_alias_needs_no_token(hub):
    info = HfApi(endpoint=hub.url, token=False).model_info("gpufleet-lab/tiny-model-public")
    assert info.sha == hub.refs["main"]


def test_dropped_connection_is_resumed_with_range(hub, tmp_path):
    name = "model-00003-of-00003.safetensors"
    hub.faults(drop_once={"path": name, "after_bytes": 11_000_000})
    path = hf_hub_download(REPO_ID, name, revision="main", local_dir=tmp_path, token=GOOD, endpoint=hub.url)
    gets = [e for e in hub.log() if e["method"] == "GET" and e["path"].endswith(name)]
    assert gets[0]["dropped"] and gets[1]["status"] == 206 and gets[1]["range"] == "bytes=10485760-"
    import hashlib

    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == hub.manifest(hub.refs["main"])[name]


def test_token_is_never_logged(hub):
    HfApi(endpoint=hub.url, token=GOOD).model_info(REPO_ID)
    assert GOOD not in repr(hub.log())
