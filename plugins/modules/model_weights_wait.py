#!/usr/bin/python
"""Documentation of the model_weights_wait action (the code is plugins/action/model_weights_wait.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_weights_wait
short_description: Wait for an async model_weights_stage job, printing progress at intervals
description:
  - Runs on the controller (action plugin). Polls the async job every O(poll) seconds and, every O(interval)
    seconds, prints a line per host with bytes done and total, rate and ETA, read from the job's progress file.
  - Returns the job's result (the staging module's return values), and fails with its message if it failed.
  - In check mode it does nothing (the role runs the staging module synchronously there).
version_added: "1.0.0"
author: gpufleet
options:
  jid:
    description: The job id of the async staging task (C(ansible_job_id)).
    type: str
    required: true
  progress_file:
    description: The progress file the staging module writes on the host.
    type: str
  interval:
    description: Seconds between progress lines.
    type: int
    default: 30
  poll:
    description: Seconds between checks of the job.
    type: float
    default: 2.0
  timeout:
    description: Give up waiting after this many seconds.
    type: int
    default: 86400
  label:
    description: Text shown in each progress line (e.g. the model's name).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Wait for the download
  model_weights_wait:
    jid: "{{ stage_job.ansible_job_id }}"
    progress_file: /run/gpufleet/model_weights/progress.json
    interval: 30
"""

RETURN = r"""
progress:
  description: The last progress record (bytes_done, bytes_total, rate_bps, eta_s, ...).
  type: dict
  returned: always
waited_s:
  description: Seconds waited.
  type: float
  returned: always
"""

if __name__ == "__main__":
    raise SystemExit("model_weights_wait is an action plugin: it runs on the controller")
