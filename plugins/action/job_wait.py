"""Action plugin: wait for an async job on a host, printing its progress in the Ansible output.

The one pattern for long waits in gpufleet (model staging, ml-env installs and kernel builds, the server's
readiness): start the work as an async task (``async: N``, ``poll: 0``), then ``gpufleet.fleet.job_wait``
polls the job (first after 0.25 s, the wait doubling up to ``poll`` seconds) and, every ``interval``
seconds, prints one line per host read from the job's JSON progress file (``progress_file``) or from the tail of
its log (``log_file``).
The job's record is read over the connection with one shell command (no Python module on the host: the lab measured
Ansible module runs over ssh as most of a run's CPU) that waits on the host while the record says the job runs, looking
at it every few tenths of a second, until the next progress line is due (``HOST_WAIT``): one ssh command per progress
line instead of one per look. Once the record says the job ended, the result is that
file's record read as ansible-core's async_status module reads it (``async_result``), so the task returns exactly
what async_status would without another module run on the host; async_status itself runs only when the job
file is missing (its message says why). A job that a module started on the host itself (sglang_server_swap's
readiness job) writes the same record to a file it names: ``job_file``.
Returns the job's own result, so the task fails with the module's message when the job failed; a job still
running after ``timeout`` seconds fails with rc 124 and a message naming ``timeout_variable``.
Documentation: plugins/modules/job_wait.py.
"""

from __future__ import annotations

import json
import shlex
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import human

display = Display()

ASYNC_KEYS = (
    "ansible_job_id",
    "started",
    "finished",
    "results_file",
    "erased",
)
LOG_TAIL_CHARS = 4000
# The first look comes this soon and the wait doubles up to `poll`: a job that ends in half a second (a no-op
# staging, a cached step) is seen after about 0.75 s instead of one whole `poll` (2 s by default), and a long
# job costs three looks more (shell builtins and a `sleep` on the host, no ssh round trip).
FIRST_POLL_S = 0.25
# One ssh command: `sh -c HOST_WAIT job_wait <job file> <sleep>...`. While the record says the job runs (the
# `"finished": false` of ansible-core 2.19 async_wrapper's running record, one line, or the `"finished": 0` of
# sglang_server_swap's readiness job, indented), sleep the next of the
# given seconds; then print the record (a missing file: cat fails, and the caller asks async_status why). Builtins
# only but `sleep` and `cat`; a record that merely contains those words after the job ended costs the rest of the
# sleeps, never a wrong answer: the caller reads the printed record with job_file_ended.
HOST_WAIT = (
    'f=$1; shift; running() { [ -f "$f" ] || return 1; while IFS= read -r l || [ -n "$l" ]; do '
    'case $l in *\'"finished": 0\'* | *\'"finished": false\'*) return 0;; esac; done < "$f"; return 1; }; '
    'for s do running || break; sleep "$s"; done; cat -- "$f"'
)


def poll_delay(checks_done: int, poll: float) -> float:
    """Seconds to sleep after the given number of checks: FIRST_POLL_S, doubled each time, at most poll."""
    return min(poll, FIRST_POLL_S * 2 ** min(checks_done, 16))


def host_sleeps(checks_done: int, poll: float, window_s: float) -> list[float]:
    """The sleeps of one wait on the host: poll_delay's from look ``checks_done`` on, until ``window_s`` seconds (the
    time to the next progress line or to the timeout) are used; at least one."""
    sleeps: list[float] = []
    total = 0.0
    while not sleeps or total < window_s - 1e-6:
        step = min(poll_delay(checks_done + len(sleeps), poll), max(window_s - total, 0.05))
        sleeps.append(round(step, 3))
        total += step
    return sleeps


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def progress_line(what: str, host: str, label: str, p: dict) -> str:
    """One progress line from a progress record.

    A download record (phase ``download`` with bytes) reads
    ``model_weights [h1] GLM-5: 1.2 GiB / 4.0 GiB (30%), 52.0 MiB/s, ETA 55s, files 1/4``; any other record
    ``<what> [<host>] <label>: <phase> <message>``.
    """
    phase = p.get("phase", "?")
    head = f"{what} [{host}] {label}".rstrip()
    if phase != "download" or not p.get("bytes_total"):
        return f"{head}: {phase} {p.get('message', '')}".rstrip()
    done, total = p.get("bytes_done", 0), p["bytes_total"]
    current = ", ".join(p.get("current") or [])
    return (
        f"{head}: {human(done, 1)} / {human(total, 1)} ({100 * done / total:.0f}%), "
        f"{human(p.get('rate_bps') or 0, 1)}/s, ETA {duration(p.get('eta_s'))}, "
        f"files {p.get('files_done', 0)}/{p.get('files_total', 0)}" + (f" ({current})" if current else "")
    )


def job_file_ended(text: str) -> bool:
    """Whether an async job file (``<async_dir>/<jid>``) says the job ended, read as ansible-core's
    async_status reads it (modules/async_status.py): empty or not yet valid JSON = still running; a record
    without ``started`` is the module's result (ended); else its ``finished`` flag."""
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    return "started" not in data or bool(data.get("finished"))


def async_result(text: str, jid: str) -> dict:
    """The result ansible-core 2.19's async_status module prints for an ended job's file (modules/async_status.py,
    status mode, which prints the record as it is): the job module's record, with ``finished`` and the job id
    added when async_wrapper did not write the record itself (no ``started``)."""
    data = json.loads(text)
    if "started" not in data:
        data["finished"] = True
        data["ansible_job_id"] = jid
    elif "finished" not in data:
        data["finished"] = False
    return data


def log_line(what: str, host: str, label: str, elapsed_s: float, tail: str) -> str:
    """``ml_env [h1] uv pip sync: running 1m05s: <last line of the log>``."""
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "(no output yet)")
    return f"{what} [{host}] {label}: running {duration(elapsed_s)}: {last[:200]}".rstrip()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(
        (
            "jid",
            "job_file",
            "progress_file",
            "log_file",
            "interval",
            "poll",
            "timeout",
            "timeout_variable",
            "label",
            "what",
        )
    )

    def _status(self, jid: str, async_dir: str, task_vars: dict) -> dict:
        return self._execute_module(
            module_name="ansible.legacy.async_status",
            module_args={"jid": jid, "mode": "status", "_async_dir": async_dir},
            task_vars=task_vars,
        )

    def _read(self, argv: list[str]) -> str | None:
        """stdout of a plain command on the host (no module), None when it fails (e.g. no such file)."""
        res = self._low_level_execute_command(" ".join(shlex.quote(a) for a in argv), sudoable=True)
        return res.get("stdout", "") if res.get("rc") == 0 else None

    def _poll(
        self, jid: str, async_dir: str, job_file: str, task_vars: dict, started_by_async: bool, sleeps: list[float]
    ) -> dict:
        """{} while the job runs; once it ended, what async_status returns for it (read from its record, which the
        host waits on while the job runs, through ``sleeps``; async_status runs only when there is no job file of an
        `async` task, to say why)."""
        text = self._read(["sh", "-c", HOST_WAIT, "job_wait", job_file, *(f"{s:g}" for s in sleeps)])
        if text is None:
            if started_by_async:
                return self._status(jid, async_dir, task_vars)
            return {"failed": True, "msg": f"the job's record {job_file} is missing (job {jid})"}
        return async_result(text, jid) if job_file_ended(text) else {}

    def _progress(self, path: str) -> dict | None:
        text = self._read(["cat", "--", path])
        try:
            return json.loads(text) if text else None
        except ValueError:
            return None

    def _log_tail(self, path: str) -> str:
        return self._read(["tail", "-c", str(LOG_TAIL_CHARS), "--", path]) or ""

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _unused, args = self.validate_argument_spec(
            argument_spec={
                "jid": {"type": "str", "required": True},
                "job_file": {"type": "str"},
                "progress_file": {"type": "str"},
                "log_file": {"type": "str"},
                "interval": {"type": "int", "default": 30},
                "poll": {"type": "float", "default": 2.0},
                "timeout": {"type": "int", "default": 86400},
                "timeout_variable": {"type": "str", "default": "timeout"},
                "label": {"type": "str", "default": ""},
                "what": {"type": "str", "required": True},
            },
            mutually_exclusive=[("progress_file", "log_file")],
        )
        if self._task.check_mode:
            result.update(skipped=True, msg="nothing to wait for in check mode")
            return result
        host = task_vars.get("inventory_hostname", "?")
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        # async_wrapper's record of the job, or the record a module wrote for the job it started (job_file)
        job_file = args["job_file"] or f"{async_dir.rstrip('/')}/{args['jid']}"
        started = time.monotonic()
        next_print = started + min(args["interval"], 5)
        last = None
        checks = 0
        while True:
            # the host waits until the next progress line is due (or the timeout)
            window = max(min(next_print, started + args["timeout"]) - time.monotonic(), 0.0)
            sleeps = host_sleeps(checks, args["poll"], window)
            checks += len(sleeps)
            status = self._poll(args["jid"], async_dir, job_file, task_vars, not args["job_file"], sleeps)
            if status.get("finished") or (status.get("failed") and not status.get("started")):
                break
            now = time.monotonic()
            if now - started > args["timeout"]:
                result.update(
                    failed=True,
                    rc=124,
                    msg=(
                        f"{args['what']}: {args['label'] or 'the job'} did not finish within {args['timeout']} s "
                        f"({args['timeout_variable']}); it goes on on the host until "
                        + ("its own bound" if args["job_file"] else "its async limit")
                    ),
                )
                break
            if now >= next_print:
                if args.get("progress_file"):
                    last = self._progress(args["progress_file"]) or last
                    if last:
                        display.display(progress_line(args["what"], host, args["label"], last))
                elif args.get("log_file"):
                    tail = self._log_tail(args["log_file"])
                    display.display(log_line(args["what"], host, args["label"], now - started, tail))
                next_print = now + args["interval"]
        if not result.get("failed"):
            self._read(["rm", "-f", "--", job_file])  # what async_status's cleanup mode does
            for key in ASYNC_KEYS:
                status.pop(key, None)
            result.update(status)
        if args.get("progress_file"):
            last = self._progress(args["progress_file"]) or last
            result["progress"] = last
        if args.get("log_file"):
            result["log_tail"] = self._log_tail(args["log_file"])
        result["waited_s"] = round(time.monotonic() - started, 1)
        return result
