"""Helpers for lab tests that talk to one lab host: a shell command inside it, the engine's /health."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request


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


def health(address: str, port: int = 8000) -> int:
    """HTTP status of the engine's /health on the host (0: nothing answered)."""
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0
