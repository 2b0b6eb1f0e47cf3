"""The journal of one start (invocation) of the SGLang server unit: journalctl matches (also the filter
sglang_journal_match), the start's lines, and the start-up phases SGLang's log lines mark.
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run

# SGLang's start-up log lines -> phase (the last one seen is the current phase).
PHASES = (
    ("starting", re.compile(r"Uvicorn running on|server_args=|Started server process")),
    ("loading weights", re.compile(r"Load weight begin")),
    ("weights loaded", re.compile(r"Load weight end")),
    ("KV cache allocated", re.compile(r"KV Cache is allocated")),
    ("capturing CUDA graphs", re.compile(r"Capture cuda graph begin")),
    ("CUDA graphs captured", re.compile(r"Capture cuda graph end")),
    ("warming up", re.compile(r"Start of (?:co-?)?locate warmup|warmup request|End of prefill disaggregation")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
    ("draining", re.compile(r"Draining requests and shutting down|Gracefully exiting")),
)


def _since(value) -> str:
    """journalctl --since: an epoch as ``@N``; a systemd timestamp (``ExecMainStartTimestamp``) as it is."""
    return f"--since=@{int(value)}" if isinstance(value, (int, float)) else f"--since={value}"


def journal_match(unit, invocation_id=None, main_pid=0, since=None, unit_since=None):
    """journalctl matches for the lines of one start of the unit.

    Its InvocationID, or else the unit since ``unit_since`` (else this boot); and, OR-ed in, its main process
    (``_PID`` since ``since``, the start). journald attributes a stdout line to the unit and invocation by
    reading the writer's cgroup from /proc when it handles the line; a process that crashes at once (a CUDA
    init failure) has often exited by then, and its last lines carry ``_PID`` but no
    ``_SYSTEMD_UNIT``/``_SYSTEMD_INVOCATION_ID`` (systemd issue 2913; systemd PR 33021 stops using
    ``journalctl -u`` for such lines). Used by the modules (journal_lines) and, as the filter
    sglang_journal_match, by the rollback's journal excerpt."""
    if invocation_id:
        match = [f"_SYSTEMD_INVOCATION_ID={invocation_id}"]
    else:
        match = ["-u", unit] + ([_since(unit_since)] if unit_since else ["-b"])
    if int(main_pid or 0) and since:
        match += ["+", f"_PID={int(main_pid)}", _since(since)]
    return match


def journal_lines(unit, invocation_id=None, runner=run, lines=None, main_pid=0, since=None):
    """``[(epoch_seconds, message)]`` of one start of the unit (journal_match), oldest first."""
    argv = ["journalctl", "--no-pager", "-o", "json"] + journal_match(unit, invocation_id, main_pid, since)
    if lines:
        argv += ["-n", str(int(lines))]
    rc, out, _err = runner(argv, timeout=60)
    result = []
    if rc != 0:
        return result
    for line in out.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        msg = rec.get("MESSAGE", "")
        if isinstance(msg, list):  # binary message: journald gives bytes
            msg = bytes(msg).decode("utf-8", "replace")
        ts = int(rec.get("__REALTIME_TIMESTAMP", "0")) / 1e6
        result.append((ts, msg or ""))
    return result


def phase_timeline(entries):
    """``[{"phase", "at"}]``: the first time each phase's log line appeared (journal order)."""
    seen, timeline = set(), []
    for ts, msg in entries:
        for phase, rx in PHASES:
            if phase not in seen and rx.search(msg):
                seen.add(phase)
                timeline.append({"phase": phase, "at": ts})
    return timeline


def current_phase(timeline):
    return timeline[-1]["phase"] if timeline else "process started"
