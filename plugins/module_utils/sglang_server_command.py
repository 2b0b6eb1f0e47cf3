"""Running a host command for the sglang_server modules: ``run`` gives ``(rc, stdout, stderr)`` and never raises
for a missing program (rc 127) or a timeout (rc 124). The lowest of the sglang_server_* module_utils: the others
that call systemctl, journalctl, nvidia-smi or ss take it as their default runner.
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import subprocess


def run(argv, timeout=60):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s: {' '.join(argv)}"
    return proc.returncode, proc.stdout, proc.stderr
