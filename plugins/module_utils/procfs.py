"""Processes on the host, read from /proc: alive or not, their systemd unit (cgroup), user, command line.

The one copy used by the gpu_facts module (GPU compute processes in the facts) and the sglang_server
modules (which processes are the unit's, who holds a GPU). Standard library only; ``proc_root`` lets the
unit tests point every reader at a fake /proc.
"""

from __future__ import annotations

import os
import re


def _read(pid, name, proc_root):
    with open(os.path.join(proc_root, str(pid), name), encoding="utf-8", errors="replace") as fh:
        return fh.read()


def pid_unit(pid, proc_root="/proc"):
    """The systemd unit (``*.service``/``*.scope``) a process runs in, from its cgroup path.

    None when the process is gone, "" when its cgroup names no unit.
    """
    try:
        text = _read(pid, "cgroup", proc_root)
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""


def pid_alive(pid, proc_root="/proc"):
    """True while ``/proc/<pid>`` exists and is not a zombie (``State:`` of ``/proc/<pid>/status``)."""
    try:
        status = _read(pid, "status", proc_root)
    except OSError:
        return False
    match = re.search(r"^State:\s*(\S)", status, re.M)
    return not (match and match.group(1) in ("Z", "X"))


def user_name(uid):
    """The name of a UID, or the UID as a string where the host has no such user."""
    try:
        import pwd  # noqa: PLC0415  (POSIX only; the modules run on Linux hosts)

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def pid_user(pid, proc_root="/proc", name_of=user_name):
    """``(uid, user name)`` of a process: the real UID in ``/proc/<pid>/status`` (``Uid:``); (None, None) if gone."""
    try:
        match = re.search(r"^Uid:\s*(\d+)", _read(pid, "status", proc_root), re.M)
    except OSError:
        return None, None
    if not match:
        return None, None
    uid = int(match.group(1))
    return uid, name_of(uid)


# Command-line options whose value is a secret (``--api-key X``, ``--hf-token=X``, ``--password X``) and
# ``NAME=value`` words whose name says so (``HF_TOKEN=hf_...``): masked before a command line is shown.
_SECRET_WORD = re.compile(
    r"(?i)(api[-_]?key|(?<![a-z])key(?![a-z])|token(?![a-z])|secret|passw(or)?d|credential|auth(?![a-z]))"
)
CMDLINE_MAX = 300


def redact_cmdline(words):
    """A process's argv as one line for messages, secrets masked (``***``), at most ``CMDLINE_MAX`` chars."""
    shown, hide_next = [], False
    for word in words:
        if hide_next:
            shown.append("***")
            hide_next = False
            continue
        name, eq, _value = word.partition("=")
        if word.startswith("-") and _SECRET_WORD.search(name):
            if eq:
                shown.append(f"{name}=***")
            else:
                shown.append(word)
                hide_next = True
            continue
        if (
            eq
            and not word.startswith("-")
            and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
            and _SECRET_WORD.search(name)
        ):
            shown.append(f"{name}=***")
            continue
        shown.append(word)
    text = " ".join(w if w and not re.search(r"\s", w) else repr(w) for w in shown)
    return text if len(text) <= CMDLINE_MAX else text[: CMDLINE_MAX - 3] + "..."


def pid_cmdline(pid, proc_root="/proc"):
    """The process's command line for messages (secrets masked, see :func:`redact_cmdline`); "" if gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as fh:
            raw = fh.read()
    except OSError:
        return ""
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0")]
    while words and words[-1] == "":
        words.pop()
    return redact_cmdline(words)


def unit_pids(unit, proc_root="/proc"):
    """PIDs whose cgroup is the unit's (every process of the service, children included)."""
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return sorted(
        int(name)
        for name in names
        if name.isdigit() and pid_unit(name, proc_root) == unit and pid_alive(name, proc_root)
    )
