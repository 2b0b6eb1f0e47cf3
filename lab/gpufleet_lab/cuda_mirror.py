"""Serve the lab CUDA mirror (lab/cuda_mirror) to a lab's hosts, on the lab bridge's gateway address.

One small HTTP server per lab (``python -m http.server`` bound to the gateway IP, so only the
controller and that lab's hosts reach it), recorded by PID and start time in the lab's state
directory and stopped by that record (``cuda-mirror down`` or ``down`` of the lab), never by name.

URL layout (``http://<gateway>:<port>``), mirroring developer.download.nvidia.com:
  /compute/cuda/repos/<debian12|ubuntu2204|ubuntu2404>/x86_64/   signed flat apt repository
  /compute/cuda/repos/debian12/x86_64/gpufleet-lab-cuda.asc      the lab signing key
  /wheels/                                                       CUDA 12.8 and 13.0 wheels (index.html with sha256)
  /runfile/                                                      stand-in .run installer and SHA256SUMS
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gpufleet_lab.lab import CACHE_DIR, Lab
from gpufleet_lab.sysutil import (
    LabError,
    kill_recorded,
    pid_is,
    port_open,
    proc_starttime,
    spawn_detached,
    write_atomic,
)

DEFAULT_PORT = 8480


def _record_file(lab: Lab) -> Path:
    return lab.dir / "cuda-mirror.json"


def _load(lab: Lab) -> dict | None:
    path = _record_file(lab)
    return json.loads(path.read_text()) if path.exists() else None


def _describe(record: dict, info: dict | None = None) -> dict:
    base = f"http://{record['address']}:{record['port']}"
    out = {
        "url": base,
        "apt_repo_base": f"{base}/compute/cuda/repos",
        "apt_key": f"{base}/compute/cuda/repos/debian12/x86_64/gpufleet-lab-cuda.asc",
        "wheelhouse": f"{base}/wheels/",
        "runfile_dir": f"{base}/runfile/",
        "pid": record["pid"],
        "www": record["www"],
    }
    if info:
        out["key_fingerprint"] = info.get("key_fingerprint")
    return out


def up(lab: Lab, port: int = DEFAULT_PORT, log=print) -> dict:
    """Build (or reuse) the mirror and make sure this lab serves it; idempotent."""
    from cuda_mirror.build import ensure_built
    from cuda_mirror.wheels import MirrorError

    address = lab.gateway()
    try:
        info = ensure_built(CACHE_DIR / "cuda-mirror", log=log)
    except MirrorError as exc:
        raise LabError(f"cannot build the lab CUDA mirror: {exc}") from exc
    record = _load(lab)
    if record and pid_is(record.get("pid"), record.get("starttime")):
        if (record["address"], record["port"], record["www"]) == (address, port, info["www"]) and port_open(
            address, port
        ):
            return {**_describe(record, info), "changed": False}
        kill_recorded(record["pid"], record["starttime"])
    if port_open(address, port):
        raise LabError(f"{address}:{port} is already in use by another process: choose another --port")
    log_file = open(lab.dir / "cuda-mirror.log", "ab")  # noqa: SIM115 - handed to the long-lived child
    proc = spawn_detached(
        [sys.executable, "-m", "http.server", str(port), "--bind", address, "--directory", info["www"]], log_file
    )
    record = {
        "pid": proc.pid,
        "starttime": proc_starttime(proc.pid),
        "address": address,
        "port": port,
        "www": info["www"],
    }
    write_atomic(_record_file(lab), json.dumps(record, indent=2) + "\n")
    deadline = time.monotonic() + 15
    while not port_open(address, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_recorded(record["pid"], record["starttime"])
            _record_file(lab).unlink(missing_ok=True)
            tail = (lab.dir / "cuda-mirror.log").read_text(errors="replace")[-1500:]
            raise LabError(f"the CUDA mirror server did not start on {address}:{port}:\n{tail}")
        time.sleep(0.05)
    log(f"cuda-mirror: serving {info['www']} at http://{address}:{port} (pid {proc.pid})")
    return {**_describe(record, info), "changed": True}


def down(lab: Lab) -> bool:
    """Stop this lab's mirror server (by its recorded PID); True when one was running."""
    record = _load(lab)
    if record is None:
        return False
    running = pid_is(record.get("pid"), record.get("starttime"))
    kill_recorded(record.get("pid"), record.get("starttime"))
    _record_file(lab).unlink(missing_ok=True)
    return running


def status(lab: Lab) -> dict:
    record = _load(lab)
    if record is None:
        return {"lab": lab.name, "running": False}
    running = pid_is(record.get("pid"), record.get("starttime"))
    return {"lab": lab.name, "running": running, **_describe(record)}
