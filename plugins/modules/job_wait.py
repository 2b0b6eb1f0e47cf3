#!/usr/bin/python
"""Documentation of the job_wait action (the code is plugins/action/job_wait.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: job_wait
short_description: Wait for an async job on a host, printing its progress at intervals
description:
  - The one pattern for long waits in this collection. Start the work as an async task (C(async), C(poll=0)),
    then this action (it runs on the controller) polls the job every O(poll) seconds and, every O(interval)
    seconds, prints a line per host, read from the job's JSON progress file (O(progress_file)) or from the
    last line of its log (O(log_file)).
  - The job's record is read with one shell command over the connection, not a module run (no Python started on
    the host), which waits on the host while the record says the job runs, looking at it every O(poll) seconds (the
    first look after 0.25 s), until the next progress line is due (one ssh command per progress line); a job is
    seen ended within a look of its end. Once the record says the job ended, its result is that file's record as
    ansible-core's async_status module reads it (async_status runs on the host only when the job file is missing).
  - A progress record with C(phase=download) and bytes prints bytes done and total, rate and ETA; any other
    record prints its C(phase) and C(message).
  - Returns the job's result (the module's return values, or C(rc) and output of a command), and fails with
    its message if it failed. A job still running after O(timeout) seconds fails with C(rc=124) and a message
    naming O(timeout_variable).
  - In check mode it does nothing.
version_added: "1.0.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  jid:
    description: The job id of the async task (C(ansible_job_id)).
    type: str
    required: true
  job_file:
    description:
      - The job's record on the host, for a job that a module started itself and returned (C(results_file) of
        gpufleet.fleet.sglang_server_swap's C(ready_job)) instead of an async task's. It has async_wrapper's
        format; a missing file fails the wait.
    type: str
  what:
    description: Who waits (the role's name), first word of every progress line and message.
    type: str
    required: true
  progress_file:
    description: A JSON progress file the job writes on the host (C(phase), C(message), or download counters).
    type: str
  log_file:
    description: The job's log on the host; its last line is shown with each progress line and its last
      4000 characters are returned as C(log_tail).
    type: str
  interval:
    description: Seconds between progress lines.
    type: int
    default: 30
  poll:
    description:
      - Seconds between looks at the job's record on the host once it has run a while (the first look comes after
        0.25 s and the wait doubles up to this).
    type: float
    default: 2.0
  timeout:
    description: Give up waiting after this many seconds.
    type: int
    default: 86400
  timeout_variable:
    description: The variable that set O(timeout), named in the message when it runs out.
    type: str
    default: timeout
  label:
    description: Text shown in each progress line (e.g. the model's name, the step).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Stage the model (async job)
  gpufleet.fleet.model_weights_stage:
    repo_id: org/model
    dest: /srv/models/model
    progress_file: /run/gpufleet/model_weights/progress.json
  async: 7200
  poll: 0
  register: stage_job

- name: Wait for the download, progress every 30 s
  gpufleet.fleet.job_wait:
    jid: "{{ stage_job.ansible_job_id }}"
    what: model_weights
    progress_file: /run/gpufleet/model_weights/progress.json
    interval: 30
    timeout: 7200
    timeout_variable: model_weights_download_timeout
"""

RETURN = r"""
progress:
  description: The last progress record (with O(progress_file)).
  type: dict
  returned: with progress_file
log_tail:
  description: The last 4000 characters of the log (with O(log_file)).
  type: str
  returned: with log_file
waited_s:
  description: Seconds waited.
  type: float
  returned: always
rc:
  description: The command's exit status (a command job), or 124 when O(timeout) ran out.
  type: int
  returned: for command jobs and on timeout
"""
