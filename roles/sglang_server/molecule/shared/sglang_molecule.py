"""Helpers of the sglang_server Molecule verifiers: run the real playbooks against the scenario's lab
host (capturing Ansible's output), read unit properties, the deploy report, and ask the server."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import gpufleet_testinfra

ROOT = Path(os.environ.get("GPUFLEET_ROOT", Path(__file__).resolve().parents[4]))
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
REPORTS = EPHEMERAL / "reports"
UNIT = "sglang-server.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
LAB_ENV = {
    "SGLANG_SIM_LOAD_SECONDS": "1",
    "SGLANG_SIM_GRAPH_SECONDS": "1",
    "SGLANG_SIM_ACCESS_LOG": "0",
    "SGLANG_SIM_WARMUP_TRIES": "3",
}
# The seed's NCCL environment and flags (seed-story.md); the lab serves a local model dir.
SEED_NCCL = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_LEVEL": "PHB",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1",
    "NCCL_MIN_NCHANNELS": "8",
}
SEED_ENV = {"OMP_NUM_THREADS": "8", "SAFETENSORS_FAST_GPU": "1", "CUDA_HOME": "/usr/local/cuda-12.8"}


def base_vars(**extra):
    return {"sglang_server_report_dir": str(REPORTS), **extra}


def run_playbook(
    playbook: str, extra_vars: dict | None = None, verbosity: int = 0, timeout: int = 600, limit: str | None = None
):
    """Run a project playbook (path relative to the root) on the scenario's hosts; rc and combined output."""
    args = (["-" + "v" * verbosity] if verbosity else []) + (["--limit", limit] if limit else [])
    proc = gpufleet_testinfra.run_playbook(
        playbook,
        *args,
        extra_vars=base_vars(**(extra_vars or {})),
        inventory=EPHEMERAL / "inventory",  # the directory: the scenario's group_vars link lives there
        config=EPHEMERAL / "ansible.cfg",
        log_dir=EPHEMERAL,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


def props(host, *names):
    names = names or ("MainPID", "ExecMainStartTimestamp", "ActiveState", "NRestarts", "InvocationID")
    out = host.check_output(f"systemctl show {UNIT} --property={','.join(names)}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def report(host_name: str) -> dict:
    return json.loads((REPORTS / f"{host_name}.json").read_text())


def exec_start_argv(host) -> list[str]:
    unit = host.file(UNIT_PATH).content_string
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart=") :])


def ask(host, prompt: str, api_key: str | None = None, port: int = 8000, max_tokens: int = 1024) -> str:
    """One chat completion: the answer (content, or the reasoning when a reasoning parser took it all).

    The lab's engine thinks first under --reasoning-parser: max_tokens leaves room for both."""
    body = json.dumps({"model": "glm-5", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens})
    auth = f"-H 'Authorization: Bearer {api_key}' " if api_key else ""
    out = host.check_output(
        f"curl -sf --max-time 60 {auth}-H 'Content-Type: application/json' "
        f"-d {shlex.quote(body)} http://127.0.0.1:{port}/v1/chat/completions"
    )
    msg = json.loads(out)["choices"][0]["message"]
    return (msg.get("content") or "") + "\n" + (msg.get("reasoning_content") or "")


def health(host, port: int = 8000) -> str:
    return host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 30 http://127.0.0.1:{port}/health")


# Reads /proc on the host: every live process of the unit (by cgroup), with argv and environment.
_UNIT_PROCS = r"""
import json, os, sys
unit = sys.argv[1]
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cg = open(f"/proc/{pid}/cgroup").read()
        if not any(line.rsplit("/", 1)[-1] == unit for line in cg.splitlines()):
            continue
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")[:-1]
        raw = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        env = dict(e.split("=", 1) for e in raw.split("\0") if "=" in e)
    except OSError:
        continue
    found.append({"pid": int(pid), "argv": argv, "env": env})
print(json.dumps(found))
"""


def unit_processes(host) -> list[dict]:
    """Every live process of the server's unit: pid, argv and environment, read from /proc on the host."""
    return json.loads(host.check_output(f"python3 -c {shlex.quote(_UNIT_PROCS)} {UNIT}"))


def serving(host, api_key: str | None = None, port: int = 8000) -> dict:
    """What is serving now: the engine's main process (the unit's process started as `PYTHON -m MODULE`;
    its argv and environment from /proc) and the engine's own /get_server_info (None when it does not answer)."""
    procs = unit_processes(host)
    engines = [p for p in procs if len(p["argv"]) > 2 and p["argv"][1] == "-m" and "launch_server" in p["argv"][2]]
    auth = f"-H 'Authorization: Bearer {api_key}' " if api_key else ""
    info = host.run(f"curl -sf --max-time 30 {auth}http://127.0.0.1:{port}/get_server_info")
    return {
        "engine": engines[0] if len(engines) == 1 else None,
        "engines": engines,
        "processes": procs,
        "server_info": json.loads(info.stdout) if info.rc == 0 else None,
    }


def tp_size(server_info: dict) -> int:
    """tp size from /get_server_info: SGLang 0.5.9 reports the ServerArgs field tp_size; the simulator today
    reports argparse's dest tensor_parallel_size."""
    return int(server_info["tp_size"] if "tp_size" in server_info else server_info["tensor_parallel_size"])


def flag(argv: list[str], name: str) -> str | None:
    """The value after --name in an argv (None when absent)."""
    return argv[argv.index(name) + 1] if name in argv else None
