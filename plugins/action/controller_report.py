"""Action plugin: write a JSON report on the controller inside the Ansible process (no module run).

The deploy report of every host (roles/sglang_server/tasks/report.yml) and the rollout report
(roles/rollout/tasks/finish.yml) are controller files. Written with ``file`` and ``copy`` on ``localhost`` they
took three module runs each (a folder, then copy's stat and copy), which the lab measured as a second or more per
host of a batch on two cores; here the folder and the files are written by the controller's worker process
itself, each file through a temporary file and a rename, so a reader never sees half a report.
Documentation of the options: plugins/modules/controller_report.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.json import AnsibleJSONEncoder
from ansible.plugins.action import ActionBase


def render(data) -> str:
    """The report's text: as to_nice_json writes it (indent 4, sorted keys), with a final newline."""
    return json.dumps(data, cls=AnsibleJSONEncoder, indent=4, sort_keys=True) + "\n"


def write_files(paths: list[Path], text: str, mode: int) -> bool:
    """Write text to every path (folders created 0755); True when any file's content changed."""
    changed = False
    for path in paths:
        try:
            changed = changed or path.read_text(encoding="utf-8") != text
        except (FileNotFoundError, UnicodeDecodeError):
            changed = True
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    return changed


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "also", "data", "mode"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        if not args.get("path") or "data" not in args:
            raise AnsibleActionFail("controller_report needs path and data")
        also = args.get("also") or []
        if isinstance(also, str):
            also = [also]
        paths = [Path(os.path.expanduser(str(p))) for p in [args["path"], *also]]
        try:
            mode = int(str(args.get("mode", "0644")), 8)
        except ValueError as exc:
            raise AnsibleActionFail(f"controller_report: mode {args.get('mode')!r} is not an octal mode") from exc
        text = render(args["data"])
        if self._task.check_mode:
            result.update(changed=True, path=str(paths[0]), also=[str(p) for p in paths[1:]])
            return result
        try:
            changed = write_files(paths, text, mode)
        except OSError as exc:
            raise AnsibleActionFail(f"report not written on the controller: {exc}") from exc
        result.update(changed=changed, path=str(paths[0]), also=[str(p) for p in paths[1:]])
        return result
