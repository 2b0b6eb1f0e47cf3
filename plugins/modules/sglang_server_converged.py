#!/usr/bin/python
"""Ansible module: the record of a converged deploy on a server host, and the check of a no-op deploy against it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_converged
short_description: Record a converged deploy on the host, or check a no-op deploy against that record
description:
  - >-
    I(mode=record) (the last task of a deploy.yml run that went through every stage and left the server healthy,
    result C(ok) or C(unchanged)) writes a JSON record (root, 0600): the digests of the run's inputs (I(inputs),
    computed on the controller by the action plugin of the same name), the unit's closure, the GPUs and the
    arguments of the health check by generation.
  - >-
    The unit's closure is read from systemd, not from role variables, so any playbook that changes the server
    (deploy_server.yml, restart.yml, rollback.yml) or a hand edit is seen: the unit file and its drop-ins, its
    EnvironmentFiles (sha256), every absolute path in ExecStartPre and ExecStart (a file's sha256, or size and
    mtime above 4 MiB; a directory's tree of names, sizes and mtimes, as the model directory; each with the real
    path of its parent, so C(/opt/ml-env/current/bin/python) names its release) and every absolute path in the
    unit's Environment (real path and type only: caches change while the server runs). Paths under /run, /tmp,
    /proc, /dev and /var/cache are not read (the engine writes them).
  - >-
    I(mode=check) (the first play of deploy.yml) compares the record with I(inputs) and with the host now: the
    closure, the unit active and running, the GPUs (index, UUID, driver version from nvidia-smi). It returns
    C(converged) and one reason per difference; it never fails for a difference and never changes the host.
    A converged rank 0 is then proven by a generation in the same module run (the checks of sglang_server_smoke,
    module_utils/sglang_server_smoke.py, with the recorded arguments and the running start's InvocationID);
    I(mode=report) of the action writes its deploy report on the controller.
  - >-
    What the check does not read again (a full run does): packages and their holds, the ml-env release's files
    (a release is immutable and named by its lock), the content of model files (their names, sizes and mtimes are
    read), foreign GPU processes. C(sglang_server_converged_fast_path=false) sends every host through every stage.
options:
  mode:
    description: >-
      C(check) or C(record) (on the host); C(report) runs nothing on the host: the action plugin writes the deploy
      reports of the converged hosts on the controller from I(checks), all of them in one task run.
    type: str
    choices: [check, record, report]
    required: true
  enabled:
    description: "(check, action plugin) false: no check, the host goes through every stage."
    type: bool
    default: true
  report_dir:
    description: >-
      (check, action plugin) Controller directory of the host's deploy report (<dir>/<host>.json); the check's
      result carries it for I(mode=report).
    type: path
  checks:
    description: >-
      (report, action plugin) Host name -> the registered result of I(mode=check) of each converged host (with its
      C(report_dir)).
    type: dict
  record_path:
    description: "Where the record is on the host (check, record)."
    type: path
  inputs:
    description: >-
      Digests of the run's inputs, C({code, ansible, vars: {name: digest}}), computed by the action plugin in both
      modes (record: at the end of the run, with the facts its stages gathered).
    type: dict
  unit:
    description: "The server's systemd unit (record; the check takes it from the record)."
    type: str
    default: ""
  node_rank:
    description: "The host's node rank (record): only rank 0 serves HTTP, so only rank 0 is proven by a generation."
    type: int
    default: 0
  smoke:
    description: "The arguments of sglang_server_smoke for this server (record; no secret: the host reads the key)."
    type: dict
    default: {}
  nvidia_smi:
    description: "nvidia-smi command."
    type: str
    default: nvidia-smi
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Record the converged state
  gpufleet.fleet.sglang_server_converged:
    mode: record
    record_path: /var/lib/gpufleet/sglang-server/converged.json
    unit: sglang-server.service
    smoke:
      base_url: http://127.0.0.1:8000
      served_name: glm-5
      secrets_file: /etc/sglang-server/secrets.env
      prompts: [{prompt: "What is the capital of France?", expect: "(?i)paris", max_tokens: 64}]
"""

RETURN = r"""
converged:
  description: "(check) The host is as the record says and its inputs are the recorded ones."
  returned: always
  type: bool
reasons:
  description: "(check) One line per difference (empty when converged)."
  returned: always
  type: list
health:
  description: >-
    (check) The result of the health check by generation (sglang_server_smoke's return values) when everything else
    matched the record on rank 0; empty otherwise.
  returned: always
  type: dict
smoke:
  description: "(check) The recorded arguments of the health check by generation (empty on rank > 0)."
  returned: always
  type: dict
unit:
  description: "The server's unit."
  returned: always
  type: str
invocation_id:
  description: "(check) InvocationID of the unit's running start."
  returned: always
  type: str
main_pid:
  description: "MainPID of the unit now (0: none)."
  returned: always
  type: int
node_rank:
  description: "The recorded node rank."
  returned: always
  type: int
report_dir:
  description: "(check, action plugin) The I(report_dir) it was given, for I(mode=report)."
  returned: always
  type: str
reports:
  description: "(report, action plugin) Host name -> C({report: <path>, result: <the renewed report's result>})."
  returned: when I(mode=report)
  type: dict
"""


import hashlib
import json
import os
import re
import shlex
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_files import hash_file, read_json
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_files import write_root_file
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_smoke import prove
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import show_properties

SCHEMA = "gpufleet.sglang_server.converged/v1"
HASH_MAX_BYTES = 4 * 1024 * 1024
TREE_MAX_ENTRIES = 20000
VOLATILE_ROOTS = ("/run/", "/tmp/", "/proc/", "/dev/", "/var/cache/")
UNIT_PROPS = (
    "LoadState",
    "ActiveState",
    "SubState",
    "InvocationID",
    "MainPID",
    "FragmentPath",
    "DropInPaths",
    "EnvironmentFiles",
    "Environment",
    "ExecStartPre",
    "ExecStart",
)
ARGV_RX = re.compile(r"argv\[\]=(.*?) ; ignore_errors=")


def tree_digest(root):
    """Digest of a directory tree's names, sizes and mtimes (not contents), and its entry count."""
    digest, count = hashlib.sha256(), 0
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            digest.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            count += 1
            if count >= TREE_MAX_ENTRIES:
                return digest.hexdigest(), count
    return digest.hexdigest(), count


def path_state(path, content=True):
    """What a path of the unit is: missing, or its type, real path, real parent and (content) digest."""
    if not os.path.lexists(path):
        return {"type": "missing"}
    state = {"real": os.path.realpath(path), "parent": os.path.realpath(os.path.dirname(path))}
    if os.path.isdir(path):
        state["type"] = "dir"
        if content:
            state["tree"], state["entries"] = tree_digest(path)
    else:
        state["type"] = "file"
        if content:
            try:
                st = os.stat(path)
                big = st.st_size > HASH_MAX_BYTES
                state["sha256"] = f"size {st.st_size} mtime {st.st_mtime_ns}" if big else hash_file(Path(path))[0]
            except OSError as exc:
                state["sha256"] = f"unreadable: {exc.strerror}"
    return state


def exec_paths(value):
    """Absolute paths named by an ExecStart/ExecStartPre value of `systemctl show` (argv, and --flag=/path)."""
    paths = []
    for argv in ARGV_RX.findall(value or ""):
        for token in argv.split():
            candidate = token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
            if candidate.startswith("/"):
                paths.append(candidate)
    return paths


def environment_paths(value):
    """Absolute paths among the values of a unit's Environment= (systemctl show quotes values with spaces)."""
    try:
        words = shlex.split(value or "")
    except ValueError:
        words = (value or "").split()
    return [w.split("=", 1)[1] for w in words if "=" in w and w.split("=", 1)[1].startswith("/")]


def volatile(path):
    return path.startswith(VOLATILE_ROOTS)


def unit_closure(props):
    """{path: state} of everything the unit runs with, from its `systemctl show` properties."""
    closure = {}
    for key in ("FragmentPath", "DropInPaths"):
        for path in (props.get(key) or "").split():
            closure[path] = path_state(path)
    for line in (props.get("EnvironmentFiles") or "").splitlines():
        path = line.rsplit(" (ignore_errors=", 1)[0].strip()
        if path.startswith("/"):
            closure[path] = path_state(path)
    for key in ("ExecStartPre", "ExecStart"):
        for path in exec_paths(props.get(key)):
            if not volatile(path):
                closure[path] = path_state(path)
    for path in environment_paths(props.get("Environment")):
        if not volatile(path) and path not in closure:
            closure[path] = path_state(path, content=False)
    return closure


def gpu_list(nvidia_smi, runner=run):
    """[[index, uuid, driver]] from nvidia-smi, or None when it does not answer."""
    rc, out, _err = runner(
        [nvidia_smi, "--query-gpu=index,uuid,driver_version", "--format=csv,noheader"], timeout=30
    )  # fmt: skip
    if rc != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def read_unit(unit, runner=run):
    rc, out, _err = runner(["systemctl", "show", unit, "--property=" + ",".join(UNIT_PROPS)])
    return show_properties(out) if rc == 0 else {}


def input_differences(recorded, inputs):
    """Lines naming what changed between the recorded inputs and this run's."""
    lines = []
    if recorded.get("digest") != inputs.get("digest"):
        # keyed by another controller's key, or made before keyed digests: no digest can be compared
        return ["the record's input digests were made with another key (another controller, or a gpufleet before "
                "keyed digests): every input counts as changed"]  # fmt: skip
    if recorded.get("code") != inputs.get("code"):
        lines.append("gpufleet's code changed (roles, playbooks, plugins, templates or locks)")
    if recorded.get("ansible") != inputs.get("ansible"):
        lines.append(f"ansible-core changed ({recorded.get('ansible')} -> {inputs.get('ansible')})")
    before, now = recorded.get("vars") or {}, inputs.get("vars") or {}
    changed = sorted(k for k in set(before) & set(now) if before[k] != now[k])
    added, removed = sorted(set(now) - set(before)), sorted(set(before) - set(now))
    for label, names in (("changed", changed), ("set", added), ("no longer set", removed)):
        if names:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            lines.append(f"variables {label} since the last converged deploy: {shown}")
    return lines


def closure_differences(recorded, now):
    lines = []
    for path in sorted(set(recorded) | set(now)):
        if path not in now:
            lines.append(f"the unit no longer uses {path}")
        elif path not in recorded:
            lines.append(f"the unit now uses {path}")
        elif recorded[path] != now[path]:
            was, is_ = recorded[path], now[path]
            what = "is missing" if is_.get("type") == "missing" else "changed"
            if was.get("real") and is_.get("real") and was["real"] != is_["real"]:
                what = f"now resolves to {is_['real']} (was {was['real']})"
            elif was.get("parent") and is_.get("parent") and was["parent"] != is_["parent"]:
                what = f"now lies in {is_['parent']} (was {was['parent']})"
            lines.append(f"{path} {what}")
    return lines


def check(record, inputs, props, closure, gpus):
    """The reasons the host is not the recorded converged state (none: converged)."""
    if not record:
        return ["no record of a converged deploy (first deploy.yml, or the last one did not end healthy)"]
    if record.get("schema") != SCHEMA:
        return [f"the record is of another schema ({record.get('schema')})"]
    reasons = input_differences(record.get("inputs") or {}, inputs)
    unit = record.get("unit", "")
    if props.get("LoadState") != "loaded":
        reasons.append(f"{unit} is not loaded ({props.get('LoadState') or 'systemctl show failed'})")
    elif (props.get("ActiveState"), props.get("SubState")) != ("active", "running"):
        reasons.append(f"{unit} is {props.get('ActiveState')}/{props.get('SubState')}, not active/running")
    reasons += closure_differences(record.get("closure") or {}, closure)
    if gpus is None:
        reasons.append("nvidia-smi did not answer")
    elif gpus != record.get("gpus"):
        reasons.append(f"the GPUs differ from the record: {gpus} (recorded {record.get('gpus')})")
    return reasons


def write_atomically(path, text):
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    write_root_file(path, text.encode("utf-8"), 0o600)


def main():
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["check", "record"], "required": True},
            "record_path": {"type": "path", "required": True},
            "inputs": {"type": "dict", "required": True},
            "unit": {"type": "str", "default": ""},
            "node_rank": {"type": "int", "default": 0},
            "smoke": {"type": "dict", "default": {}},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
        },
        supports_check_mode=True,
    )
    p = module.params
    record = read_json(Path(p["record_path"]))
    unit = p["unit"] if p["mode"] == "record" else record.get("unit", "")
    props = read_unit(unit) if unit else {}
    closure = unit_closure(props) if props else {}
    gpus = gpu_list(p["nvidia_smi"])
    result = {"unit": unit, "invocation_id": props.get("InvocationID", ""), "main_pid": int(props.get("MainPID") or 0)}

    if p["mode"] == "check":
        reasons = check(record, p["inputs"], props, closure, gpus)
        health = {}
        if not reasons and record.get("smoke"):
            # the health check by generation in the same run (sglang_server_smoke's checks): one module per host
            smoke = dict(record["smoke"], unit=unit, invocation_id=result["invocation_id"])
            health = prove(smoke, module.no_log_values)
            for remark in health["remarks"]:
                module.warn(remark)
            if health["failures"]:
                reasons.append("the health check by generation failed: " + " | ".join(health["failures"]))
        module.exit_json(
            changed=False,
            converged=not reasons,
            reasons=reasons,
            health=health,
            smoke=record.get("smoke") or {},
            node_rank=int(record.get("node_rank", 0)),
            **result,
        )

    if props.get("LoadState") != "loaded" or gpus is None:
        module.fail_json(msg=f"cannot record a converged state: {unit} is not loaded or nvidia-smi did not answer")
    new = {
        "schema": SCHEMA,
        "inputs": p["inputs"],
        "unit": unit,
        "node_rank": p["node_rank"],
        "closure": closure,
        "gpus": gpus,
        "smoke": p["smoke"] if p["node_rank"] == 0 else {},
    }
    changed = record != new
    if changed and not module.check_mode:
        write_atomically(p["record_path"], json.dumps(new, indent=1, sort_keys=True) + "\n")
    module.exit_json(
        changed=changed, converged=True, reasons=[], smoke=new["smoke"], node_rank=p["node_rank"], **result
    )


if __name__ == "__main__":
    main()
