#!/usr/bin/python
"""Documentation of the controller_report action plugin (plugins/action/controller_report.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_report
short_description: Write a JSON report on the controller (action plugin, no module run)
author: gpufleet maintainers (!UNKNOWN)
description:
  - Writes O(data) as JSON (indent 4, sorted keys, as to_nice_json) to O(path) and to each path of O(also), on the
    controller, whatever host the task runs for. Folders are created (mode 0755); each file is written through a
    temporary file and a rename, so a reader never sees half a report.
  - "Runs inside the Ansible process (an action plugin): one task per host costs no module run, where
    C(file) and C(copy) on localhost cost three."
  - In check mode nothing is written.
options:
  path: {type: path, required: true, description: The report file on the controller.}
  also: {type: list, elements: path, default: [], description: More files with the same content (such as last.json).}
  data: {type: raw, required: true, description: The report.}
  mode: {type: str, default: "0644", description: Mode of the files written.}
"""

EXAMPLES = r"""
- name: Write the rollout report on the controller (reports/rollout/<run id>.json and last.json)
  gpufleet.fleet.controller_report:
    path: "{{ rollout_report_dir }}/{{ rollout_run_id }}.json"
    also: ["{{ rollout_report_dir }}/last.json"]
    data: "{{ rollout_report }}"
  run_once: true
"""

RETURN = r"""
path: {type: str, returned: always, description: The report file.}
also: {type: list, elements: str, returned: always, description: The other files written with the same content.}
changed: {type: bool, returned: always, description: Whether any file's content changed.}
"""
