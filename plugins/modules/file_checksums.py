#!/usr/bin/python
"""The SHA-256 of several files in one module run (ansible.builtin.stat reads one path a run: comparing a
candidate unit and secrets file with the installed ones cost four module runs, a new Python each)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: file_checksums
short_description: SHA-256 of several files on the managed host in one run
author: gpufleet maintainers (!UNKNOWN)
description:
  - Reads each path with Ansible's own digest (the sha256 C(ansible.builtin.stat) reports with
    I(checksum_algorithm=sha256)) and returns the sums in the order of I(paths).
  - A path that does not exist, or is not a regular file, gets an empty string, so two missing files
    compare equal and a missing file differs from any present one.
  - Reads only; never changes anything (check mode is supported).
options:
  paths:
    type: list
    elements: path
    required: true
    description: Files to read.
"""

EXAMPLES = r"""
- name: Compare the candidate unit with the installed one
  gpufleet.fleet.file_checksums:
    paths:
      - /etc/sglang-server/candidate/sglang-server.service
      - /etc/systemd/system/sglang-server.service
  register: sums

- name: Say whether it changed
  ansible.builtin.debug:
    msg: "{{ sums.checksums[0] != sums.checksums[1] }}"
"""

RETURN = r"""
checksums:
  type: list
  elements: str
  description: The SHA-256 (hex) of each path, in the order given; empty for a missing path or one that is not a file.
  returned: always
files:
  type: dict
  description: The same sums by path.
  returned: always
"""


import os

from ansible.module_utils.basic import AnsibleModule


def checksums(module: AnsibleModule, paths: list[str]) -> list[str]:
    return [module.digest_from_file(p, "sha256") if os.path.isfile(p) else "" for p in paths]


def main() -> None:
    module = AnsibleModule(argument_spec={"paths": {"type": "list", "elements": "path", "required": True}},
                           supports_check_mode=True)  # fmt: skip
    sums = checksums(module, module.params["paths"])
    module.exit_json(changed=False, checksums=sums, files=dict(zip(module.params["paths"], sums)))  # noqa: B905 (hosts with Python < 3.10)


if __name__ == "__main__":
    main()
