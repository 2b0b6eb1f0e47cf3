#!/usr/bin/env python3
"""gpufleet: run the SGLang server with its output redacted (installed by roles/sglang_server).

SGLang 0.5.9 logs its whole configuration at start (``server_args=ServerArgs(... api_key='...')``, upstream
sgl-project/sglang#18256), so a key passed with --api-key (here: through --config) would land in the
journal. This launcher starts the engine as its child with stdout/stderr on a pipe and writes every line
to its own stdout (the journal) with the values of SGLANG_SERVER_API_KEY and HF_TOKEN replaced by
[REDACTED]. SGLANG_SERVER_API_KEY is removed from the engine's environment (the engine reads the key
from its --config file).

  python sglang-log-redact.py -- PYTHON -m sglang.launch_server ARGS...

Signals and exit status (the unit runs with KillMode=mixed: systemd signals this launcher only):
SIGTERM/SIGINT are forwarded to the engine's main process only, never to its children: SGLang 0.5.9 drains in
its main process (tokenizer_manager.py sigterm_watchdog) while its schedulers have no SIGTERM handler and
would die at once. The launcher exits when the engine's main process has exited (it does not wait for
leftover processes that still hold the output pipe: systemd's SIGKILL after the main process ends is for
them), with the engine's status: an exit code as is, a signal N as 128+N. So the end of a drain (SGLang's
kill_process_tree SIGKILLs itself) is 137, which the unit's SuccessExitStatus counts as a clean stop. A
SIGKILL that the engine took without a stop request (its SIGQUIT crash path, the OOM killer) must not look
clean: then the launcher ends itself by SIGKILL, and systemd records a failure (Result=signal).
"""

import os
import signal
import subprocess
import sys
import threading

SECRET_VARS = ("SGLANG_SERVER_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
CHILD_DROPS = ("SGLANG_SERVER_API_KEY",)
MASK = b"[REDACTED]"


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
    child = None
    stop_requested = []  # signals received
    pending = []  # received before the engine ran: sent once it does

    def forward(signum, _frame):
        stop_requested.append(signum)
        if child is None:
            pending.append(signum)
        elif child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
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

    for signum in pending[:1]:
        child.send_signal(signum)

    def copy_output():
        out = sys.stdout.buffer
        for line in iter(child.stdout.readline, b""):
            out.write(redact_forms(line, forms))
            out.flush()

    reader = threading.Thread(target=copy_output, daemon=True)
    reader.start()
    rc = child.wait()
    reader.join(timeout=2.0)  # the last lines; leftover children may keep the pipe open
    if rc == -signal.SIGKILL and not stop_requested:
        sys.stdout.flush()
        sys.stderr.write("sglang-log-redact: the engine was killed by SIGKILL without a stop request\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
