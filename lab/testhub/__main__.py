"""Command line of the lab test hub: python -m testhub {generate,serve,start,stop,status}.

``start`` runs ``serve`` in the background (its own session), waits until it answers, and records its PID
and start time in ``STATE_DIR/testhub.json``; ``stop`` ends exactly that process (PID and start time must
match), never anything by name. ``serve`` exits by itself after ``--max-lifetime`` seconds, so a test run
that never calls ``stop`` leaves nothing behind for long. Tokens come from ``--tokens-file`` (JSON
``{"token": ["namespace/repo", ...]}``: a token with an empty list is valid but has no access to gated repos).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpufleet_lab.sysutil import port_open, spawn_detached

from testhub.model import LAB_TOKEN, REPO_ID, generate
from testhub.server import make_server

RECORD = "testhub.json"


def _starttime(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(record: dict) -> bool:
    return bool(record) and _starttime(record["pid"]) == record["starttime"]


def _load(state_dir: Path) -> dict:
    path = state_dir / RECORD
    return json.loads(path.read_text()) if path.exists() else {}


def cmd_serve(args) -> int:
    data_dir = Path(args.data_dir)
    generate(data_dir)
    # Without a tokens file: the lab's fixed, non-secret token (inventory/lab), with access to every repo.
    tokens = json.loads(Path(args.tokens_file).read_text()) if args.tokens_file else {LAB_TOKEN: [REPO_ID]}
    server = make_server(
        args.bind, args.port, data_dir, tokens, Path(args.log_file) if args.log_file else None, args.wheelhouse
    )
    if args.max_lifetime:
        timer = threading.Timer(args.max_lifetime, server.shutdown)
        timer.daemon = True
        timer.start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"testhub: serving {data_dir} on http://{args.bind}:{args.port}", flush=True)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0


def cmd_start(args) -> int:
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    record = _load(state_dir)
    url = f"http://{args.bind}:{args.port}"
    if _alive(record) and record.get("url") == url and port_open(args.bind, args.port):
        print(json.dumps({**record, "changed": False}))
        return 0
    if _alive(record):
        os.kill(record["pid"], signal.SIGTERM)
    data_dir = Path(args.data_dir or state_dir / "data")
    log = open(state_dir / "testhub.log", "ab")  # noqa: SIM115 - handed to the child
    argv = [
        sys.executable,
        "-m",
        "testhub",
        "serve",
        "--bind",
        args.bind,
        "--port",
        str(args.port),
        "--data-dir",
        str(data_dir),
        "--log-file",
        str(state_dir / "requests.jsonl"),
        "--max-lifetime",
        str(args.max_lifetime),
    ]
    if args.tokens_file:
        argv += ["--tokens-file", args.tokens_file]
    if args.wheelhouse:
        argv += ["--wheelhouse", args.wheelhouse]
    proc = spawn_detached(argv, log)
    deadline = time.monotonic() + 20
    while not port_open(args.bind, args.port):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            print((state_dir / "testhub.log").read_text()[-2000:], file=sys.stderr)
            return 1
        time.sleep(0.05)
    record = {
        "pid": proc.pid,
        "starttime": _starttime(proc.pid),
        "url": url,
        "data_dir": str(data_dir),
        "request_log": str(state_dir / "requests.jsonl"),
    }
    (state_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({**record, "changed": True}))
    return 0


def cmd_stop(args) -> int:
    state_dir = Path(args.state_dir)
    record = _load(state_dir)
    changed = False
    if _alive(record):
        os.kill(record["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(record) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(record):
            os.kill(record["pid"], signal.SIGKILL)
        changed = True
    (state_dir / RECORD).unlink(missing_ok=True)
    print(json.dumps({"changed": changed}))
    return 0


def cmd_status(args) -> int:
    record = _load(Path(args.state_dir))
    print(json.dumps({**record, "running": _alive(record)}))
    return 0


def cmd_wheelhouse(args) -> int:
    """Download pinned wheels (for CPython 3.11 on x86_64 Linux, no dependencies) into ``--dest``, once."""
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    # Shared by every lab on the machine: scenarios running at once must not download into it together.
    with (dest / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _fill_wheelhouse(dest, sorted(args.packages))


def _fill_wheelhouse(dest: Path, wanted: list[str]) -> int:
    stamp = dest / "wheelhouse.json"
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        print(json.dumps({"changed": False, "dest": str(dest)}))
        return 0
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--platform",
        "manylinux2014_x86_64",
        "--platform",
        "manylinux_2_17_x86_64",
        "--platform",
        "manylinux_2_28_x86_64",
        "-d",
        str(dest),
        *wanted,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
        return 1
    stamp.write_text(json.dumps(wanted) + "\n")
    print(json.dumps({"changed": True, "dest": str(dest)}))
    return 0


def cmd_generate(args) -> int:
    hub = generate(Path(args.data_dir))
    print(json.dumps(hub, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testhub", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write the tiny model repository and hub.json")
    gen.add_argument("--data-dir", required=True)
    for name in ("serve", "start"):
        p = sub.add_parser(name, help=f"{name} the test hub")
        p.add_argument("--bind", default="127.0.0.1")
        p.add_argument("--port", type=int, default=8490)
        p.add_argument("--tokens-file")
        p.add_argument("--max-lifetime", type=float, default=1800, help="exit after this many seconds (0: never)")
        p.add_argument("--wheelhouse", help="directory of wheels to serve at /wheels/ (pip --find-links)")
        if name == "serve":
            p.add_argument("--data-dir", required=True)
            p.add_argument("--log-file")
        else:
            p.add_argument("--state-dir", required=True)
            p.add_argument("--data-dir")
    wh = sub.add_parser("wheelhouse", help="download pinned wheels for the lab hosts (once)")
    wh.add_argument("--dest", required=True)
    wh.add_argument("packages", nargs="+")
    for name in ("stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--state-dir", required=True)
    args = parser.parse_args(argv)
    commands = {
        "generate": cmd_generate,
        "serve": cmd_serve,
        "start": cmd_start,
        "stop": cmd_stop,
        "status": cmd_status,
        "wheelhouse": cmd_wheelhouse,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
