"""Root-owned files of the sglang_server role on the host: the atomic write of one (temporary file, mode,
rename), and the read of the systemd EnvironmentFile the role writes (the server's secrets).
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import os
import re
import tempfile


def write_root_file(path: str, data: bytes, mode: int) -> None:
    """Write data to path atomically: a temporary file in the same folder, root-owned with mode, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".gpufleet-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.chown(tmp, 0, 0)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_env_file(path):
    """KEY="value" lines of a systemd EnvironmentFile written by the role (backslash escapes)."""
    values = {}
    if not path:
        return values
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return values
    for line in lines:
        m = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*$', line)
        if m:
            values[m.group(1)] = re.sub(r"\\(.)", r"\1", m.group(2))
    return values
