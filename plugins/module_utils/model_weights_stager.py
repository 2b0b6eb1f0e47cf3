"""Plans, checks and stages one model directory: local state, disk space, parallel fetches, the manifest.

The sources are mixins: model_weights_hub (Hugging Face hub) and model_weights_mirror (HTTP mirror, path).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import (
    HF_META_DIR,
    MANIFEST,
    MANIFEST_FORMAT,
    STATE,
    StageError,
    free_space,
    hash_file,
    human,
    read_json,
    write_json,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_hub import HubSource
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_mirror import MirrorSource
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_progress import Progress


class Stager(HubSource, MirrorSource):
    """Plans, checks and stages one model directory. ``params`` are the module's options."""

    def __init__(self, params: dict, check_mode: bool = False, warn=None):
        self.p = params
        self.check_mode = check_mode
        self.warn = warn or (lambda msg: None)
        self.dest = Path(params["dest"])
        self.progress = Progress(params.get("progress_file"), self.dest)
        self.result: dict = {"path": str(self.dest), "changed": False, "fetched": [], "refetched": [], "resumed": []}
        self._sums: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    # -- token --------------------------------------------------------------------------------------------
    def token(self):
        path = self.p.get("token_file")
        if not path or not os.path.exists(path):
            return False
        text = Path(path).read_text().strip()
        return text.splitlines()[0].strip() if text else False

    # -- local state --------------------------------------------------------------------------------------
    def _state(self) -> dict:
        return read_json(self.dest / STATE).get("files", {})

    def local_ok(self, files: dict[str, dict], full: bool) -> tuple[dict[str, str], dict[str, dict]]:
        """Which planned files are present and right. Returns (bad: name -> reason, verified: name -> record)."""
        state = self._state()
        bad: dict[str, str] = {}
        verified: dict[str, dict] = {}
        for name, meta in files.items():
            path = self.dest / name
            if not path.is_file():
                bad[name] = "missing"
                continue
            st = path.stat()
            if st.st_size != meta["size"]:
                bad[name] = f"size {st.st_size} != {meta['size']}"
                continue
            rec = state.get(name)
            expected = meta.get("sha256")
            if (
                not full
                and rec
                and rec.get("size") == st.st_size
                and rec.get("mtime_ns") == st.st_mtime_ns
                and (expected is None or rec.get("sha256") == expected)
                and (meta.get("blob_id") is None or rec.get("blob_id") == meta["blob_id"])
            ):
                verified[name] = rec
                continue
            reason = self._verify(path, meta)
            if reason:
                bad[name] = reason
            else:
                verified[name] = self._record(path)
        return bad, verified

    def _record(self, path: Path, sums: tuple[str, str] | None = None) -> dict:
        sha256, blob = sums or hash_file(path)
        st = path.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256, "blob_id": blob}

    def _verify(self, path: Path, meta: dict) -> str | None:
        """None when ``path`` matches ``meta`` (size, sha256 or git blob id); else the reason."""
        size = path.stat().st_size
        if size != meta["size"]:
            return f"size {size} != {meta['size']}"
        sha256, blob = hash_file(path)
        if meta.get("sha256") and sha256 != meta["sha256"]:
            return f"sha256 {sha256} != {meta['sha256']}"
        if not meta.get("sha256") and meta.get("blob_id") and blob != meta["blob_id"]:
            return f"git blob id {blob} != {meta['blob_id']}"
        with self._lock:
            self._sums[str(path)] = (sha256, blob)
        return None

    # -- space --------------------------------------------------------------------------------------------
    def check_space(self, files: dict[str, dict], bad: dict[str, str]) -> None:
        total = sum(m["size"] for m in files.values())
        needed = sum(files[n]["size"] for n in bad)
        # A file that is replaced frees its space only after the new copy is complete.
        free = free_space(self.dest)
        headroom = max(int(self.p.get("headroom_bytes") or 0), int(total * float(self.p.get("headroom_ratio") or 0)))
        self.result.update(needed_bytes=needed, free_bytes=free, headroom_bytes=headroom, total_bytes=total)
        if needed and free < needed + headroom:
            raise StageError(
                f"not enough disk space for the model in {self.dest}: {human(needed)} still to fetch "
                f"({len(bad)} of {len(files)} files, model {human(total)}) + {human(headroom)} headroom "
                f"(model_weights_headroom_bytes / model_weights_headroom_ratio), but only {human(free)} free. "
                "Nothing was downloaded. Free space there, or set model_weights_root to a larger filesystem."
            )

    # -- finishing ----------------------------------------------------------------------------------------
    def finish(self, revision: str, files: dict[str, dict], verified: dict[str, dict], extra: dict) -> None:
        manifest = {
            "format": MANIFEST_FORMAT,
            "revision": revision,
            "files": [{"path": n, "size": files[n]["size"], "sha256": verified[n]["sha256"]} for n in sorted(files)],
            **extra,
        }
        state = {"revision": revision, "files": {n: verified[n] for n in sorted(files)}, **extra}
        if read_json(self.dest / MANIFEST) != json.loads(json.dumps(manifest, sort_keys=True)):
            self.result["changed"] = True
            if not self.check_mode:
                write_json(self.dest / MANIFEST, manifest)
        if read_json(self.dest / STATE) != json.loads(json.dumps(state, sort_keys=True)) and not self.check_mode:
            write_json(self.dest / STATE, state)
        self.result.update(revision=revision, files=len(files), total_bytes=sum(f["size"] for f in files.values()))

    # -- the run ------------------------------------------------------------------------------------------
    def run(self) -> dict:
        source = self.p["source"]
        with self.progress:
            try:
                if source == "hf":
                    self.stage_hf()
                elif source == "http":
                    self.stage_http()
                else:
                    self.stage_path()
            except StageError as exc:
                self.progress.set("failed", str(exc))
                raise
            self.progress.set("done", "staged" if self.result["changed"] else "already complete")
        return self.result

    def _fetch_all(self, files: dict[str, dict], bad: dict[str, str], fetch_one) -> dict[str, dict]:
        """Fetch ``bad`` files with ``fetch_one(name, force)``, verify each, re-fetch corrupt ones."""
        from concurrent.futures import ThreadPoolExecutor

        self.result["changed"] = True
        for name, reason in bad.items():
            if reason != "missing":
                self.result["refetched"].append(f"{name}: {reason}")
        self.progress.set("download", f"fetching {len(bad)} files", {n: files[n]["size"] for n in bad})
        verified: dict[str, dict] = {}
        lock = threading.Lock()

        def work(name: str) -> None:
            force = bad[name] != "missing"
            for attempt in range(int(self.p.get("retries", 2)) + 1):
                if force:
                    self._remove(name)
                fetch_one(name, force)
                path = self.dest / name
                reason = self._verify(path, files[name]) if path.is_file() else "missing after download"
                if reason is None:
                    rec = self._record(path, self._sums.get(str(path)))
                    with lock:
                        verified[name] = rec
                    self.progress.mark_done(name)
                    return
                with lock:
                    self.result["refetched"].append(f"{name}: {reason} (after download {attempt + 1})")
                self._remove(name)
                force = True
            raise StageError(
                f"{name} is still corrupt after {int(self.p.get('retries', 2)) + 1} downloads ({reason}); "
                "it was removed, nothing of it is served. Check the source (model_weights_source)."
            )

        workers = max(1, min(int(self.p.get("max_workers") or 1), len(bad)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for fut in [pool.submit(work, n) for n in sorted(bad, key=lambda n: -files[n]["size"])]:
                fut.result()
        self.result["fetched"] = sorted(bad)
        return verified

    def _remove(self, name: str) -> None:
        (self.dest / name).unlink(missing_ok=True)
        (self.dest / HF_META_DIR / "download" / f"{name}.metadata").unlink(missing_ok=True)
