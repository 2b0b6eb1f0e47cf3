"""Action plugin: the fast path of a no-op deploy.yml (docs/sglang-server.md, "A no-op deploy").

``mode: check`` computes on the controller the digests of the run's inputs for this host (its variables from the
inventory and the extra vars, templated, minus Ansible's own and facts; gpufleet's code, which holds the role
defaults and play vars; ansible-core's version), runs the
module of the same name on the host to compare them and the host's state with the record of its last converged
deploy and, in the same module run, to prove a converged rank 0 by a generation (sglang_server_smoke's checks with
the recorded arguments). It returns ``converged``, ``reasons``, ``health`` and ``inputs`` (registered, not a
fact: a fact would be cached for later runs; the record of this run is written with them by ``mode: record`` at the
end of the server stage).
``mode: record`` runs the module as it is. ``mode: report`` runs nothing on the host: it writes the deploy reports of
the converged hosts on the controller (the last full report, its result, health and times renewed), every host's in
one task run (``checks``: host -> its registered check, which carries the host's ``report_dir``).
Documentation of the options: plugins/modules/sglang_server_converged.py.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import read_json, write_json

SCHEMA = "gpufleet.sglang_server.deploy/v1"
# What is not an input of a deploy: Ansible's own variables (only the connection's are kept), the play's state
# and this fast path's own switch.
NOT_INPUTS = frozenset(
    (
        "hostvars",
        "groups",
        "group_names",
        "inventory_hostname",
        "inventory_hostname_short",
        "inventory_dir",
        "inventory_file",
        "playbook_dir",
        "play_hosts",
        "role_names",
        "role_path",
        "role_name",
        "role_uuid",
        "omit",
        "environment",
        "vars",
        # how many servers restart at once: how a run goes, not what a host runs
        "sglang_server_serial",
    )
)
CONNECTION_VARS = frozenset(
    (
        "ansible_host",
        "ansible_port",
        "ansible_user",
        "ansible_connection",
        "ansible_python_interpreter",
        "ansible_become",
        "ansible_become_user",
        "ansible_become_method",
    )
)
# This fast path's own switch and results, and the rollout's variables: how a rollout runs (batches, budget,
# locks, its reports) is not what a host runs, so a no-op rollout.yml (-e rollout_serial=...) finds the record of
# the last deploy.yml as a no-op deploy.yml does. Molecule's own inventory variables (molecule_file names the
# ephemeral molecule.yml that Molecule rewrites at every step) describe the test run, not what a host runs.
NOT_INPUT_PREFIXES = ("sglang_server_converged", "rollout_", "molecule_")
# The collection's code: what a role or playbook does is in these folders (relative to the collection root).
CODE_FOLDERS = ("roles", "playbooks", "plugins", "templates", "locks", "meta")
CODE_FILES = ("galaxy.yml", "deploy.yml")


def is_input(name: str, facts: set[str]) -> bool:
    if name in NOT_INPUTS or name.startswith(NOT_INPUT_PREFIXES) or name in facts:
        return False
    return not name.startswith("ansible_") or name in CONNECTION_VARS


# Not code a deploy runs: Python's bytecode caches and the roles' Molecule scenarios (tests, which build into their
# own folders while they run)
NOT_CODE_DIRS = frozenset(("__pycache__", "molecule"))


def code_digest(root: str) -> str:
    """sha256 over the collection's code files (path and content), NOT_CODE_DIRS left out."""
    digest = hashlib.sha256()
    for top in CODE_FOLDERS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d not in NOT_CODE_DIRS)
            for name in sorted(files):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    for name in CODE_FILES:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                digest.update(name.encode() + b"\0" + handle.read())
    return digest.hexdigest()


def path_digest(path: str) -> str | None:
    """Size and mtime of a controller file named by an input (a lock, a key, a runfile), or None. Directories are
    not read: what a stage takes from one (a wheelhouse, a model source) is pinned by a lock or a revision, which
    are inputs, and an output directory (the reports) changes every run."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return f"{st.st_size}:{st.st_mtime_ns}" if os.path.isfile(path) else None


def controller_paths(value) -> list[str]:
    """Absolute paths among a value's strings."""
    if isinstance(value, str):
        return [value] if value.startswith("/") and "\n" not in value and len(value) < 4096 else []
    if isinstance(value, dict):
        return [p for v in value.values() for p in controller_paths(v)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in controller_paths(v)]
    return []


# The key of the input digests: a random key made once on the controller and never sent anywhere. The record on each
# server holds keyed digests (HMAC-SHA256) of every input, the secrets among them (API key, hub token, the router's
# control-plane key): with root on a server, a weak secret cannot be guessed offline from its digest without this key.
KEY_FILE_ENV = "GPUFLEET_CONVERGED_KEY_FILE"
DEFAULT_KEY_FILE = "~/.config/gpufleet/converged-digest.key"


def digest_key(path: str | None = None) -> bytes:
    """The controller's digest key (32 random bytes, mode 0600), made on first use."""
    path = os.path.expanduser(path or os.environ.get(KEY_FILE_ENV) or DEFAULT_KEY_FILE)
    try:
        with open(path, "rb") as handle:
            key = handle.read()
        if len(key) >= 32:
            return key
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    key = os.urandom(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return key


def key_id(key: bytes) -> str:
    """Names the key in the record (a hash of 32 random bytes says nothing of the inputs): a record made with another
    key (another controller) is told apart from inputs that changed."""
    return "hmac-sha256:" + hashlib.sha256(b"gpufleet converged key id\0" + key).hexdigest()[:12]


def value_digest(name: str, value, key: bytes) -> str:
    """A short keyed digest of one input: its templated value and the controller paths it names."""
    text = json.dumps(value, sort_keys=True, default=str)
    paths = {p: path_digest(p) for p in controller_paths(value)}
    blob = f"{name}\0{text}\0{json.dumps(paths, sort_keys=True)}"
    return hmac.new(key, blob.encode(), hashlib.sha256).hexdigest()[:20]


def input_digests(
    variables: dict, template, code: str, ansible_version: str, key: bytes, run_groups: frozenset = frozenset()
) -> dict:
    """{code, ansible, digest, vars: {name: digest}} of a host's inputs, keyed by ``key``; ``template(value)`` templates
    one value (a value that cannot be templated yet, as one naming a fact of this run, counts as written). Its
    ``group_names`` are the inventory's: the groups in ``run_groups`` (built by this run: run_groups) are left out."""
    facts = set((variables.get("ansible_facts") or {}).keys())
    facts |= {"ansible_" + f for f in facts}
    digests = {}
    for name in sorted(variables):
        if not is_input(name, facts):
            continue
        raw = variables[name]
        try:
            value = template(raw)
        except Exception:  # noqa: BLE001  (undefined now: a fact of this run; the text is the input)
            value = raw
        digests[name] = value_digest(name, value, key)
    groups = sorted(g for g in variables.get("group_names") or [] if g not in run_groups)
    digests["group_names"] = value_digest("group_names", groups, key)
    return {"code": code, "ansible": ansible_version, "digest": key_id(key), "vars": digests}


def run_groups(inventory) -> frozenset:
    """The groups this run built in memory (add_host, group_by: docs/architecture.md, "Plays and their hosts"), from
    the inventory manager's record of them (the one meta: refresh_inventory replays). Which hosts a run skips,
    restarts or locks is how that run goes, not what a host runs: the first play of the next deploy.yml, before any
    such group exists, must find the same group_names as the server stage that wrote the record."""
    names = set()
    for info in getattr(inventory, "_cached_dynamic_hosts", None) or []:
        names.update((info or {}).get("groups") or [])
    for _host, item in getattr(inventory, "_cached_dynamic_grouping", None) or []:
        names.add((item or {}).get("add_group"))
        names.update((item or {}).get("parent_groups") or [])
    return frozenset(n for n in names if n)


def multinode_peers(variables: dict) -> list:
    """The members of the host's multi-node group and their addresses (a server's units name its rank 0)."""
    group = variables.get("sglang_server_multinode_group") or ""
    if not isinstance(group, str) or group not in (variables.get("groups") or {}):
        return []
    hostvars = variables.get("hostvars") or {}
    return [[h, str((hostvars.get(h) or {}).get("ansible_host", h))] for h in variables["groups"][group]]


def renewed_report(previous: dict, host: str, check: dict, health: dict, seconds: float, record_path: str) -> dict:
    """The deploy report of a host proven converged: the last full report with its result, health, times and the
    engine's main PID renewed (the unit, its files and the GPUs are the recorded ones, so its versions, flags and
    environment are)."""
    report = dict(previous) if previous.get("schema") == SCHEMA else {"schema": SCHEMA, "host": host}
    report.update(
        {
            "host": host,
            "finished_at": datetime.datetime.now(datetime.UTC).replace(tzinfo=None).isoformat(),
            "result": "unchanged",
            "failure": {},
            "message": "",
            "restart_reasons": [],
            "restart": {},
            "rollback": {},
            "remedy": {},
            "held_memory": {},
            "timings": {"converged_check_s": round(seconds, 3), "total_s": round(seconds, 3)},
            "converged": {
                "fast_path": True,
                "record": record_path,
                "last_full_deploy_at": (previous.get("converged") or {}).get("last_full_deploy_at")
                or previous.get("finished_at", ""),
            },
        }
    )
    report["engine_env"] = dict(report.get("engine_env") or {}, main_pid=int(check.get("main_pid") or 0))
    if health:
        versions = dict(report.get("versions") or {})
        versions.update(engine=health.get("engine_version", ""), engine_is_simulator=bool(health.get("simulator")))
        report["versions"] = versions
        report["health"] = {
            "ok": bool(health.get("ok")),
            "checked_on": host,
            "health_status": health.get("health_status"),
            "models": health.get("models", []),
            "prompts": health.get("prompts", []),
            "journal_errors": health.get("journal_errors", []),
            "failures": health.get("failures", []),
        }
    else:  # rank > 0: rank 0 answered for the server in the same check
        report["health"] = dict(report.get("health") or {}, ok=True)
    return report


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("mode", "record_path", "inputs", "unit", "node_rank", "smoke", "nvidia_smi",
                             "enabled", "report_dir", "checks"))  # fmt: skip

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        mode = args.get("mode")
        if mode == "report":
            return self._report(result, args.get("checks") or {})
        if mode == "record":
            args.pop("enabled", None)
            args.pop("report_dir", None)
            # The inputs as they template at the end of the run, with the facts its stages gathered: a value that
            # names a fact (a lab address from ansible_facts) could not be templated by the first play on a new
            # host, and recording that text made the next no-op deploy.yml run every stage once more.
            args["inputs"] = self._inputs(task_vars)
            result.update(self._execute_module(module_name="gpufleet.fleet.sglang_server_converged",
                                               module_args=args, task_vars=task_vars))  # fmt: skip
            return result

        started = time.monotonic()
        inputs = self._inputs(task_vars)
        result.update(changed=False, inputs=inputs, health={}, report_dir=args.get("report_dir") or "")
        if not args.get("enabled", True):
            result.update(converged=False, reasons=["sglang_server_converged_fast_path is false"], main_pid=0)
            return result
        module_args = {"mode": "check", "record_path": args["record_path"], "inputs": inputs}
        if args.get("nvidia_smi"):
            module_args["nvidia_smi"] = args["nvidia_smi"]
        check = self._execute_module(module_name="gpufleet.fleet.sglang_server_converged",
                                     module_args=module_args, task_vars=task_vars)  # fmt: skip
        if check.get("failed") or check.get("unreachable"):
            result.update(check)
            return result
        reasons = list(check.get("reasons") or [])
        health = check.get("health") or {}
        if check.get("warnings"):
            result["warnings"] = check["warnings"]
        result.update(
            converged=not reasons,
            reasons=reasons,
            health={k: v for k, v in health.items() if k != "changed"},
            unit=check.get("unit", ""),
            node_rank=check.get("node_rank", 0),
            main_pid=check.get("main_pid", 0),
            record_path=args["record_path"],
            seconds=round(time.monotonic() - started, 3),
        )
        return result

    def _inputs(self, task_vars: dict) -> dict:
        """The digests of this host's inputs now (input_digests, with a multi-node server's peers)."""
        root = os.path.dirname(os.path.dirname(task_vars["role_path"]))
        variables = self._inventory_variables(task_vars)
        key = digest_key()
        inventory = getattr(getattr(self._task, "_variable_manager", None), "_inventory", None)
        inputs = input_digests(
            variables,
            self._templar.template,
            code_digest(root),
            str((task_vars.get("ansible_version") or {}).get("full", "")),
            key,
            run_groups(inventory),
        )
        peers = multinode_peers(variables)
        if peers:
            inputs["vars"]["multinode_peers"] = value_digest("multinode_peers", peers, key)
        return inputs

    def _inventory_variables(self, task_vars: dict) -> dict:
        """The host's variables from the inventory and the extra vars only (no role defaults, no play vars: they are
        code; no fact or variable set by this run): the same set in deploy.yml's first play and in any later play
        of any playbook (rollout.yml checks in its decide play, after its plan play's set_facts)."""
        manager = getattr(self._task, "_variable_manager", None)
        inventory = getattr(manager, "_inventory", None)
        host = inventory.get_host(task_vars["inventory_hostname"]) if inventory else None
        if host is None:
            raise AnsibleActionFail("sglang_server_converged: no variable manager on the task (ansible-core changed?)")
        variables = dict(manager.get_vars(host=host, include_hostvars=False))
        for cache in (getattr(manager, "_nonpersistent_fact_cache", {}), getattr(manager, "_vars_cache", {})):
            for name in cache.get(host.name, {}) or {}:
                variables.pop(name, None)
        variables.setdefault("groups", task_vars.get("groups", {}))
        variables.setdefault("hostvars", task_vars.get("hostvars", {}))
        return variables

    def _report(self, result, checks: dict):
        """Write the deploy report of each converged host on the controller (no module on any host): ``checks``
        maps each host to its registered check, whose ``report_dir`` is that host's report folder."""
        reports = {}
        for host, check in sorted(checks.items()):
            check = check or {}
            if not check.get("report_dir"):
                raise AnsibleActionFail(f"sglang_server_converged mode=report: the check of {host} names no report_dir")
            path = Path(check["report_dir"]) / f"{host}.json"
            previous = read_json(path)
            report = renewed_report(previous, host, check, check.get("health") or {}, float(check.get("seconds") or 0),
                                    check.get("record_path", ""))  # fmt: skip
            if not self._task.check_mode:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json(path, report)
            reports[host] = {"report": str(path), "result": report["result"]}
        result.update(changed=False, reports=reports)
        return result
