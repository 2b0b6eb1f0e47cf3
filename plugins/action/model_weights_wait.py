"""Action plugin: wait for an async model_weights_stage job and show its progress in the Ansible output.

Polls the job (async_status) every few seconds and, every ``interval`` seconds, prints one line per host with
bytes done, total, rate and ETA, read from the job's progress file. Returns the job's own result (so the task
fails with the module's message when staging failed). Documentation: plugins/modules/model_weights_wait.py.
"""

from __future__ import annotations

import base64
import json
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import human

display = Display()

ASYNC_KEYS = (
    "ansible_job_id",
    "started",
    "finished",
    "results_file",
    "stdout",
    "stderr",
    "stdout_lines",
    "stderr_lines",
    "erased",
)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def progress_line(host: str, label: str, p: dict) -> str:
    """One progress line, e.g. ``model_weights [h1] GLM-5: 1.2 GiB / 4.0 GiB (30%), 52.0 MiB/s, ETA 55s``."""
    phase = p.get("phase", "?")
    head = f"model_weights [{host}] {label}".rstrip()
    if phase != "download" or not p.get("bytes_total"):
        return f"{head}: {phase} {p.get('message', '')}".rstrip()
    done, total = p.get("bytes_done", 0), p["bytes_total"]
    current = ", ".join(p.get("current") or [])
    return (
        f"{head}: {human(done, 1)} / {human(total, 1)} ({100 * done / total:.0f}%), "
        f"{human(p.get('rate_bps') or 0, 1)}/s, ETA {duration(p.get('eta_s'))}, "
        f"files {p.get('files_done', 0)}/{p.get('files_total', 0)}" + (f" ({current})" if current else "")
    )


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("jid", "progress_file", "interval", "poll", "timeout", "label"))

    def _status(self, jid: str, async_dir: str, task_vars: dict, mode: str = "status") -> dict:
        return self._execute_module(
            module_name="ansible.legacy.async_status",
            module_args={"jid": jid, "mode": mode, "_async_dir": async_dir},
            task_vars=task_vars,
        )

    def _progress(self, path: str, task_vars: dict) -> dict | None:
        res = self._execute_module(module_name="ansible.legacy.slurp", module_args={"src": path}, task_vars=task_vars)
        if res.get("failed") or "content" not in res:
            return None
        try:
            return json.loads(base64.b64decode(res["content"]))
        except ValueError:
            return None

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(
            argument_spec={
                "jid": {"type": "str", "required": True},
                "progress_file": {"type": "str"},
                "interval": {"type": "int", "default": 30},
                "poll": {"type": "float", "default": 2.0},
                "timeout": {"type": "int", "default": 86400},
                "label": {"type": "str", "default": ""},
            }
        )
        if self._task.check_mode:
            result.update(skipped=True, msg="nothing to wait for in check mode")
            return result
        host = task_vars.get("inventory_hostname", "?")
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        started = time.monotonic()
        next_print = started + min(args["interval"], 5)
        last = None
        while True:
            status = self._status(args["jid"], async_dir, task_vars)
            if status.get("finished") or (status.get("failed") and not status.get("started")):
                break
            now = time.monotonic()
            if now - started > args["timeout"]:
                raise AnsibleActionFail(
                    f"model_weights: staging did not finish within {args['timeout']} s "
                    "(model_weights_download_timeout); the download goes on on the host"
                )
            if args.get("progress_file") and now >= next_print:
                last = self._progress(args["progress_file"], task_vars) or last
                if last:
                    display.display(progress_line(host, args["label"], last))
                next_print = now + args["interval"]
            time.sleep(args["poll"])
        self._status(args["jid"], async_dir, task_vars, mode="cleanup")
        if args.get("progress_file"):
            last = self._progress(args["progress_file"], task_vars) or last
        for key in ASYNC_KEYS:
            status.pop(key, None)
        result.update(status)
        result["progress"] = last
        result["waited_s"] = round(time.monotonic() - started, 1)
        return result
