#!/usr/bin/python
"""A run lock kept as a file on a managed host: taken atomically (O_EXCL), owned by one run, reported with
its owner and age when another run finds it, broken only when asked."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_lock
short_description: Take, release or read a run lock file on the managed host
author: gpufleet maintainers (!UNKNOWN)
description:
  - The lock lives on the managed host (a gateway or server host), so every controller (laptops, AWX)
    sees the same lock. It is created with O_CREAT|O_EXCL, which is atomic on the host's filesystem.
  - Taking a lock held by another run fails with the owner, the run id and the age; a lock older than
    I(stale_after_s) is reported as stale. Only I(break_lock=true) replaces a held lock (the broken
    owner is returned).
options:
  path: {type: path, required: true, description: Lock file.}
  state:
    type: str
    choices: [acquired, released, query, free]
    default: query
    description: Wanted state; free checks that no other run holds the lock (fails like acquired) and writes nothing.
  run_id: {type: str, default: "", description: Identity of this run (required for acquired and released).}
  owner: {type: dict, default: {}, description: "Who holds the lock (user, controller, pid, playbook, ...)."}
  stale_after_s: {type: int, default: 7200, description: Age after which a held lock is reported as stale.}
  break_lock: {type: bool, default: false, description: Replace a lock held by another run.}
"""

EXAMPLES = r"""
- name: Take the fleet's run lock on the gateway host (refused with the holder's run id, owner and age)
  gpufleet.fleet.fleet_lock:
    path: /var/lib/gpufleet/locks/rollout-fleet.lock
    state: acquired
    run_id: "{{ rollout_run_id }}"
    owner: {user: "{{ lookup('env', 'USER') }}", controller: "{{ lookup('pipe', 'hostname') }}"}
    stale_after_s: 7200
  delegate_to: gateway-01

- name: Give it back at the end of the run
  gpufleet.fleet.fleet_lock:
    path: /var/lib/gpufleet/locks/rollout-fleet.lock
    state: released
    run_id: "{{ rollout_run_id }}"
  delegate_to: gateway-01
"""

RETURN = r"""
lock: {type: dict, returned: always, description: The lock's content after the call (empty when there is none).}
broken: {type: dict, returned: always, description: "The lock that was broken (break_lock), else empty."}
age_s: {type: float, returned: always, description: "Age of the lock found, in seconds."}
"""


import json
import os
import time

from ansible.module_utils.basic import AnsibleModule


def read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {}
    except ValueError:
        return {"run_id": "?", "owner": {"note": "unreadable lock file"}, "acquired_at": os.path.getmtime(path)}


def describe(lock: dict, age: float) -> str:
    owner = lock.get("owner", {})
    who = ", ".join(f"{k}={v}" for k, v in sorted(owner.items())) or "unknown owner"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lock.get("acquired_at", 0)))
    return f"run {lock.get('run_id', '?')} ({who}) since {since}, age {age:.0f} s"


def create(path: str, content: dict) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(content, fh, indent=2, sort_keys=True)
        fh.write("\n")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["acquired", "released", "query", "free"], "default": "query"},
            "run_id": {"type": "str", "default": ""},
            "owner": {"type": "dict", "default": {}},
            "stale_after_s": {"type": "int", "default": 7200},
            "break_lock": {"type": "bool", "default": False},
        },
        required_if=[("state", state, ["run_id"]) for state in ("acquired", "released", "free")],
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    found = read(path)
    age = time.time() - found.get("acquired_at", time.time()) if found else 0.0
    if p["state"] == "query":
        module.exit_json(changed=False, lock=found, broken={}, age_s=round(age, 1))
    if p["state"] == "released":
        if found and found.get("run_id") == p["run_id"]:
            if not module.check_mode:
                os.unlink(path)
            module.exit_json(changed=True, lock={}, broken={}, age_s=round(age, 1))
        # Not ours (or gone): leave it, say so.
        module.exit_json(changed=False, lock=found, broken={}, age_s=round(age, 1))

    mine = {"run_id": p["run_id"], "owner": p["owner"], "acquired_at": time.time(), "path": path}
    if found.get("run_id") == p["run_id"]:
        module.exit_json(changed=False, lock=found, broken={}, age_s=round(age, 1))
    if p["state"] == "free" and (not found or p["break_lock"]):
        module.exit_json(changed=False, lock=found, broken={}, age_s=round(age, 1))
    broken = {}
    if found:
        stale = age > p["stale_after_s"]
        if not p["break_lock"]:
            module.fail_json(
                msg=(
                    f"LOCKED: {path} on this host is held by {describe(found, age)}. "
                    + (
                        f"The lock is STALE (older than {p['stale_after_s']} s): if that run is gone, break it "
                        "with -e rollout_lock_break=true."
                        if stale
                        else "Another rollout is running; wait for it (or, if it is gone, break the lock "
                        "with -e rollout_lock_break=true)."
                    )
                ),
                lock=found,
                age_s=round(age, 1),
                stale=stale,
            )
        broken = dict(found, age_s=round(age, 1), stale=stale)
        if not module.check_mode:
            os.unlink(path)
    if not module.check_mode:
        try:
            create(path, mine)
        except FileExistsError:
            other = read(path)
            module.fail_json(msg=f"LOCKED: {path} was taken meanwhile by {describe(other, 0.0)}", lock=other)
    module.exit_json(changed=True, lock=mine, broken=broken, age_s=round(age, 1))


if __name__ == "__main__":
    main()
