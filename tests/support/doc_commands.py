"""The commands the docs give for the lab, run exactly as written.

A fenced ``sh`` block in README.md or a page of docs/ that follows the line ``<!-- lab-commands -->`` holds commands a
user types, one per line (a line ending in a backslash continues on the next; a comment after two spaces,
``  # ...``, is not part of the command): they target the local lab (no ``-i``: the default inventory,
``inventory/lab``, which ``make deploy`` writes), from the project's folder, in the project's environment
(``. .venv/bin/activate``).

``marked()`` lists every such command with its page and line. ``run(text)`` runs one of them with ``bash -c`` from the
project's folder and refuses a text that is not, to the letter, a command of a marked block: a test cannot drift from
the docs. ``tests/lab/test_documented_commands.py`` runs them all and fails when a marked command was not run.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(os.environ.get("GPUFLEET_ROOT") or Path(__file__).resolve().parents[2])
MARK = "<!-- lab-commands -->"
# a comment after a command: two spaces or more, then "# " (what the docs' blocks align their comments with)
TRAILING_COMMENT = re.compile(r"\s{2,}# .*$")


@dataclass(frozen=True)
class Command:
    text: str
    page: str
    line: int


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and docs/*.md (the dated measurement logs are records, not instructions)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def marked(root: Path = ROOT) -> list[Command]:
    found = []
    for page in pages(root):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            fence = i + 1
            if fence >= len(lines) or lines[fence].strip() != "```sh":
                raise ValueError(f"{page.relative_to(root)}:{i + 1}: {MARK} must stand right above a ```sh block")
            pending, start = "", 0
            for j in range(fence + 1, len(lines)):
                text = lines[j]
                if text.strip() == "```":
                    break
                if not pending and (not text.strip() or text.lstrip().startswith("#")):
                    continue
                start = start if pending else j + 1
                if text.endswith("\\"):
                    pending += text[:-1].rstrip() + " "
                    continue
                text = TRAILING_COMMENT.sub("", pending + text.strip()).strip()
                found.append(Command(text, str(page.relative_to(root)), start))
                pending = ""
            else:
                raise ValueError(f"{page.relative_to(root)}:{fence + 1}: the ```sh block never ends")
    return found


def command(text: str, root: Path = ROOT) -> Command:
    for cmd in marked(root):
        if cmd.text == text:
            return cmd
    raise AssertionError(f"not a command of a {MARK} block of the docs (changed there?): {text}")


# What make exports for its own recipes (Makefile) and the test runners set: a user's shell has none of them.
NOT_THE_USERS = ("PYTHONPATH", "GPUFLEET_ROOT", "HF_HUB_OFFLINE", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def user_env() -> dict:
    """A shell after ``. .venv/bin/activate`` in the project: the venv first on PATH, none of make's or Ansible's
    variables (a command that needs one of them fails here as it would for the user)."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_THE_USERS and not k.startswith(("ANSIBLE_", "PYTEST"))}
    env["VIRTUAL_ENV"] = str(ROOT / ".venv")
    env["PATH"] = f"{ROOT / '.venv/bin'}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    return env


# the commands run() ran in this process (a lab test asserts at its end that it ran every marked one)
RAN: list[str] = []


def run(text: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run a documented command as written, in ``user_env()`` (stdout and stderr together in ``stdout``)."""
    command(text)
    RAN.append(text)
    return subprocess.run(
        ["bash", "-c", text],
        cwd=ROOT,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
