"""The environment of tools/ansible_speedups/env.sh (the opt-in controller speed-ups), as bash leaves it after sourcing
the file, and the plugins loaded from their files."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEEDUPS = REPO / "tools" / "ansible_speedups"


def speedups_env(base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with what `. tools/ansible_speedups/env.sh` sets."""
    base = dict(os.environ if base is None else base)
    out = subprocess.run(["bash", "-c", f". {SPEEDUPS / 'env.sh'} && env -0"], env=base, capture_output=True,
                         check=True).stdout  # fmt: skip
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


def load_plugin(kind: str, name: str, module_name: str | None = None):
    """A plugin module of tools/ansible_speedups/<kind>_plugins/<name>.py, imported from its file."""
    path = SPEEDUPS / f"{kind}_plugins" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module_name or f"gpufleet_speedups_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
