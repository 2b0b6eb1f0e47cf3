#!/usr/bin/python
"""Several directories, each with its owner, group and mode, in one module run (ansible.builtin.file takes one
path a run: the server stage's six directories cost six module runs, a new Python each, on every deploy)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: directories
short_description: Make sure several directories exist with their owner, group and mode, in one run
author: gpufleet maintainers (!UNKNOWN)
description:
  - For each entry, creates the directory (and missing parents, as C(ansible.builtin.file) with
    I(state=directory) does) and sets its owner, group and mode with Ansible's own attribute helpers,
    so changed, check mode and diff behave as they do for C(ansible.builtin.file).
  - A path that exists and is not a directory fails the task, naming the path; nothing is changed for it.
options:
  directories:
    type: list
    elements: dict
    required: true
    description: The directories, in order (a parent before its children).
    suboptions:
      path: {type: path, required: true, description: The directory.}
      owner: {type: str, description: User that owns it (name or uid); unchanged when omitted.}
      group: {type: str, description: Its group (name or gid); unchanged when omitted.}
      mode: {type: raw, description: 'Its mode, such as C("0750") (a string, as for ansible.builtin.file).'}
"""

EXAMPLES = r"""
- name: Create the server's directories
  gpufleet.fleet.directories:
    directories:
      - {path: /etc/sglang-server, owner: root, group: root, mode: "0755"}
      - {path: /etc/sglang-server/candidate, owner: root, group: root, mode: "0700"}
      - {path: /var/cache/sglang, owner: sglang, group: sglang, mode: "0750"}
"""

RETURN = r"""
changed_paths:
  type: list
  elements: str
  description: The directories created or whose owner, group or mode changed (would change, in check mode).
  returned: always
"""


import os

from ansible.module_utils.basic import AnsibleModule


def ensure(module: AnsibleModule, entry: dict) -> bool:
    path = entry["path"]
    changed = False
    if os.path.lexists(path) and not os.path.isdir(path):
        module.fail_json(msg=f"{path} exists and is not a directory: move it away or fix the path")
    if not os.path.isdir(path):
        if module.check_mode:
            return True
        os.makedirs(path)
        changed = True
    args = {"path": path, "owner": entry["owner"], "group": entry["group"], "mode": entry["mode"]}
    return module.set_fs_attributes_if_different({**args, "secontext": None, "attributes": None}, changed)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "owner": {"type": "str"},
                    "group": {"type": "str"},
                    "mode": {"type": "raw"},
                },
            }
        },
        supports_check_mode=True,
    )
    changed_paths = [e["path"] for e in module.params["directories"] if ensure(module, e)]
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths)


if __name__ == "__main__":
    main()
