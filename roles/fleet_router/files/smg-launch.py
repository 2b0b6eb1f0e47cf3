"""gpufleet launcher of the Shepherd Model Gateway (smg 1.13.0): `smg launch` with the control-plane keys
taken from the environment instead of argv.

smg reads its control-plane API keys only from `--control-plane-api-keys id:name:role:key` (smg 1.13.0
router_args.py `_parse_control_plane_api_keys`; no environment variable, no config file). Keys on a command
line are visible in the unit file, `systemctl show`, `ps` and /proc/<pid>/cmdline. systemd reads
GPUFLEET_SMG_CONTROL_PLANE_API_KEYS (one 'id:name:role:key' per line) from an EnvironmentFile of mode 0600;
this launcher removes it from the environment and hands the entries to smg's own parser in this process
(smg.launch_router.parse_router_args + launch_router, what `smg launch` runs), so they never reach an argv.

It also starts smg with the workers that should be in the router: the gateway's record (GPUFLEET_SMG_WORKERS_FILE,
JSON {"workers": [<url>, ...]}, kept by gpufleet.fleet.fleet_router_workers at every add and removal) becomes
`--worker-urls`. smg submits startup workers as background registration jobs, each probed before it is listed
(lightseekorg/smg model_gateway/src/server.rs `Job::InitializeWorkersFromConfig`, read at v1.9.0 and later; seen
with the 1.13.0 wheel on the lab: docs/fleet-router.md "A router restart"), so the router listens at once and a
crash, an OOM kill or a reboot of the gateway comes back serving the recorded workers that answer, without Ansible.
A worker a rollout took out is not in the record, so it stays out. No record: no workers (the first deploy).

Servers with an API key (sglang_server_api_key): GPUFLEET_SMG_WORKER_API_KEY (same EnvironmentFile) becomes smg's
`--api-key`, the key smg gives the workers it starts with (model_gateway/src/workflow/job_queue.rs
`InitializeWorkersFromConfig`: `spec.api_key.clone_from(&api_key)`) and asks of its clients on the serving path, so
a fleet whose servers ask for a key is not opened to anyone by its gateway. Without it smg reaches a keyed server's
/health (SGLang needs no key there) but not its model information: the worker is listed, and no request for the
model finds it (smg answers 404 model_not_found).
"""

import json
import os
import sys

ENV_NAME = "GPUFLEET_SMG_CONTROL_PLANE_API_KEYS"
WORKERS_ENV = "GPUFLEET_SMG_WORKERS_FILE"
WORKER_KEY_ENV = "GPUFLEET_SMG_WORKER_API_KEY"


def recorded_workers(path: str) -> list[str]:
    """The record's worker URLs; a missing record is none, an unreadable one is said in the journal and is none
    (the router must come up: the next add or removal writes the record again)."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            urls = json.load(f)["workers"]
        if not isinstance(urls, list) or not all(isinstance(u, str) and u.startswith("http") for u in urls):
            raise ValueError("'workers' is not a list of http(s) URLs")
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"gpufleet-smg-launch: worker record {path} not usable ({exc}): starting with no worker", file=sys.stderr)
        return []
    print(f"gpufleet-smg-launch: starting with the {len(urls)} recorded worker(s) of {path}: {' '.join(urls)}",
          file=sys.stderr)  # fmt: skip
    return urls


def main() -> None:
    entries = [line.strip() for line in os.environ.pop(ENV_NAME, "").replace("\\n", "\n").splitlines()]
    entries = [entry for entry in entries if entry]
    if not entries:
        # The worker-management API of smg answers anyone when no key is configured: refuse to start.
        sys.exit(f"gpufleet-smg-launch: {ENV_NAME} is empty: the gateway's worker API would be open to anyone")
    workers = recorded_workers(os.environ.get(WORKERS_ENV, ""))
    # The servers' API key (see the module docstring): the key of the workers smg starts with, and of its clients.
    worker_key = os.environ.pop(WORKER_KEY_ENV, "").strip()
    from smg.launch_router import launch_router, parse_router_args

    argv = [*sys.argv[1:], *(["--worker-urls", *workers] if workers else []), "--control-plane-api-keys", *entries]
    if worker_key:
        argv += ["--api-key", worker_key]
    launch_router(parse_router_args(argv))


if __name__ == "__main__":
    main()
