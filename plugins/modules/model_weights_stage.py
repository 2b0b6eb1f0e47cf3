#!/usr/bin/python
"""Ansible module: stage a model's files in a local directory, verified, before a server uses them."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_weights_stage
short_description: Stage model weights in a local directory (Hugging Face hub, HTTP mirror or path), verified
description:
  - Plans first, changes after. The plan lists the model's files with sizes and hashes (the hub's file metadata
    through C(huggingface_hub), or a mirror's manifest), checks which local files are already complete and
    verified, and checks the free space of O(dest) against what is still to fetch plus headroom. A refusal
    (bad token, gated repo without access, unknown revision, too little space) happens before any download.
  - O(source=hf) downloads with C(huggingface_hub) (C(hf_hub_download) into O(dest) as C(local_dir)) from
    O(endpoint) (the public hub or a company mirror). A connection dropped mid-file is resumed with a Range
    request by C(huggingface_hub) (in 10 MiB steps); files completed before an interruption are kept.
  - O(source=http) downloads from a plain HTTP(S) mirror whose C(manifest.json) lists every file with size and
    sha256 (the format this module writes, so a staged directory can serve as a mirror for other hosts).
    Partial files are kept in C(<dest>/.gpufleet-partial/) and resumed with Range requests, even across runs.
  - O(source=path) copies from a local or NFS directory (verified against its manifest when it has one, else
    against the source's own bytes).
  - Every file is checked after download - size and sha256 (LFS files on the hub, every file of a manifest) or
    the git blob id (small files on the hub). A corrupt file is removed and fetched again; a file that stays
    wrong fails the task. A file is only in place (under its name in O(dest)) once it is complete.
  - Writes C(<dest>/.gpufleet-manifest.json) (repo, commit, files with size and sha256) and a state file of
    what was verified; with a pinned commit, a complete directory is recognised without the network.
  - While it runs (best with C(async)), it writes progress (bytes, rate, ETA) as JSON to O(progress_file).
  - The token is read from O(token_file) (written by the role, mode 0600), never taken as an argument.
  - Supports check mode (plans and reports what would be fetched).
version_added: "1.0.0"
author: gpufleet
options:
  source:
    description: Where the files come from.
    type: str
    choices: [hf, http, path]
    required: true
  dest:
    description: The local model directory (what the server's C(--model) points at).
    type: path
    required: true
  repo_id:
    description: Hub repository (C(namespace/name)); required for O(source=hf).
    type: str
  revision:
    description: Hub revision - a 40-hex commit id (pinned), or a branch or tag (resolved on every run).
    type: str
    default: main
  endpoint:
    description: Hub endpoint (a company mirror of the hub API works).
    type: str
    default: https://huggingface.co
  token_file:
    description: File holding the hub token (first line); empty or absent means no token.
    type: path
  allow_patterns:
    description: Only files matching one of these glob patterns (hub source).
    type: list
    elements: str
  ignore_patterns:
    description: Skip files matching these glob patterns (hub source).
    type: list
    elements: str
  mirror_url:
    description: Base URL of an HTTP(S) mirror for O(source=http); files are at C(<mirror_url>/<path>).
    type: str
  manifest_url:
    description: URL of the mirror's manifest; default C(<mirror_url>/manifest.json).
    type: str
  manifest:
    description: The manifest itself (a dict in the same format) instead of O(manifest_url), e.g. read by the
      controller from the host that staged the model, so a fan-out copy is checked against hashes that did not
      travel over the same connection as the files.
    type: dict
  source_path:
    description: Directory to copy from for O(source=path).
    type: path
  headroom_bytes:
    description: Free space that must remain on the filesystem of O(dest) after the download (bytes).
    type: int
    default: 0
  headroom_ratio:
    description: Free space that must remain, as a fraction of the model's total size (the larger of the two
      headrooms applies).
    type: float
    default: 0.05
  verify:
    description: C(quick) trusts files whose size and mtime match the last verification; C(full) hashes every file.
    type: str
    choices: [quick, full]
    default: quick
  max_workers:
    description: Files downloaded at once.
    type: int
    default: 4
  retries:
    description: Fetches of one file after the first that failed verification, before giving up.
    type: int
    default: 2
  disable_xet:
    description: Do not use the Xet transfer protocol (plain HTTP downloads from the hub).
    type: bool
    default: false
  timeout:
    description: Seconds to wait for a server to answer (metadata and each read).
    type: int
    default: 60
  progress_file:
    description: Where to write progress as JSON while the module runs (updated about every second).
    type: path
  headers:
    description: Extra HTTP headers for O(source=http) (e.g. a mirror's own auth; use no_log on the task).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: GLM-5 NVFP4 at a pinned commit from the hub (token in a 0600 file)
  model_weights_stage:
    source: hf
    repo_id: lukealonso/GLM-5-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    dest: /srv/models/lukealonso--GLM-5-NVFP4/0123456789abcdef0123456789abcdef01234567
    token_file: /etc/gpufleet/model_weights/hf_token
    progress_file: /run/gpufleet/model_weights/progress.json
  vars:
    ansible_python_interpreter: /opt/gpufleet/tools/hf/bin/python
  async: 86400
  poll: 0
  register: stage_job

- name: The same files from another host that staged them (its directory served over HTTP)
  model_weights_stage:
    source: http
    mirror_url: http://10.0.0.11:8496
    dest: /srv/models/lukealonso--GLM-5-NVFP4/0123456789abcdef0123456789abcdef01234567
"""

RETURN = r"""
path:
  description: The staged model directory.
  type: str
  returned: always
revision:
  description: The resolved commit id (hub) or the manifest's revision.
  type: str
  returned: success
files:
  description: Number of files in the model.
  type: int
  returned: success
total_bytes:
  description: Size of the model.
  type: int
  returned: success
needed_bytes:
  description: Bytes that had to be fetched (before this run).
  type: int
  returned: always
free_bytes:
  description: Free bytes on the filesystem of dest before the download.
  type: int
  returned: always
fetched:
  description: Files fetched in this run.
  type: list
  elements: str
  returned: success
refetched:
  description: Files found incomplete or corrupt (locally or after a transfer) and fetched again.
  type: list
  elements: str
  returned: success
resumed:
  description: Messages of downloads resumed after a dropped connection.
  type: list
  elements: str
  returned: success
offline:
  description: True when a complete directory at a pinned commit was recognised without asking the hub.
  type: bool
  returned: success
"""

import contextlib  # noqa: E402
import fnmatch  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

MANIFEST = ".gpufleet-manifest.json"
STATE = ".gpufleet-stage.json"
PARTIAL = ".gpufleet-partial"
MANIFEST_FORMAT = "gpufleet-model-manifest/1"
HF_META_DIR = ".cache/huggingface"
COMMIT_RE_LEN = 40
BUF = 4 * 1024 * 1024


class StageError(Exception):
    """A refusal or failure with a message for the operator."""


def is_commit(revision: str | None) -> bool:
    return bool(revision) and len(revision) == COMMIT_RE_LEN and all(c in "0123456789abcdef" for c in revision)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def hash_file(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file in one pass."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    blob = hashlib.sha1(b"blob %d\0" % size)  # noqa: S324 - git's object id, not a security hash
    with path.open("rb") as fh:
        while chunk := fh.read(BUF):
            sha256.update(chunk)
            blob.update(chunk)
    return sha256.hexdigest(), blob.hexdigest()


def filter_paths(paths, allow, ignore):
    out = []
    for p in paths:
        if allow and not any(fnmatch.fnmatch(p, pat) for pat in allow):
            continue
        if ignore and any(fnmatch.fnmatch(p, pat) for pat in ignore):
            continue
        out.append(p)
    return out


def free_space(dest: Path) -> int:
    probe = dest
    while not probe.exists():
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class Progress:
    """Writes progress (bytes, rate, ETA) of the files being fetched to a JSON file, from a thread."""

    def __init__(self, path: str | None, dest: Path, interval: float = 1.0):
        self.path = Path(path) if path else None
        self.dest = dest
        self.interval = interval
        self.files: dict[str, int] = {}
        self.done: set[str] = set()
        self.phase = "plan"
        self.message = ""
        self.started = time.monotonic()
        self._samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def set(self, phase: str, message: str = "", files: dict[str, int] | None = None) -> None:
        with self._lock:
            self.phase = phase
            self.message = message
            if files is not None:
                self.files = dict(files)
                self.done = set()
                self.started = time.monotonic()
                self._samples = []
        self.write()

    def mark_done(self, name: str) -> None:
        with self._lock:
            self.done.add(name)

    def _partial_bytes(self, name: str) -> int:
        total = 0
        for base in (self.dest / HF_META_DIR / "download", self.dest / PARTIAL):
            parent = (base / name).parent
            stem = Path(name).name
            if parent.is_dir():
                for entry in parent.iterdir():
                    if entry.name.startswith(stem + ".") and entry.name.endswith((".incomplete", ".part")):
                        with contextlib.suppress(OSError):
                            total = max(total, entry.stat().st_size)
        return total

    def snapshot(self) -> dict:
        with self._lock:
            files, done, phase, message = dict(self.files), set(self.done), self.phase, self.message
        total = sum(files.values())
        current = [n for n in files if n not in done]
        done_bytes = sum(files[n] for n in done) + sum(min(self._partial_bytes(n), files[n]) for n in current)
        now = time.monotonic()
        self._samples = [s for s in self._samples if now - s[0] <= 10] + [(now, done_bytes)]
        t0, b0 = self._samples[0]
        rate = (done_bytes - b0) / (now - t0) if now - t0 >= 1.0 else 0.0
        if rate <= 0 and now - self.started >= 2.0:
            rate = done_bytes / (now - self.started)
        # No ETA from the first second's trickle (metadata, connection set-up): it would be wildly off.
        eta = (total - done_bytes) / rate if rate > 0 and now - self.started >= 2.0 else None
        return {
            "phase": phase,
            "message": message,
            "files_total": len(files),
            "files_done": len(done),
            "bytes_total": total,
            "bytes_done": done_bytes,
            "rate_bps": round(rate, 1),
            "eta_s": round(eta, 1) if eta is not None else None,
            "elapsed_s": round(now - self.started, 1),
            "current": sorted(current)[:4],
            "updated": time.time(),
            "pid": os.getpid(),
        }

    def write(self) -> None:
        if not self.path:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, self.snapshot())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.write()


class _ResumeLog(logging.Handler):
    """Collects huggingface_hub's warnings about resumed downloads."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "resume" in msg.lower() or "error while downloading" in msg.lower():
            self.messages.append(msg.splitlines()[0][:300])


class Stager:
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

    # -- hub ----------------------------------------------------------------------------------------------
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
            resume_log = _ResumeLog()
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

    # -- http mirror --------------------------------------------------------------------------------------
    def _open(self, url: str, headers: dict | None = None):
        req = urllib.request.Request(url, headers={**(self.p.get("headers") or {}), **(headers or {})})
        return urllib.request.urlopen(req, timeout=int(self.p.get("timeout") or 60))  # noqa: S310 - http(s) only

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
            self._http_fetch(f"{base}/{urllib.request.quote(name)}", name, files[name]["size"], force)

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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "source": {"type": "str", "required": True, "choices": ["hf", "http", "path"]},
            "dest": {"type": "path", "required": True},
            "repo_id": {"type": "str"},
            "revision": {"type": "str", "default": "main"},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "token_file": {"type": "path", "no_log": False},
            "allow_patterns": {"type": "list", "elements": "str"},
            "ignore_patterns": {"type": "list", "elements": "str"},
            "mirror_url": {"type": "str"},
            "manifest_url": {"type": "str"},
            "manifest": {"type": "dict"},
            "source_path": {"type": "path"},
            "headroom_bytes": {"type": "int", "default": 0},
            "headroom_ratio": {"type": "float", "default": 0.05},
            "verify": {"type": "str", "default": "quick", "choices": ["quick", "full"]},
            "max_workers": {"type": "int", "default": 4},
            "retries": {"type": "int", "default": 2},
            "disable_xet": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 60},
            "progress_file": {"type": "path"},
            "headers": {"type": "dict", "default": {}, "no_log": True},
        },
        required_if=[
            ("source", "hf", ["repo_id"]),
            ("source", "http", ["mirror_url"]),
            ("source", "path", ["source_path"]),
        ],
        supports_check_mode=True,
    )
    stager = Stager(module.params, module.check_mode, module.warn)
    try:
        result = stager.run()
    except StageError as exc:
        module.fail_json(msg=str(exc), **stager.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
