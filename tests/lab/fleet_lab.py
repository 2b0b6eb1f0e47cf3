"""What the lab tests of a fleet behind the router share (test_rollout, test_quality_gate, test_engine_upgrade): a
playbook runner on the lab's inventory whose output is also kept in the lab's work folder, the extra vars that keep
its reports in that folder, and the module fixture's body: the lab up, the servers prepared and deployed, the router
on, the lab down at the end (GPUFLEET_REUSE_LAB, GPUFLEET_KEEP_LAB: test development only)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import yaml
from conftest import ROOT, lab, lab_json
from lab_host import on

sys.path.insert(0, str(ROOT / "tests/support"))
from gpufleet_testinfra import run_playbook  # noqa: E402


def runner(work: Path, env: dict, timeout: int = 600) -> Callable[..., subprocess.CompletedProcess]:
    """``play(playbook, *args, extra=None, timeout=timeout)`` on ``work``/hosts.yml, its output kept in ``work``."""

    def play(playbook: str, *args: str, extra: dict | None = None, timeout: int = timeout):
        proc = run_playbook(
            playbook, *args, extra_vars=extra, inventory=work / "hosts.yml", log_dir=work, env=env, timeout=timeout
        )
        (work / f"{Path(playbook).stem}-{time.monotonic_ns()}.log").write_text(proc.stdout + proc.stderr)
        return proc

    return play


# The lab's router: its API port and control-plane key (inventory/lab/group_vars; not a secret)
ROUTER_PORT = 30000
KEY = "gpufleet-lab-router-key-not-a-secret"


def canary_lab(name: str) -> tuple:
    """The names of a lab of two servers (a canary and a second) and one gateway: (work folder, servers, canary,
    second, gateway, baselines folder, the playbooks' environment). The work folder is two levels under the project,
    so the lab group_vars' inventory_dir paths resolve."""
    work = ROOT / "tmp" / name
    canary, second = f"{name}-01", f"{name}-02"
    env = {"MOLECULE_EPHEMERAL_DIRECTORY": str(work / "eph"), "GPUFLEET_ROOT": str(ROOT)}
    return work, [canary, second], canary, second, f"{name}-router-01", work / "baselines", env


def report_dirs(work: Path) -> dict:
    """The deploy and rollout reports of the lab's runs in its work folder, not the project's reports/. A user sets
    neither (they land in reports/<fleet>/): these tests keep each lab's files together and start from none; the
    user's path, with no such variable, is tests/lab/test_documented_commands.py's."""
    return {
        "sglang_server_report_dir": str(work / "reports/deploy"),
        "rollout_report_dir": str(work / "reports/rollout"),
    }


def fleet_up(
    name: str,
    work: Path,
    play: Callable[..., subprocess.CompletedProcess],
    deploy_extra: dict,
    servers: int,
    routers: int,
    stale: Iterable[Path] = (),
    equipment: bool = False,
) -> Iterator[dict]:
    """The module fixture's body: ``yield from fleet_up(...)`` yields {host name: instance}. ``stale``: files a
    former run left (removed first); ``equipment``: the lab's CUDA mirror and test hub too (a full pipeline)."""
    if os.environ.get("GPUFLEET_REUSE_LAB") and (work / "hosts.yml").exists():
        yield {h["name"]: h for h in json.loads(lab("--name", name, "instances").stdout)}
        return
    lab("--name", name, "down", check=False)
    work.mkdir(parents=True, exist_ok=True)
    (work / "host_vars").mkdir(exist_ok=True)
    for path in [*(work / "host_vars").glob("*.yml"), *stale]:
        path.unlink()
    # the simulated engine's wheels of a former run (prepare.yml builds them only where the folder is missing): built
    # again from the sources as they are now
    shutil.rmtree(work / "eph" / "dist", ignore_errors=True)
    link = work / "group_vars"
    if not link.is_symlink():
        link.symlink_to(ROOT / "inventory/lab/group_vars")
    subprocess.run(["make", "-s", "router-wheelhouse"], cwd=ROOT, check=True, timeout=300)
    if equipment:
        subprocess.run([sys.executable, "locks/update_locks.py", "wheelhouse"], cwd=ROOT, check=True, timeout=300)
    try:
        size = ("--hosts", str(servers), "--routers", str(routers))
        up = lab_json("--name", name, "up", *size, "--inventory", str(work / "hosts.yml"))
        hosts = {h["name"]: h for h in up["hosts"]}
        if equipment:
            lab("--name", name, "cuda-mirror", "up")
            lab("--name", name, "testhub", "up")
        prep = play("roles/sglang_server/molecule/shared/prepare.yml")
        assert prep.returncode == 0, prep.stdout[-3000:]
        deploy = play("playbooks/deploy_server.yml", extra=deploy_extra)
        assert deploy.returncode == 0, deploy.stdout[-3000:]
        router = play("playbooks/router.yml")
        assert router.returncode == 0, router.stdout[-3000:]
        yield hosts
    finally:
        if not os.environ.get("GPUFLEET_KEEP_LAB"):
            lab("--name", name, "down", check=False)


def canary_rollout_extra(work: Path, **more) -> dict:
    """A rollout of a canary, then the rest (one worker out at a time), with the quality gate's baselines in the lab's
    work folder (work/baselines)."""
    return {
        **report_dirs(work),
        "rollout_quality_gate_baseline_dir": str(work / "baselines"),
        "rollout_serial": [1, "100%"],
        "rollout_max_unavailable": 1,
        **more,
    }


def unit_state(host: dict) -> dict:
    """The server's installed unit (sha256) and its process's start (monotonic): what a restart changes."""
    out = on(host, "sha256sum /etc/systemd/system/sglang-server.service | cut -c1-64; "
                   "systemctl show -p ExecMainStartTimestampMonotonic --value sglang-server")  # fmt: skip
    sha, start = out.split()
    return {"sha": sha, "start": start}


def unit_text(host: dict) -> str:
    return on(host, "cat /etc/systemd/system/sglang-server.service")


def router_workers(address: str) -> list[dict]:
    """The router's worker list (GET /workers with the control-plane key)."""
    conn = http.client.HTTPConnection(address, ROUTER_PORT, timeout=10)
    conn.request("GET", "/workers", headers={"Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200
    return json.loads(resp.read())["workers"]


def healthy_urls(address: str) -> list[str]:
    return sorted(w["url"].rstrip("/") for w in router_workers(address) if w["is_healthy"])


def seen(proc) -> str:
    """What the operator reads, whitespace folded: the YAML result format quotes messages ('' for ')."""
    return " ".join((proc.stdout + proc.stderr).split()).replace("''", "'")


def load_request(index: int, n: int, topic: str, stream: bool, max_tokens: int) -> dict:
    """One chat completion of a client thread's load (thread ``index``, its ``n``th): streamed ones generate
    ``max_tokens`` tokens (ignore_eos), so they are in flight while a worker is drained."""
    return {
        "model": "glm-5",
        "messages": [{"role": "user", "content": f"load {index}-{n}: tell me about {topic}"}],
        "max_tokens": max_tokens,
        "ignore_eos": stream,
        "stream": stream,
        "chat_template_kwargs": {"enable_thinking": False},
    }


@contextlib.contextmanager
def host_environment(work: Path, host: str, environment: dict) -> Iterator[None]:
    """``host``'s sglang_server_environment for the block (its host_vars file, removed after): a fault planted on
    one server for one run."""
    path = work / "host_vars" / f"{host}.yml"
    path.write_text(yaml.safe_dump({"sglang_server_environment": environment}))
    try:
        yield
    finally:
        path.unlink()
