"""The connection of the proxmox_gpu_vm modules to the Proxmox VE API: community.proxmox's connection options and
its ProxmoxAnsible (proxmoxer), password or API token auth as proxmox_kvm takes them. Each module documents the
options with the community.proxmox.proxmox documentation fragments."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.community.proxmox.plugins.module_utils.proxmox import (
    ProxmoxAnsible,
    proxmox_auth_argument_spec,
)


def proxmox_module(**options) -> AnsibleModule:
    """An AnsibleModule (check mode supported) with community.proxmox's connection options and the module's own
    options: a password or a token id with its secret."""
    spec = proxmox_auth_argument_spec()
    spec.update(options)
    return AnsibleModule(
        argument_spec=spec,
        supports_check_mode=True,
        required_one_of=[("api_password", "api_token_id")],
        required_together=[("api_token_id", "api_token_secret")],
    )


def proxmox_api(module: AnsibleModule):
    """The proxmoxer ProxmoxAPI of the module's connection options (community.proxmox's ProxmoxAnsible)."""
    return ProxmoxAnsible(module).proxmox_api
