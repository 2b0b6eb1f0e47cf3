"""Serve the lab test hub (lab/testhub: a tiny model behind a subset of the Hugging Face hub API) to a lab.

Bound to the lab bridge's gateway address, so only the controller and that lab's hosts reach it; its
process is recorded by PID and start time in the lab's state directory (testhub/) and stopped by that
record (``testhub down`` or ``down`` of the lab), never by name. It also serves the pinned wheels of the
model_weights role's tool environment (lab hosts install them from here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from gpufleet_lab.lab import CACHE_DIR, Lab
from gpufleet_lab.sysutil import LabError

DEFAULT_PORT = 8490
PROJECT_DIR = Path(__file__).resolve().parents[2]
WHEELHOUSE = CACHE_DIR / "testhub-wheels"


def _testhub(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_DIR / "lab"))
    proc = subprocess.run(
        [sys.executable, "-m", "testhub", *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise LabError(f"testhub {args[0]} failed:\n{proc.stderr.strip() or proc.stdout.strip()}")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}


def up(lab: Lab, port: int = DEFAULT_PORT) -> dict:
    defaults = yaml.safe_load((PROJECT_DIR / "roles/model_weights/defaults/main.yml").read_text())
    _testhub("wheelhouse", "--dest", str(WHEELHOUSE), *defaults["model_weights_hf_tool_packages"])
    return _testhub(
        "start",
        "--state-dir",
        str(lab.dir / "testhub"),
        "--bind",
        lab.gateway(),
        "--port",
        str(port),
        "--wheelhouse",
        str(WHEELHOUSE),
        "--max-lifetime",
        "0",
    )


def down(lab: Lab) -> bool:
    if not (lab.dir / "testhub").exists():
        return False
    return bool(_testhub("stop", "--state-dir", str(lab.dir / "testhub")).get("changed"))
