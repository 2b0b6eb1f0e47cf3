#!/usr/bin/env python3
"""gpufleet: run the SGLang server with its output redacted (installed by roles/sglang_server).

SGLang 0.5.9 logs its whole configuration at start (``server_args=ServerArgs(... api_key='...')``, upstream
sgl-project/sglang#18256), so a key passed with --api-key (here: through --config) would land in the
journal. This launcher starts the engine as its child with stdout/stderr on a pipe and writes every line
to its own stdout (the journal) with the values of SGLANG_SERVER_API_KEY and HF_TOKEN replaced by
[REDACTED]. SGLANG_SERVER_API_KEY is removed from the engine's environment (the engine reads the key
from its --config file).

  python sglang-log-redact.py -- PYTHON -m sglang.launch_server ARGS...

Signals: SIGTERM/SIGINT are forwarded to the engine's main process (which drains and stops its own
children, as SGLang does), and the launcher exits with the engine's status once the engine's output closes.
With KillMode=control-group systemd also signals every process itself; forwarding keeps the stop working
where only the main process is signalled (KillMode=mixed, or a cgroup that cannot be killed as a whole, as
in containers whose systemd reports "Failed to kill control group ... Input/output error"). SIGKILL after
TimeoutStopSec still ends everything.
"""

import os
import signal
import subprocess
import sys

SECRET_VARS = ("SGLANG_SERVER_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
CHILD_DROPS = ("SGLANG_SERVER_API_KEY",)
MASK = b"[REDACTED]"


def redact(line, secrets):
    for secret in secrets:
        line = line.replace(secret, MASK)
    return line


def secret_forms(values):
    """Byte strings to mask, longest first: each value as Python's repr (how ``server_args=ServerArgs(...
    api_key=...)`` prints it: quotes and backslashes escaped, whatever its length) -> ``'[REDACTED]'``,
    and each value of 4 characters or more as it is -> ``[REDACTED]``."""
    forms = {}
    for value in values:
        if value:
            forms[repr(value).encode("utf-8", "backslashreplace")] = b"'" + MASK + b"'"
        if len(value) >= 4:
            forms[value.encode("utf-8", "surrogateescape")] = MASK
    return sorted(forms.items(), key=lambda item: len(item[0]), reverse=True)


def redact_forms(line, forms):
    for secret, mask in forms:
        line = line.replace(secret, mask)
    return line


def main(argv):
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("usage: sglang-log-redact -- COMMAND [ARGS...]\n")
        return 2
    command = argv[argv.index("--") + 1 :]
    forms = secret_forms(os.environ.get(k, "") for k in SECRET_VARS)
    env = {k: v for k, v in os.environ.items() if k not in CHILD_DROPS}
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = None
    try:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=lambda: (
                signal.signal(signal.SIGTERM, signal.SIG_DFL),
                signal.signal(signal.SIGINT, signal.SIG_DFL),
            ),
        )
    except OSError as exc:
        sys.stderr.write(f"sglang-log-redact: cannot start {command[0]}: {exc}\n")
        return 127

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    out = sys.stdout.buffer
    for line in iter(child.stdout.readline, b""):
        out.write(redact_forms(line, forms))
        out.flush()
    rc = child.wait()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
