#!/usr/bin/python
"""Ansible module: stage a model's files in a local directory, verified, before a server uses them."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_weights_stage
short_description: Stage model weights in a local directory (Hugging Face hub, HTTP mirror or path), verified
description:
  - Plans first, changes after. The plan lists the model's files with sizes and hashes (the hub's file metadata
    through C(huggingface_hub), or a mirror's manifest), checks which local files are already complete and
    verified, and checks the free space of O(dest) against what is still to fetch plus headroom. A refusal
    (bad token, gated repo without access, unknown revision, too little space) happens before any download.
  - O(source=hf) downloads with C(huggingface_hub) (C(hf_hub_download) into O(dest) as C(local_dir)) from
    O(endpoint) (the public hub or a company mirror). A connection dropped mid-file is resumed with a Range
    request by C(huggingface_hub) (in 10 MiB steps); files completed before an interruption are kept.
  - O(source=http) downloads from a plain HTTP(S) mirror whose C(manifest.json) lists every file with size and
    sha256 (the format this module writes, so a staged directory can serve as a mirror for other hosts).
    Partial files are kept in C(<dest>/.gpufleet-partial/) and resumed with Range requests, even across runs.
  - O(source=path) copies from a local or NFS directory (verified against its manifest when it has one, else
    against the source's own bytes).
  - Every file is checked after download - size and sha256 (LFS files on the hub, every file of a manifest) or
    the git blob id (small files on the hub). A corrupt file is removed and fetched again; a file that stays
    wrong fails the task. A file is only in place (under its name in O(dest)) once it is complete.
  - Writes C(<dest>/.gpufleet-manifest.json) (repo, commit, files with size and sha256) and a state file of
    what was verified; with a pinned commit, a complete directory is recognised without the network.
  - While it runs (best with C(async)), it writes progress (bytes, rate, ETA) as JSON to O(progress_file).
  - The token is read from O(token_file) (written by the role, mode 0600), never taken as an argument.
  - Supports check mode (plans and reports what would be fetched).
version_added: "1.0.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  source:
    description: Where the files come from.
    type: str
    choices: [hf, http, path]
    required: true
  dest:
    description: The local model directory (what the server's C(--model) points at).
    type: path
    required: true
  repo_id:
    description: Hub repository (C(namespace/name)); required for O(source=hf).
    type: str
  revision:
    description: Hub revision - a 40-hex commit id (pinned), or a branch or tag (resolved on every run).
    type: str
    default: main
  endpoint:
    description: Hub endpoint (a company mirror of the hub API works).
    type: str
    default: https://huggingface.co
  token_file:
    description: File holding the hub token (first line); empty or absent means no token.
    type: path
  allow_patterns:
    description: Only files matching one of these glob patterns (hub source).
    type: list
    elements: str
  ignore_patterns:
    description: Skip files matching these glob patterns (hub source).
    type: list
    elements: str
  mirror_url:
    description: Base URL of an HTTP(S) mirror for O(source=http); files are at C(<mirror_url>/<path>).
    type: str
  manifest_url:
    description: URL of the mirror's manifest; default C(<mirror_url>/manifest.json).
    type: str
  manifest:
    description: The manifest itself (a dict in the same format) instead of O(manifest_url), e.g. read by the
      controller from the host that staged the model, so a fan-out copy is checked against hashes that did not
      travel over the same connection as the files.
    type: dict
  source_path:
    description: Directory to copy from for O(source=path).
    type: path
  headroom_bytes:
    description: Free space that must remain on the filesystem of O(dest) after the download (bytes).
    type: int
    default: 0
  headroom_ratio:
    description: Free space that must remain, as a fraction of the model's total size (the larger of the two
      headrooms applies).
    type: float
    default: 0.05
  verify:
    description: C(quick) trusts files whose size and mtime match the last verification; C(full) hashes every file.
    type: str
    choices: [quick, full]
    default: quick
  max_workers:
    description: Files downloaded at once.
    type: int
    default: 4
  retries:
    description: Fetches of one file after the first that failed verification, before giving up.
    type: int
    default: 2
  disable_xet:
    description: Do not use the Xet transfer protocol (plain HTTP downloads from the hub).
    type: bool
    default: false
  timeout:
    description: Seconds to wait for a server to answer (metadata and each read).
    type: int
    default: 60
  progress_file:
    description: Where to write progress as JSON while the module runs (updated about every second).
    type: path
  headers:
    description: Extra HTTP headers for O(source=http) (e.g. a mirror's own auth; use no_log on the task).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: GLM-5 NVFP4 at a pinned commit from the hub (token in a 0600 file)
  model_weights_stage:
    source: hf
    repo_id: lukealonso/GLM-5-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    dest: /srv/models/lukealonso--GLM-5-NVFP4/0123456789abcdef0123456789abcdef01234567
    token_file: /etc/gpufleet/model_weights/hf_token
    progress_file: /run/gpufleet/model_weights/progress.json
  vars:
    ansible_python_interpreter: /opt/gpufleet/tools/hf/bin/python
  async: 86400
  poll: 0
  register: stage_job

- name: The same files from another host that staged them (its directory served over HTTP)
  model_weights_stage:
    source: http
    mirror_url: http://10.0.0.11:8496
    dest: /srv/models/lukealonso--GLM-5-NVFP4/0123456789abcdef0123456789abcdef01234567
"""

RETURN = r"""
path:
  description: The staged model directory.
  type: str
  returned: always
revision:
  description: The resolved commit id (hub) or the manifest's revision.
  type: str
  returned: success
files:
  description: Number of files in the model.
  type: int
  returned: success
total_bytes:
  description: Size of the model.
  type: int
  returned: success
needed_bytes:
  description: Bytes that had to be fetched (before this run).
  type: int
  returned: always
free_bytes:
  description: Free bytes on the filesystem of dest before the download.
  type: int
  returned: always
fetched:
  description: Files fetched in this run.
  type: list
  elements: str
  returned: success
refetched:
  description: Files found incomplete or corrupt (locally or after a transfer) and fetched again.
  type: list
  elements: str
  returned: success
resumed:
  description: Messages of downloads resumed after a dropped connection.
  type: list
  elements: str
  returned: success
offline:
  description: True when a complete directory at a pinned commit was recognised without asking the hub.
  type: bool
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_stager import StageError, Stager


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "source": {"type": "str", "required": True, "choices": ["hf", "http", "path"]},
            "dest": {"type": "path", "required": True},
            "repo_id": {"type": "str"},
            "revision": {"type": "str", "default": "main"},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "token_file": {"type": "path", "no_log": False},
            "allow_patterns": {"type": "list", "elements": "str"},
            "ignore_patterns": {"type": "list", "elements": "str"},
            "mirror_url": {"type": "str"},
            "manifest_url": {"type": "str"},
            "manifest": {"type": "dict"},
            "source_path": {"type": "path"},
            "headroom_bytes": {"type": "int", "default": 0},
            "headroom_ratio": {"type": "float", "default": 0.05},
            "verify": {"type": "str", "default": "quick", "choices": ["quick", "full"]},
            "max_workers": {"type": "int", "default": 4},
            "retries": {"type": "int", "default": 2},
            "disable_xet": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 60},
            "progress_file": {"type": "path"},
            "headers": {"type": "dict", "default": {}, "no_log": True},
        },
        required_if=[
            ("source", "hf", ["repo_id"]),
            ("source", "http", ["mirror_url"]),
            ("source", "path", ["source_path"]),
        ],
        supports_check_mode=True,
    )
    stager = Stager(module.params, module.check_mode, module.warn)
    try:
        result = stager.run()
    except StageError as exc:
        module.fail_json(msg=str(exc), **stager.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
