"""Evaluate a Jinja expression for one inventory host as Ansible does (`ansible HOST -m debug -a msg=...`).

With the project's ansible.cfg and the checkout as the collection gpufleet.fleet, so the inventory's
group_vars, the layered flags and the collection's filters are exactly what a deploy would see.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def host_value(host: str, inventory, expr: str, *extra_vars: str):
    """The value of ``expr`` for ``host`` of ``inventory``; ``extra_vars`` are ``-e`` arguments (``@file``)."""
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN="memory",
    )
    argv = [str(REPO / ".venv" / "bin" / "ansible"), host, "-i", str(inventory), "-m", "ansible.builtin.debug"]
    argv += ["-a", f"msg={expr}"]
    for value in extra_vars:
        argv += ["-e", value]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.split("SUCCESS => ", 1)[1])["msg"]
