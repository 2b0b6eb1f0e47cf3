"""Helpers of the sglang_server Molecule verifiers: run the real playbooks against the scenario's lab
host (capturing Ansible's output), read unit properties, the deploy report, and ask the server."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

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


def run_playbook(playbook: str, extra_vars: dict | None = None, verbosity: int = 0, timeout: int = 600):
    """Run a project playbook (path relative to the root) on the scenario's hosts; rc and combined output."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(EPHEMERAL / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CALLBACK_RESULT_FORMAT="yaml",
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=EPHEMERAL, delete=False) as fh:
        json.dump(base_vars(**(extra_vars or {})), fh)
        vars_file = fh.name
    argv = ["ansible-playbook", "-i", str(EPHEMERAL / "inventory"), "-e", f"@{vars_file}", str(ROOT / playbook)]
    if verbosity:
        argv.append("-" + "v" * verbosity)
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    os.unlink(vars_file)
    out = proc.stdout + proc.stderr
    log = EPHEMERAL / f"run-{Path(playbook).stem}-{len(list(EPHEMERAL.glob('run-*.log')))}.log"
    log.write_text(" ".join(shlex.quote(a) for a in argv) + "\n" + out)
    return proc.returncode, out


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


def ask(host, prompt: str, api_key: str | None = None, port: int = 8000) -> str:
    # the lab's engine thinks first (reasoning-parser glm45): room for the thinking and the answer
    body = json.dumps({"model": "glm-5", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1024})
    auth = f"-H 'Authorization: Bearer {api_key}' " if api_key else ""
    out = host.check_output(
        f"curl -sf --max-time 30 {auth}-H 'Content-Type: application/json' "
        f"-d {shlex.quote(body)} http://127.0.0.1:{port}/v1/chat/completions"
    )
    return json.loads(out)["choices"][0]["message"]["content"]


def health(host, port: int = 8000) -> str:
    return host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 30 http://127.0.0.1:{port}/health")
