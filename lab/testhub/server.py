"""A local server for the subset of the Hugging Face hub API that ``huggingface_hub`` uses (lab equipment).

Routes (``{repo}`` is ``namespace/name``; ``{rev}`` a commit id or a ref such as ``main``):

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: model info with ``sha`` and
  ``siblings``; with ``?blobs=true`` each sibling has ``size``, ``blobId`` and ``lfs`` (``sha256``, ``size``).
- ``GET /api/models/{repo}/tree/{rev}[/{path}]``: the file list (``oid``, ``size``, ``lfs.oid`` = sha256).
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: the file, with ``ETag``, ``X-Repo-Commit``,
  ``Content-Length``, ``Accept-Ranges`` and, for LFS files, ``X-Linked-Etag``/``X-Linked-Size``; ``Range``
  requests answer 206.
- ``GET /mirror/{repo}/{commit}/manifest.json`` and ``/mirror/{repo}/{commit}/{path}``: a plain HTTP mirror
  of the same files with a gpufleet manifest (sizes and sha256), for the role's ``http`` source.
- Test control (lab only): ``GET /_testhub/log`` (the request log), ``POST /_testhub/faults`` (JSON:
  ``drop_once`` {path, after_bytes}: close the connection mid-file once; ``corrupt_once`` {path}: serve
  flipped bytes once; ``throttle_bps``: slow every file body), ``POST /_testhub/reset``.

Errors carry the headers ``huggingface_hub`` maps to its exceptions, as the real hub sends them:
no token on a gated repo: 401 ``X-Error-Code: GatedRepo``; a token the hub does not know: 401
``X-Error-Message: Invalid credentials in Authorization header``; a known token without access: 403
``X-Error-Code: GatedRepo``; unknown revision: 404 ``RevisionNotFound``; unknown file: 404 ``EntryNotFound``;
unknown repo: 404 ``RepoNotFound``. Tokens are read from a file (never argv) and never logged.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 64 * 1024
MANIFEST_FORMAT = "gpufleet-model-manifest/1"


def git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class Hub:
    """The repositories under ``data_dir`` (see ``testhub.model.generate``) and their file metadata."""

    def __init__(self, data_dir: Path, tokens: dict[str, list[str]]):
        self.data_dir = Path(data_dir)
        self.desc = json.loads((self.data_dir / "hub.json").read_text())["repos"]
        self.tokens = tokens
        self._meta: dict[tuple[str, str], dict[str, dict]] = {}

    def content_repo(self, repo: str) -> str:
        return self.desc[repo].get("alias_of", repo)

    def resolve(self, repo: str, rev: str) -> str | None:
        info = self.desc[repo]
        if rev in info["commits"]:
            return rev
        return info["refs"].get(rev)

    def files(self, repo: str, commit: str) -> dict[str, dict]:
        key = (repo, commit)
        if key not in self._meta:
            root = self.data_dir / "repos" / self.content_repo(repo) / commit
            lfs_suffixes = tuple(self.desc[repo].get("lfs_suffixes", []))
            meta = {}
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                rel = path.relative_to(root).as_posix()
                content = path.read_bytes()
                sha256 = hashlib.sha256(content).hexdigest()
                entry = {"path": rel, "file": path, "size": len(content), "sha256": sha256}
                if rel.endswith(lfs_suffixes):
                    pointer = lfs_pointer(sha256, len(content))
                    entry["lfs"] = {"oid": sha256, "size": len(content), "pointerSize": len(pointer)}
                    entry["oid"] = git_blob_oid(pointer)
                    entry["etag"] = sha256
                else:
                    entry["oid"] = git_blob_oid(content)
                    entry["etag"] = entry["oid"]
                meta[rel] = entry
            self._meta[key] = meta
        return self._meta[key]

    def auth(self, header: str | None) -> tuple[str, str | None]:
        """('none'|'valid'|'invalid', token) from an Authorization header."""
        if not header:
            return "none", None
        m = re.fullmatch(r"Bearer\s+(\S+)", header.strip())
        if not m or m.group(1) not in self.tokens:
            return "invalid", None
        return "valid", m.group(1)


class State:
    """Faults and the request log, shared by the handler threads."""

    def __init__(self, log_file: Path | None):
        self.lock = threading.Lock()
        self.faults: dict = {}
        self.log: list[dict] = []
        self.log_file = log_file

    def record(self, entry: dict) -> None:
        with self.lock:
            entry["seq"] = len(self.log)
            self.log.append(entry)
            if self.log_file:
                with self.log_file.open("a") as fh:
                    fh.write(json.dumps(entry) + "\n")

    def take_fault(self, kind: str, path: str) -> dict | None:
        with self.lock:
            fault = self.faults.get(kind)
            if fault and fault.get("path") == path:
                del self.faults[kind]
                return fault
            return None


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpufleet-lab-testhub/1"
    hub: Hub
    state: State
    wheelhouse: str | None = None

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # the request log (State) is the log; stderr stays quiet

    # -- plumbing -------------------------------------------------------------------------------------------
    def _entry(self) -> dict:
        if not hasattr(self, "_log_entry"):
            self._log_entry = {
                "t": round(time.time(), 3),
                "client": self.client_address[0],
                "method": self.command,
                "path": urlsplit(self.path).path,
                "query": urlsplit(self.path).query,
                "range": self.headers.get("Range"),
                "auth": self.hub.auth(self.headers.get("Authorization"))[0],
                "user_agent": self.headers.get("User-Agent", ""),
            }
        return self._log_entry

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, ctype="application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.state.record({**self._entry(), "status": status, "bytes": 0 if self.command == "HEAD" else len(body)})

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._json({"error": message}, status, headers)

    # -- hub semantics --------------------------------------------------------------------------------------
    def _check_repo(self, repo: str) -> bool:
        """Auth and gating for ``repo``; sends the error and returns False when refused."""
        auth, token = self.hub.auth(self.headers.get("Authorization"))
        if auth == "invalid":
            self._error(401, "Invalid credentials in Authorization header")
            return False
        if repo not in self.hub.desc:
            self._error(404, "Repository not found", "RepoNotFound")
            return False
        if self.hub.desc[repo].get("gated"):
            if auth == "none":
                self._error(
                    401,
                    f"Access to model {repo} is restricted. You must have access to it and be authenticated "
                    "to access it. Please log in.",
                    "GatedRepo",
                )
                return False
            if repo not in self.hub.tokens.get(token, []):
                self._error(
                    403,
                    f"Access to model {repo} is restricted and you are not in the authorized list. "
                    f"Visit the hub page of {repo} to ask for access.",
                    "GatedRepo",
                )
                return False
        return True

    def _repo_files(self, repo: str, rev: str) -> tuple[str, dict] | None:
        """(commit, files) of ``repo`` at ``rev``; None once the error is answered (gated or unknown repo, 404
        RevisionNotFound for an unknown rev)."""
        if not self._check_repo(repo):
            return None
        commit = self.hub.resolve(repo, rev)
        if commit is None:
            self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
            return None
        return commit, self.hub.files(repo, commit)

    def _model_info(self, repo: str, rev: str, query: dict) -> None:
        found = self._repo_files(repo, rev)
        if found is None:
            return
        commit, files = found
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for entry in files.values():
            sibling = {"rfilename": entry["path"]}
            if blobs:
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    lfs = entry["lfs"]
                    sibling["lfs"] = {"sha256": lfs["oid"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}
            siblings.append(sibling)
        info = self.hub.desc[repo]
        self._json(
            {
                "_id": hashlib.sha1(repo.encode()).hexdigest()[:24],
                "id": repo,
                "modelId": repo,
                "author": repo.split("/")[0],
                "sha": commit,
                "lastModified": "2026-11-29T00:00:00.000Z",
                "private": False,
                "gated": info.get("gated") or False,
                "disabled": False,
                "library_name": "transformers",
                "tags": ["gpufleet-lab", "safetensors"],
                "siblings": siblings,
            }
        )

    def _tree(self, repo: str, rev: str, sub: str) -> None:
        found = self._repo_files(repo, rev)
        if found is None:
            return
        _, files = found
        out = []
        for entry in files.values():
            if sub and not entry["path"].startswith(sub.rstrip("/") + "/"):
                continue
            item = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": entry["path"]}
            if "lfs" in entry:
                item["lfs"] = dict(entry["lfs"])
            out.append(item)
        self._json(out)

    def _serve_file(self, entry: dict, headers: dict) -> None:
        size = entry["size"]
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= size:
                self._error(416, f"Range Not Satisfiable: {rng}")
                return
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        entry_log = {**self._entry(), "status": status, "bytes": 0}
        if self.command == "HEAD":
            self.state.record(entry_log)
            return
        drop = self.state.take_fault("drop_once", entry["path"])
        corrupt = self.state.take_fault("corrupt_once", entry["path"])
        throttle = float(self.state.faults.get("throttle_bps") or 0)
        sent = 0
        started = time.monotonic()
        with open(entry["file"], "rb") as fh:
            fh.seek(start)
            remaining = length
            while remaining > 0:
                chunk = fh.read(min(CHUNK, remaining))
                if corrupt and sent == 0:
                    chunk = bytes(b ^ 0xFF for b in chunk[:64]) + chunk[64:]
                if drop and sent + len(chunk) >= int(drop.get("after_bytes", length // 2)):
                    cut = max(0, int(drop.get("after_bytes", length // 2)) - sent)
                    self.wfile.write(chunk[:cut])
                    self.wfile.flush()
                    sent += cut
                    entry_log.update(bytes=sent, dropped=True)
                    self.state.record(entry_log)
                    self.close_connection = True
                    self.connection.shutdown(2)  # socket.SHUT_RDWR: the client sees a truncated body
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                remaining -= len(chunk)
                if throttle:
                    ahead = sent / throttle - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        entry_log.update(bytes=sent, corrupted=bool(corrupt))
        self.state.record(entry_log)

    def _resolve(self, repo: str, rev: str, path: str) -> None:
        found = self._repo_files(repo, rev)
        if found is None:
            return
        commit, files = found
        entry = files.get(path)
        if entry is None:
            self._error(404, f"Entry not found: {path}", "EntryNotFound")
            return
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry["etag"]}"'}
        if "lfs" in entry:
            headers["X-Linked-Etag"] = f'"{entry["sha256"]}"'
            headers["X-Linked-Size"] = str(entry["size"])
        self._serve_file(entry, headers)

    def _wheels(self, name: str) -> None:
        """A flat wheelhouse (pip --find-links): an index page and the wheel files."""
        wheels = {p.name: p for p in Path(self.wheelhouse).glob("*.whl")}
        if not name:
            links = "".join(
                f'<a href="{n}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}">{n}</a><br>\n'
                for n, p in sorted(wheels.items())
            )
            self._send(200, f"<html><body>\n{links}</body></html>\n".encode(), ctype="text/html")
            return
        if name not in wheels:
            self._error(404, "not found")
            return
        entry = {"path": name, "file": wheels[name], "size": wheels[name].stat().st_size}
        self._serve_file(entry, {})

    def _mirror(self, repo: str, commit: str, path: str) -> None:
        if repo not in self.hub.desc or commit not in self.hub.desc[repo]["commits"]:
            self._error(404, "not found")
            return
        files = self.hub.files(repo, commit)
        if path == "manifest.json":
            self._json(manifest(repo, commit, files))
            return
        entry = files.get(path)
        if entry is None:
            self._error(404, "not found")
            return
        self._serve_file(entry, {"ETag": f'"{entry["sha256"]}"'})

    # -- routing --------------------------------------------------------------------------------------------
    def _route(self) -> None:
        self.__dict__.pop("_log_entry", None)  # one handler serves every request of a keep-alive connection
        url = urlsplit(self.path)
        path = url.path
        query = parse_qs(url.query)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m and self.command == "GET":
            return self._model_info(unquote(m.group(1)), unquote(m.group(2) or "main"), query)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m and self.command == "GET":
            return self._tree(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3) or ""))
        m = re.fullmatch(r"/([^/_][^/]*/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and self.command in ("GET", "HEAD"):
            return self._resolve(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3)))
        m = re.fullmatch(r"/mirror/([^/]+/[^/]+)/([0-9a-f]{40})/(.+)", path)
        if m and self.command in ("GET", "HEAD"):
            return self._mirror(unquote(m.group(1)), m.group(2), unquote(m.group(3)))
        if path.startswith("/wheels/") and self.command in ("GET", "HEAD") and self.wheelhouse:
            return self._wheels(unquote(path[len("/wheels/") :]))
        if path == "/_testhub/log" and self.command == "GET":
            with self.state.lock:
                return self._json(list(self.state.log))
        if path == "/_testhub/faults" and self.command == "POST":
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with self.state.lock:
                self.state.faults.update(json.loads(body or b"{}"))
                faults = dict(self.state.faults)
            return self._json(faults)
        if path == "/_testhub/reset" and self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with self.state.lock:
                self.state.faults.clear()
                self.state.log.clear()
            return self._json({"reset": True})
        if path == "/_testhub/health":
            return self._json({"ok": True})
        return self._error(404, f"no route for {self.command} {path}")

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._route()

    def do_HEAD(self):  # noqa: N802
        self._route()

    def do_POST(self):  # noqa: N802
        self._route()


def manifest(repo: str, commit: str, files: dict[str, dict]) -> dict:
    """The gpufleet mirror manifest of one commit (the same format the role writes beside a staged model)."""
    return {
        "format": MANIFEST_FORMAT,
        "repo_id": repo,
        "revision": commit,
        "files": [{"path": e["path"], "size": e["size"], "sha256": e["sha256"]} for e in files.values()],
    }


def make_server(
    bind: str,
    port: int,
    data_dir: Path,
    tokens: dict[str, list[str]],
    log_file: Path | None = None,
    wheelhouse: str | None = None,
):
    """A ThreadingHTTPServer for the hub in ``data_dir`` (not started); ``wheelhouse``: served at /wheels/."""
    handler = type(
        "BoundHubHandler",
        (HubHandler,),
        {"hub": Hub(data_dir, tokens), "state": State(log_file), "wheelhouse": wheelhouse},
    )
    server = ThreadingHTTPServer((bind, port), handler)
    server.daemon_threads = True
    return server
