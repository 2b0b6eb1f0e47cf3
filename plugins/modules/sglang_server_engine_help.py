#!/usr/bin/python
"""Ansible module: the option strings of the installed engine (`python -m MODULE --help`), cached per release."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_engine_help
short_description: Option strings of the installed SGLang engine, from its --help (cached per release)
description:
  - Runs C(PYTHON -m MODULE --help) once per release (releases are immutable) and caches the output under
    I(cache_dir); returns every option string it prints. The role checks each rendered flag against them.
  - The cache is internal state of the role, so the module never reports a change.
  - "I(environment) (the engine's environment from the inventory, sglang_server_environment) is set for the run, as
    the unit sets it; an engine whose options depend on it (plugins, the lab's simulator, whose emulated version
    SGLANG_SIM_ENGINE_VERSION names) prints the help it will parse. It is part of the cache key."
options:
  python:
    description: "Python of the ml-env release."
    type: path
    required: true
  module:
    description: "Engine module, e.g. sglang.launch_server."
    type: str
    required: true
  cache_dir:
    description: "Directory of the cached help texts."
    type: path
    required: true
  timeout:
    description: "Seconds --help may take (SGLang imports torch)."
    type: int
    default: 300
  environment:
    description: "Variables set for the run (the unit's engine environment), over the module's own."
    type: dict
    default: {}
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Options of the installed engine
  sglang_server_engine_help:
    python: /opt/ml-env/releases/2026-11-29-abc/bin/python
    module: sglang.launch_server
    cache_dir: /var/lib/gpufleet/sglang-server/help
  register: engine_help
"""

RETURN = r"""
options:
  description: "Every option string (--x) in the help text."
  returned: always
  type: list
first_line:
  description: "First line of the help text."
  returned: always
  type: str
cached:
  description: "The help came from the cache."
  returned: always
  type: bool
"""


import hashlib
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_help import help_options


def main():
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "module": {"type": "str", "required": True},
            "cache_dir": {"type": "path", "required": True},
            "timeout": {"type": "int", "default": 300},
            "environment": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not os.access(p["python"], os.X_OK):
        module.fail_json(msg=f"the engine's Python {p['python']} does not exist or is not executable")
    env = {str(k): str(v) for k, v in sorted((p["environment"] or {}).items())}
    ident = f"{os.path.realpath(p['python'])}\0{p['module']}" + "".join(f"\0{k}={v}" for k, v in env.items())
    key = hashlib.sha256(ident.encode()).hexdigest()[:24]
    path = os.path.join(p["cache_dir"], f"help-{key}.txt")
    cached = os.path.exists(path)
    if cached:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    else:
        argv = [p["python"], "-m", p["module"], "--help"]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=p["timeout"], check=False, env={**os.environ, **env}
            )
        except subprocess.TimeoutExpired:
            module.fail_json(msg=f"{' '.join(argv)} took more than {p['timeout']} s")
        if proc.returncode != 0 or "--" not in proc.stdout:
            module.fail_json(
                msg=f"{' '.join(argv)} failed (rc {proc.returncode}): the engine is not installed in this release? "
                + (proc.stderr or proc.stdout).strip()[-800:]
            )
        text = proc.stdout
        if not module.check_mode:
            os.makedirs(p["cache_dir"], mode=0o755, exist_ok=True)
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
    module.exit_json(
        changed=False,
        options=help_options(text),
        first_line=(text.splitlines() or [""])[0],
        cached=cached,
    )


if __name__ == "__main__":
    main()
