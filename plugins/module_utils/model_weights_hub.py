"""Staging from the Hugging Face hub (huggingface_hub on the host): plan a revision, fetch, resume offline."""

from __future__ import annotations

import logging
import os
import sys

from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import (
    HF_META_DIR,
    MANIFEST,
    MANIFEST_FORMAT,
    StageError,
    filter_paths,
    free_space,
    is_commit,
    read_json,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_progress import ResumeLog


class HubSource:
    """Stager methods for ``source: hf`` (mixed into Stager)."""

    def _hub_plan(self, api, repo_id: str, revision: str) -> tuple[str, dict[str, dict]]:
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        endpoint = self.p["endpoint"]
        try:
            info = api.model_info(repo_id, revision=revision, files_metadata=True)
        except GatedRepoError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            if self.token():
                why = "the token in model_weights_hf_token has no access to it (request access on the hub page)"
            else:
                why = "no token was given: set model_weights_hf_token (from the vault)"
            raise StageError(
                f"{repo_id} is a gated repository on {endpoint} ({status}): {why}. Nothing was downloaded."
            ) from None
        except RevisionNotFoundError:
            raise StageError(
                f"revision {revision!r} of {repo_id} does not exist on {endpoint}: check model_weights_revision. "
                "Nothing was downloaded."
            ) from None
        except RepositoryNotFoundError:
            raise StageError(
                f"{repo_id} was not found on {endpoint} (or it is private and model_weights_hf_token has no "
                "access): check model_weights_repo_id and model_weights_hf_token. Nothing was downloaded."
            ) from None
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if status == 401:
                raise StageError(
                    f"{endpoint} refused the token in model_weights_hf_token (401 invalid credentials) for "
                    f"{repo_id}: put a valid token in the vault. Nothing was downloaded."
                ) from None
            raise StageError(
                f"the hub at {endpoint} answered {status} for {repo_id}@{revision}: "
                f"{str(exc).splitlines()[0]}. Nothing was downloaded."
            ) from None
        except Exception as exc:  # connection errors from httpx and friends
            raise StageError(
                f"cannot reach the hub at {endpoint} (model_weights_hf_endpoint) for {repo_id}@{revision}: "
                f"{type(exc).__name__}: {exc}. Nothing was downloaded."
            ) from None
        commit = info.sha
        if is_commit(revision) and commit != revision:
            raise StageError(f"the hub answered commit {commit} for pinned revision {revision}")
        siblings = {s.rfilename: s for s in info.siblings or []}
        names = filter_paths(sorted(siblings), self.p.get("allow_patterns"), self.p.get("ignore_patterns"))
        if not names:
            raise StageError(
                f"{repo_id}@{commit} has no files matching model_weights_allow_patterns / model_weights_ignore_patterns"
            )
        files = {}
        for name in names:
            s = siblings[name]
            if s.size is None:
                raise StageError(f"the hub at {endpoint} gave no size for {name}: it is not hub-compatible")
            files[name] = {
                "size": s.size,
                "sha256": s.lfs.sha256 if s.lfs else None,
                "blob_id": None if s.lfs else s.blob_id,
            }
        return commit, files

    def _offline_complete(self, repo_id: str, revision: str) -> bool:
        """A pinned commit already staged and verified: no need to ask the hub (or have a token)."""
        if not is_commit(revision):
            return False
        manifest = read_json(self.dest / MANIFEST)
        if (
            manifest.get("format") != MANIFEST_FORMAT
            or manifest.get("repo_id") != repo_id
            or manifest.get("revision") != revision
            or manifest.get("patterns") != self._patterns()
        ):
            return False
        files = {f["path"]: {"size": f["size"], "sha256": f["sha256"]} for f in manifest.get("files", [])}
        bad, verified = self.local_ok(files, self.p.get("verify") == "full")
        if bad:
            return False
        self.finish(revision, files, verified, self._extra(repo_id))
        self.result.update(offline=True, needed_bytes=0, free_bytes=free_space(self.dest))
        return True

    def _patterns(self) -> dict:
        return {"allow": self.p.get("allow_patterns") or [], "ignore": self.p.get("ignore_patterns") or []}

    def _extra(self, repo_id: str) -> dict:
        return {"repo_id": repo_id, "source": "hf", "patterns": self._patterns()}

    def stage_hf(self) -> None:
        repo_id = self.p.get("repo_id")
        revision = self.p.get("revision") or "main"
        if not repo_id:
            raise StageError("source=hf needs repo_id (model_weights_repo_id)")
        if self._offline_complete(repo_id, revision):
            return
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        os.environ["HF_HUB_ETAG_TIMEOUT"] = str(self.p.get("timeout") or 60)
        os.environ["HF_HUB_DOWNLOAD_TIMEOUT"] = str(self.p.get("timeout") or 60)
        if self.p.get("disable_xet"):
            os.environ["HF_HUB_DISABLE_XET"] = "1"
        # Locks and the (unused) shared cache stay beside the model, not in root's home.
        os.environ["HF_HOME"] = str(self.dest / HF_META_DIR / "home")
        try:
            import huggingface_hub
            from huggingface_hub import HfApi, hf_hub_download
        except ImportError as exc:
            raise StageError(
                f"huggingface_hub is not importable by {sys.executable} ({exc}): run the task with the role's "
                "tool environment (model_weights_hf_tool_dir)/bin/python"
            ) from None
        token = self.token()
        endpoint = self.p["endpoint"].rstrip("/")
        api = HfApi(endpoint=endpoint, token=token, library_name="gpufleet-model-weights")
        self.progress.set("plan", f"asking {endpoint} for the files of {repo_id}@{revision}")
        commit, files = self._hub_plan(api, repo_id, revision)
        self.progress.set("verify", "checking the files already on disk")
        bad, verified = self.local_ok(files, self.p.get("verify") == "full")
        self.check_space(files, bad)
        if not self.check_mode:
            self.dest.mkdir(parents=True, exist_ok=True)
        self.result["huggingface_hub_version"] = huggingface_hub.__version__
        if bad and self.check_mode:
            self.result.update(changed=True, would_fetch=sorted(bad), revision=commit)
            return
        if bad:
            resume_log = ResumeLog()
            hf_logger = logging.getLogger("huggingface_hub")
            hf_logger.addHandler(resume_log)

            def fetch_one(name: str, force: bool) -> None:
                try:
                    hf_hub_download(
                        repo_id,
                        name,
                        revision=commit,
                        local_dir=str(self.dest),
                        endpoint=endpoint,
                        token=token,
                        force_download=force,
                        etag_timeout=float(self.p.get("timeout") or 60),
                        library_name="gpufleet-model-weights",
                    )
                except Exception as exc:
                    raise StageError(
                        f"downloading {name} of {repo_id}@{commit} from {endpoint} failed: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. Files completed so "
                        "far are kept; run again to continue."
                    ) from None

            try:
                verified.update(self._fetch_all(files, bad, fetch_one))
            finally:
                hf_logger.removeHandler(resume_log)
                self.result["resumed"] = resume_log.messages
        if not self.check_mode:
            self.finish(commit, files, verified, self._extra(repo_id))
        self.result["revision"] = commit
