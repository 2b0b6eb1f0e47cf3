"""Staging from an HTTP mirror of a manifest (the seed host or a cache) or from a local path."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.parse
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.module_utils.http_request import open_url
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import (
    MANIFEST,
    MANIFEST_FORMAT,
    PARTIAL,
    StageError,
    hash_file,
    read_json,
)


class MirrorSource:
    """Stager methods for ``source: http`` and ``source: path`` (mixed into Stager)."""

    def _open(self, url: str, headers: dict | None = None):
        sent = {**(self.p.get("headers") or {}), **(headers or {})}
        return open_url(url, headers=sent, timeout=int(self.p.get("timeout") or 60))

    def _manifest_files(self, manifest: dict, where: str) -> tuple[str, dict[str, dict]]:
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), list):
            raise StageError(f"{where} is not a gpufleet model manifest (format {MANIFEST_FORMAT})")
        files = {}
        for f in manifest["files"]:
            name = f.get("path", "")
            if not name or name.startswith("/") or ".." in Path(name).parts:
                raise StageError(f"{where} lists an unsafe path {name!r}")
            if not isinstance(f.get("size"), int) or not isinstance(f.get("sha256"), str) or len(f["sha256"]) != 64:
                raise StageError(f"{where}: {name} needs an integer size and a sha256")
            files[name] = {"size": f["size"], "sha256": f["sha256"].lower()}
        return str(manifest.get("revision") or ""), files

    def stage_http(self) -> None:
        base = (self.p.get("mirror_url") or "").rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise StageError("source=http needs mirror_url, an http(s) URL (model_weights_mirror_url)")
        manifest_url = self.p.get("manifest_url") or f"{base}/manifest.json"
        manifest = self.p.get("manifest")
        if manifest:
            manifest_url = "the given manifest"
        else:
            self.progress.set("plan", f"reading {manifest_url}")
            try:
                with self._open(manifest_url) as resp:
                    manifest = json.loads(resp.read())
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise StageError(
                    f"cannot read the manifest {manifest_url} (model_weights_mirror_url): {exc}. "
                    "Nothing was downloaded."
                ) from None
        revision, files = self._manifest_files(manifest, manifest_url)
        wanted = self.p.get("revision")
        if wanted and wanted != "main" and revision and revision != wanted:
            raise StageError(
                f"the mirror's manifest is for revision {revision}, not model_weights_revision {wanted}. "
                "Nothing was downloaded."
            )
        self.progress.set("verify", "checking the files already on disk")
        bad, verified = self.local_ok(files, self.p.get("verify") == "full")
        self.check_space(files, bad)
        if not self.check_mode:
            self.dest.mkdir(parents=True, exist_ok=True)
        if bad and self.check_mode:
            self.result.update(changed=True, would_fetch=sorted(bad), revision=revision)
            return

        def fetch_one(name: str, force: bool) -> None:
            self._http_fetch(f"{base}/{urllib.parse.quote(name)}", name, files[name]["size"], force)

        if bad:
            verified.update(self._fetch_all(files, bad, fetch_one))
        extra = {k: manifest[k] for k in ("repo_id", "patterns") if k in manifest}
        extra["source"] = "http"
        self.finish(revision, files, verified, extra)

    def _http_fetch(self, url: str, name: str, size: int, force: bool) -> None:
        part = self.dest / PARTIAL / f"{name}.part"
        part.parent.mkdir(parents=True, exist_ok=True)
        if force:
            part.unlink(missing_ok=True)
        attempts = 0
        while True:
            have = part.stat().st_size if part.exists() else 0
            if have > size:
                part.unlink()
                have = 0
            if have == size:
                break
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                with self._open(url, headers) as resp:
                    if have and resp.status != 206:
                        have = 0  # the server ignored the Range: start over
                    if have:
                        self.result["resumed"].append(f"{name}: resumed at byte {have} (Range)")
                    with part.open("ab" if have else "wb") as out:
                        while chunk := resp.read(1024 * 1024):
                            out.write(chunk)
            except (urllib.error.URLError, OSError) as exc:
                if isinstance(exc, urllib.error.HTTPError) and exc.code not in (408, 429, 500, 502, 503, 504):
                    raise StageError(f"{url} answered {exc.code}: {exc.reason}") from None
                attempts += 1
                if attempts > 5:
                    raise StageError(
                        f"downloading {url} failed 6 times ({exc}); the partial file is kept and resumed on the "
                        "next run"
                    ) from None
                time.sleep(min(2**attempts, 10))
                continue
        target = self.dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(part, 0o644)
        os.replace(part, target)

    # -- local path ---------------------------------------------------------------------------------------
    def stage_path(self) -> None:
        src = Path(self.p.get("source_path") or "")
        if not src.is_dir():
            raise StageError(f"model_weights_source_path {src} is not a directory on the host")
        manifest = read_json(src / MANIFEST)
        if manifest:
            revision, files = self._manifest_files(manifest, str(src / MANIFEST))
        else:
            revision = ""
            files = {}
            for p in sorted(src.rglob("*")):
                rel = p.relative_to(src).as_posix()
                if p.is_file() and not rel.startswith((".cache/", PARTIAL + "/", ".gpufleet")):
                    files[rel] = {"size": p.stat().st_size, "sha256": None}
        if not files:
            raise StageError(f"model_weights_source_path {src} holds no files")
        if not manifest:
            # No manifest: the source's own bytes are the reference.
            for name in files:
                files[name]["sha256"] = hash_file(src / name)[0]
        bad, verified = self.local_ok(files, self.p.get("verify") == "full")
        self.check_space(files, bad)
        if bad and self.check_mode:
            self.result.update(changed=True, would_fetch=sorted(bad), revision=revision)
            return
        self.dest.mkdir(parents=True, exist_ok=True)

        def fetch_one(name: str, force: bool) -> None:
            part = self.dest / PARTIAL / f"{name}.part"
            part.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, part)
            target = self.dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(part, 0o644)
            os.replace(part, target)

        if bad:
            verified.update(self._fetch_all(files, bad, fetch_one))
        extra = {k: manifest[k] for k in ("repo_id", "patterns") if k in manifest}
        extra["source"] = "path"
        self.finish(revision, files, verified, extra)
