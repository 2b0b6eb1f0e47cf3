"""Helpers for lab tests that talk to one lab host: a shell command inside it, its simulated GPUs' profile, the
engine's /health; and headless Chromium, which opens the reports the tests check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

LAB_DIR = str(Path(__file__).resolve().parents[2] / "lab")


def lab_exec(lab: str, host: str, script: str, stdin: bytes | None = None, check: bool = True, timeout: int = 120):
    """Run a shell script inside host ``host`` of lab ``lab`` through the lab tool (``gpufleet_lab exec``): (rc,
    stdout). Asserts rc 0 when check."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", "--name", lab, "exec", host, "--", "bash", "-c", script],
        input=stdin, capture_output=True, env=dict(os.environ, PYTHONPATH=LAB_DIR), check=False, timeout=timeout,
    )  # fmt: skip
    out = proc.stdout.decode(errors="replace")
    if check:
        assert proc.returncode == 0, f"{script}: rc {proc.returncode}\n{out}{proc.stderr.decode(errors='replace')}"
    return proc.returncode, out


def on(host: dict, script: str, stdin: str | None = None, check: bool = True) -> str:
    """Run a shell script inside a lab host (nsenter into its leader); its stdout. Asserts rc 0 when check."""
    proc = subprocess.run(
        ["nsenter", "-t", str(host["leader_pid"]), "-a", "sh", "-c", script],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert proc.returncode == 0, f"{script} failed on {host['name']}: {proc.stdout}{proc.stderr}"
    return proc.stdout


GPUSIM_PROFILE = "/etc/gpusim/profile/profile.json"  # the simulated GPUs of a lab host (lab/gpusim/README.md)


def gpusim_profile(host: dict, change: str | None) -> None:
    """Change a host's simulated GPUs: a Python statement on its gpusim profile ``p`` (lab/gpusim/README.md), written
    atomically (nvidia-smi reads it at every call); None puts the profile back as the lab tool installed it."""
    profile = GPUSIM_PROFILE
    if change is None:
        on(host, f"cp {profile}.orig {profile}.tmp && mv {profile}.tmp {profile}")
        return
    code = f"import json; p = json.load(open('{profile}')); {change}; open('{profile}.tmp', 'w').write(json.dumps(p))"
    on(host, f'[ -e {profile}.orig ] || cp {profile} {profile}.orig; python3 -c "{code}" && mv {profile}.tmp {profile}')


def health(address: str, port: int = 8000) -> int:
    """HTTP status of the engine's /health on the host (0: nothing answered)."""
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def chromium(html, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on a local HTML file with the network cut (every host name resolves to nothing, any proxy
    use goes to a closed port): ``--dump-dom`` shows what a reader sees, ``--screenshot=FILE`` what it looks like."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Chromium is missing: `make setup` installs Debian's chromium"
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--proxy-server=127.0.0.1:9", "--window-size=1280,2400", *args, html.as_uri()]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
