"""Run an Ansible module's main() in-process, as Ansible would with the given arguments.

``run_module(name, args, capsys)`` returns ``(result, failed)``: the JSON the module printed (exit_json or
fail_json) and whether it failed (``failed`` in the result or a non-zero exit).
"""

from __future__ import annotations

import importlib
import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(name: str, args: dict, capsys) -> tuple[dict, bool]:
    mod = importlib.import_module(name)
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        mod.main()
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{") :])
    return result, bool(result.get("failed")) or exc.value.code not in (0, None)
