#!/usr/bin/python
"""Keep the installed server version as the last-known-good, in one module run (it was a checksum module, a
shell, a stat and a template: five module runs, a new Python on the host each, on every host of a batch)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_last_good
short_description: Keep the installed SGLang server unit and secrets as the last-known-good version
author: gpufleet maintainers (!UNKNOWN)
description:
  - Compares the installed unit and secrets file with the copies in I(last_good_dir) (SHA-256). When either
    differs, the former last-known-good folder becomes I(previous_good_dir) (the target of an on-demand rollback;
    the one before it is removed), and a new I(last_good_dir) gets copies of the installed unit (root, 0644) and
    secrets (root, 0600) and C(manifest.json) (0644), which is I(manifest) with C(unit_sha256) (the installed unit's
    sum) added. The folder is root's, mode 0700. Each file is written to a temporary name and renamed.
  - Then, when I(previous_good_dir) holds a C(secrets.env) whose content differs from I(kept_secrets), that file
    is rewritten with I(kept_secrets) (root, 0600). Secrets follow the configuration into every kept copy, so a
    key or token removed from the inventory leaves no copy on the host.
  - Unchanged files and kept secrets that already match change nothing. Check mode reports what would change.
  - A missing installed unit fails the module (nothing is saved); a missing installed secrets file is saved as
    missing (no C(secrets.env) in the copy).
options:
  unit_path:
    type: path
    required: true
    description: The installed unit file (e.g. C(/etc/systemd/system/sglang-server.service)).
  secrets_path:
    type: path
    required: true
    description: The installed secrets file (the unit's EnvironmentFile).
  last_good_dir:
    type: path
    required: true
    description: Folder of the last-known-good copy; the unit is kept under its own file name, the secrets as
      C(secrets.env).
  previous_good_dir:
    type: path
    required: true
    description: Folder the former last-known-good moves to.
  manifest:
    type: dict
    required: true
    description: What the saved version is (release, flags, health facts); written as C(manifest.json) with
      C(unit_sha256) added.
  kept_secrets:
    type: str
    required: true
    description: Content of a kept version's C(secrets.env) as the configuration says now (never logged).
  readback_unit:
    type: str
    default: ""
    description:
      - When set, the server unit whose read-back the deploy report takes, returned as C(readback) after the save
        (what M(gpufleet.fleet.sglang_server_readback) returns - the unit's main process, the C(NCCL_*) variables that
        process runs with, and the last-known-good manifest just written). The report then needs no module run of
        its own on the host. Empty means no read-back.
"""

EXAMPLES = r"""
- name: Keep the proven version as the last-known-good
  gpufleet.fleet.sglang_server_last_good:
    unit_path: /etc/systemd/system/sglang-server.service
    secrets_path: /etc/sglang-server/secrets.env
    last_good_dir: /var/lib/gpufleet/sglang-server/last-good
    previous_good_dir: /var/lib/gpufleet/sglang-server/previous-good
    manifest:
      release: /opt/ml-env/releases/sim-a
      argv: [/opt/ml-env/releases/sim-a/bin/python, -m, sglang.launch_server]
    kept_secrets: "{{ lookup('ansible.builtin.template', 'secrets.env.j2') }}"
    readback_unit: sglang-server.service
  register: saved
"""

RETURN = r"""
saved:
  type: bool
  description: Whether a new last-known-good was written (the installed unit or secrets differed from it).
  returned: always
kept_secrets_rewritten:
  type: bool
  description: Whether the previous-good version's C(secrets.env) was rewritten from I(kept_secrets).
  returned: always
unit_sha256:
  type: str
  description: SHA-256 of the installed unit (the manifest's C(unit_sha256)).
  returned: always
readback:
  type: dict
  description: The read-back of I(readback_unit) after the save (sglang_server_readback's C(source), C(main_pid),
    C(nccl_env), C(manifest)); no secret is in it.
  returned: when readback_unit is set
"""


import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_files import write_root_file
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_readback import readback

SECRETS_NAME = "secrets.env"
MANIFEST_NAME = "manifest.json"


def sha256(module: AnsibleModule, path: str) -> str:
    return module.digest_from_file(path, "sha256") if os.path.isfile(path) else ""


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def save(params: dict, module: AnsibleModule) -> dict:
    unit_path, secrets_path = params["unit_path"], params["secrets_path"]
    lkg, previous = params["last_good_dir"], params["previous_good_dir"]
    if not os.path.isfile(unit_path):
        raise FileNotFoundError(f"the installed unit {unit_path} does not exist: nothing to keep as last-known-good")
    kept_unit = os.path.join(lkg, os.path.basename(unit_path))
    unit_sum = sha256(module, unit_path)
    saved = unit_sum != sha256(module, kept_unit) or sha256(module, secrets_path) != sha256(
        module, os.path.join(lkg, SECRETS_NAME)
    )
    if saved and not module.check_mode:
        if os.path.lexists(previous):
            shutil.rmtree(previous)
        if os.path.isdir(lkg):
            os.rename(lkg, previous)
        os.makedirs(lkg, mode=0o700)
        os.chmod(lkg, 0o700)
        os.chown(lkg, 0, 0)
        write_root_file(kept_unit, read_bytes(unit_path) or b"", 0o644)
        secrets = read_bytes(secrets_path)
        if secrets is not None:
            write_root_file(os.path.join(lkg, SECRETS_NAME), secrets, 0o600)
        manifest = {**params["manifest"], "unit_sha256": unit_sum}
        text = json.dumps(manifest, indent=4, sort_keys=True) + "\n"
        write_root_file(os.path.join(lkg, MANIFEST_NAME), text.encode(), 0o644)
    # After a save in check mode, previous-good would be today's last-good: judge the secrets of that one.
    kept_dir = lkg if saved and module.check_mode else previous
    kept_path = os.path.join(kept_dir, SECRETS_NAME)
    wanted = params["kept_secrets"].encode()
    current = read_bytes(kept_path)
    rewritten = current is not None and current != wanted
    if rewritten and not module.check_mode:
        write_root_file(os.path.join(previous, SECRETS_NAME), wanted, 0o600)
    return {"changed": saved or rewritten, "saved": saved, "kept_secrets_rewritten": rewritten, "unit_sha256": unit_sum}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit_path": {"type": "path", "required": True},
            "secrets_path": {"type": "path", "required": True},
            "last_good_dir": {"type": "path", "required": True},
            "previous_good_dir": {"type": "path", "required": True},
            "manifest": {"type": "dict", "required": True},
            "kept_secrets": {"type": "str", "required": True, "no_log": True},
            "readback_unit": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    try:
        result = save(module.params, module)
    except OSError as exc:
        module.fail_json(msg=f"sglang_server_last_good: {exc}")
    if module.params["readback_unit"]:
        manifest = os.path.join(module.params["last_good_dir"], MANIFEST_NAME)
        result["readback"] = readback(module.params["readback_unit"], manifest)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
