#!/usr/bin/python
"""What the deploy report reads back from the host in one module run: the server's main process, the NCCL
variables it really runs with (only those leave the host: its environment also holds the secrets), and the
last-known-good manifest."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_readback
short_description: Read back the SGLang server's NCCL environment and the last-known-good manifest
author: gpufleet maintainers (!UNKNOWN)
description:
  - Runs C(systemctl show --property=MainPID --property=Environment UNIT); with a main process, reads its
    C(/proc/PID/environ) (source C(process)), else the unit's C(Environment=) (source C(unit)); without a unit,
    source C(none).
  - Keeps only the variables whose names start with I(prefix); the process environment also holds the
    secrets of the unit's EnvironmentFile (API key, Hugging Face token), and they are never returned.
  - Reads the last-known-good manifest (JSON) when it exists. Reads only.
options:
  unit: {type: str, required: true, description: systemd unit of the server.}
  manifest: {type: path, default: "", description: The last-known-good manifest (JSON); empty = not read.}
  prefix: {type: str, default: NCCL_, description: Names of the environment variables kept.}
"""

EXAMPLES = r"""
- name: Read back the NCCL environment the server runs with and the last-known-good manifest
  gpufleet.fleet.sglang_server_readback:
    unit: sglang-server.service
    manifest: /var/lib/sglang-server/last-good/manifest.json
  register: readback
"""

RETURN = r"""
source: {type: str, returned: always, description: "C(process), C(unit) or C(none): where nccl_env was read."}
main_pid: {type: int, returned: always, description: The unit's MainPID (0 when not running).}
nccl_env: {type: dict, returned: always, description: The kept variables and their values.}
manifest: {type: dict, returned: always, description: The manifest's content; empty when absent or not JSON.}
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_readback import readback


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "manifest": {"type": "path", "default": ""},
            "prefix": {"type": "str", "default": "NCCL_"},
        },
        supports_check_mode=True,
    )
    p = module.params
    module.exit_json(changed=False, **readback(p["unit"], p["manifest"], p["prefix"]))


if __name__ == "__main__":
    main()
