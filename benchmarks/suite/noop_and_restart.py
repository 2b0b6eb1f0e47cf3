"""No-op server deploy with the project's ansible.cfg vs Ansible's defaults vs Mitogen, and the restart overhead,
measured in the same run on one lab host.

    python benchmarks/suite/noop_and_restart.py [--repeats 2] [--output benchmarks/results/noop_restart.json]

The host gets the simulated engine as its ml-env release (lab/simfleet.py) and is deployed once with
playbooks/deploy_server.yml (gpu_facts + sglang_server: validate, render, compare, smoke). Then, alternating:

* tuned: the project's ansible.cfg (pipelining, ControlPersist, fact cache, profile_tasks, yaml output);
* defaults: an ansible.cfg with only what finding the project needs (inventory, roles_path, collections_path);
* mitogen: the project's ansible.cfg plus Mitogen 0.3.x's strategy `mitogen_linear` (from PyPI, unpacked into
  .cache; Mitogen has no upper ansible-core bound: ansible_mitogen/loaders.py ANSIBLE_VERSION_MIN only);

each a no-op run (nothing restarts: the role proves the running server by a generation). Then
playbooks/restart.yml once: restart overhead = the role's downtime (stop -> proven healthy) minus the engine's
own start (deploy report timings).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab"))
import simfleet  # noqa: E402

LAB = "perf-noop"
HOST = f"{LAB}-01"
MITOGEN = "mitogen==0.3.54"


def mitogen_dir() -> Path:
    target = ROOT / ".cache" / "mitogen-0.3.54"
    if not (target / "ansible_mitogen").is_dir():
        dl = ROOT / ".cache" / "mitogen-dl"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", MITOGEN, "-d", str(dl)], check=True)
        with zipfile.ZipFile(next(dl.glob("mitogen-*.whl"))) as zf:
            zf.extractall(target)
    return target


def playbook(name: str, cfg: Path, inventory: Path, extra_env: dict | None = None) -> tuple[float, str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_FORCE_COLOR="0", **(extra_env or {}))
    started = time.perf_counter()
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory), name],
        capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=900,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{name} with {cfg} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return wall, proc.stdout


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "noop_restart.json"))
    args = parser.parse_args(argv)
    lab_env = dict(os.environ, PYTHONPATH=str(ROOT / "lab"))
    work = Path(tempfile.mkdtemp(prefix="noop-", dir=str(ROOT / ".cache")))
    inventory = work / "hosts.yml"
    reports = work / "reports"
    out: dict = {
        "command": "python benchmarks/suite/noop_and_restart.py " + " ".join(argv or sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()[0]},
        "playbook": "playbooks/deploy_server.yml (gpu_facts + sglang_server), 1 lab host, nothing to restart",
    }
    up = [sys.executable, "-m", "gpufleet_lab", "--name", LAB, "up", "--hosts", "1", "--profile", "h200x2-vm"]
    subprocess.run([*up, "--inventory", str(inventory)], check=True, env=lab_env, capture_output=True)
    try:
        simfleet.install(LAB, HOST, lab_env)
        (work / "group_vars").mkdir()
        # the lab's own choice (inventory/lab group_vars): a keyless listener on the lab bridge, accepted by name
        gv = simfleet.GROUP_VARS | {
            "sglang_server_report_dir": str(reports / "deploy"),
            "sglang_server_allow_unauthenticated": True,
        }
        (work / "group_vars/all.yml").write_text(json.dumps(gv))
        # the project's file, its relative paths made absolute (a config's paths are relative to its own folder)
        tuned_text = (
            (ROOT / "ansible.cfg")
            .read_text()
            .replace(".cache/facts", str(work / "facts"))
            .replace("roles_path = roles", f"roles_path = {ROOT}/roles")
            .replace("collections_path = collections", f"collections_path = {ROOT}/collections")
        )
        tuned = work / "tuned.cfg"
        tuned.write_text(tuned_text.replace("inventory = inventory/lab", f"inventory = {inventory}"))
        plain = work / "defaults.cfg"
        plain.write_text(f"[defaults]\ninventory = {inventory}\nroles_path = {ROOT}/roles\n"
                         f"collections_path = {ROOT}/collections\n")  # fmt: skip
        mitogen = mitogen_dir()
        mit_env = {
            "PYTHONPATH": str(mitogen),
            "ANSIBLE_STRATEGY_PLUGINS": str(mitogen / "ansible_mitogen/plugins/strategy"),
            "ANSIBLE_STRATEGY": "mitogen_linear",
            # Mitogen checks host keys itself (ansible.cfg host_key_checking) and ignores the lab inventory's
            # ansible_ssh_common_args "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null": without this
            # it fails with "Host key checking is enabled, and SSH reported an unrecognized ... host key"
            "ANSIBLE_HOST_KEY_CHECKING": "False",
        }
        first, _ = playbook("playbooks/deploy_server.yml", tuned, inventory)
        out["first_deploy_s"] = round(first, 2)
        samples: dict[str, list[float]] = {"tuned": [], "defaults": [], "mitogen": []}
        errors: dict[str, str] = {}
        for _ in range(args.repeats):
            for name, cfg, extra in (("tuned", tuned, None), ("defaults", plain, None), ("mitogen", tuned, mit_env)):
                try:
                    wall, stdout = playbook("playbooks/deploy_server.yml", cfg, inventory, extra)
                    if "changed=0" not in stdout.split("PLAY RECAP")[-1]:
                        errors[name] = "not a no-op: " + stdout.split("PLAY RECAP")[-1][:300]
                    samples[name].append(round(wall, 2))
                except RuntimeError as err:
                    errors[name] = str(err)[-1500:]
        out["noop_s"] = {k: {"best": min(v) if v else None, "samples": v} for k, v in samples.items()}
        best = {k: v["best"] for k, v in out["noop_s"].items()}
        if best["tuned"] and best["defaults"]:
            out["defaults_over_tuned"] = round(best["defaults"] / best["tuned"], 2)
        if best["tuned"] and best["mitogen"]:
            out["mitogen_over_tuned"] = round(best["mitogen"] / best["tuned"], 2)
        out["errors"] = errors
        wall, _ = playbook("playbooks/restart.yml", tuned, inventory)
        report = json.loads((reports / "deploy" / f"{HOST}.json").read_text())
        t = report["timings"]
        out["restart"] = {
            "playbook_wall_s": round(wall, 2),
            "engine_start_to_ready_s": t.get("deploy_engine_start_to_ready_s"),
            "down_to_healthy_s": t.get("deploy_down_to_healthy_s"),
        }
        if out["restart"]["engine_start_to_ready_s"] and out["restart"]["down_to_healthy_s"]:
            r = out["restart"]
            r["downtime_overhead_s"] = round(r["down_to_healthy_s"] - r["engine_start_to_ready_s"], 2)
            r["downtime_over_engine_start"] = round(r["down_to_healthy_s"] / r["engine_start_to_ready_s"], 2)
    finally:
        subprocess.run([sys.executable, "-m", "gpufleet_lab", "--name", LAB, "down"], env=lab_env, capture_output=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
