"""gpufleet launcher of the Shepherd Model Gateway (smg 1.13.0): `smg launch` with the control-plane keys
taken from the environment instead of argv.

smg reads its control-plane API keys only from `--control-plane-api-keys id:name:role:key` (smg 1.13.0
router_args.py `_parse_control_plane_api_keys`; no environment variable, no config file). Keys on a command
line are visible in the unit file, `systemctl show`, `ps` and /proc/<pid>/cmdline. systemd reads
GPUFLEET_SMG_CONTROL_PLANE_API_KEYS (one 'id:name:role:key' per line) from an EnvironmentFile of mode 0600;
this launcher removes it from the environment and hands the entries to smg's own parser in this process
(smg.launch_router.parse_router_args + launch_router, what `smg launch` runs), so they never reach an argv.
"""

import os
import sys

ENV_NAME = "GPUFLEET_SMG_CONTROL_PLANE_API_KEYS"


def main() -> None:
    entries = [line.strip() for line in os.environ.pop(ENV_NAME, "").replace("\\n", "\n").splitlines()]
    entries = [entry for entry in entries if entry]
    if not entries:
        # The worker-management API of smg answers anyone when no key is configured: refuse to start.
        sys.exit(f"gpufleet-smg-launch: {ENV_NAME} is empty: the gateway's worker API would be open to anyone")
    from smg.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args([*sys.argv[1:], "--control-plane-api-keys", *entries]))


if __name__ == "__main__":
    main()
