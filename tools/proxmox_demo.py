#!/usr/bin/env python3
"""`make proxmox-demo`: the newcomer's path of docs/proxmox.md against a SIMULATED Proxmox VE (lab/pvesim).

Starts pvesim on loopback (HTTPS, a self-signed certificate, a port the kernel picks) with one node that has four
RTX PRO 6000 GPUs (IOMMU on, each in its own group with its audio function on vfio-pci) and a cloud-init template,
exports the environment variables docs/proxmox.md documents (PROXMOX_URL, PROXMOX_USER, PROXMOX_PASSWORD: one set
for the playbook and the inventory plugin), provisions the two GPU VMs of inventory/examples/proxmox/provision.yml
with playbooks/provision.yml, reads the inventory back from the cluster with the Proxmox inventory plugin
(inventory/examples/proxmox/cluster.proxmox.yml), prints what it did, and stops pvesim. Nothing leaves this machine;
the only differences from a real run are the simulator's certificate (validate_certs false) and short timeouts.

    make proxmox-demo            # or: PYTHONPATH=lab .venv/bin/python tools/proxmox_demo.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

from pvesim.hardware import HOST_NUMA, cloud_template, gpu_cards, host_bridge, vfio_bound  # noqa: E402
from pvesim.server import PveSim, PveSimServer  # noqa: E402

PROVISION_INVENTORY = ROOT / "inventory/examples/proxmox/provision.yml"
CLUSTER_INVENTORY = ROOT / "inventory/examples/proxmox/cluster.proxmox.yml"
GPUS = {"0000:81:00": 0, "0000:82:00": 0, "0000:c1:00": 1, "0000:c2:00": 1}  # bus -> host NUMA node


def demo_cluster(password: str) -> dict:
    """One PVE 8.4 node as the provisioning example expects it: pve1 with four GPUs and the template debian12-cloud."""
    pci = [host_bridge(), *gpu_cards(GPUS, 40)]
    return {
        "version": "8.4.1",
        "nodes": {
            "pve1": {
                "pci": pci,
                "drivers": vfio_bound(pci),
                # sysfs on a real node; playbooks/proxmox_node_check.yml reads it
                "numa": HOST_NUMA,
            }
        },
        "storages": {"local-lvm": {"type": "lvmthin", "content": "images,rootdir", "shared": 0}},
        "mappings": [],
        "users": {"root@pam": password},
        "tokens": {},
        "vms": [cloud_template("local-lvm")],
    }


def _env(port: int, password: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        # the old variable is refused by the role; another cluster's token must not mix with the demo's password;
        # requests lets these override validate_certs false (docs/proxmox.md)
        if k not in ("PROXMOX_HOST", "PROXMOX_TOKEN_ID", "PROXMOX_TOKEN_SECRET", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
    }
    env.update(
        PROXMOX_URL=f"https://127.0.0.1:{port}",
        PROXMOX_USER="root@pam",
        PROXMOX_PASSWORD=password,
        ANSIBLE_FORCE_COLOR="0",
    )
    return env


def run_demo(work: Path, say=print) -> dict:
    """Provision the example's two VMs on a fresh pvesim and read the inventory back; returns what a user sees."""
    password = secrets.token_urlsafe(18)
    sim = PveSim(demo_cluster(password))
    with PveSimServer(sim, work) as server:
        env = _env(server.port, password)
        say(f"pvesim, a SIMULATED Proxmox VE 8.4 API (lab/pvesim), on {env['PROXMOX_URL']}")
        say(f"  export PROXMOX_URL={env['PROXMOX_URL']} PROXMOX_USER=root@pam PROXMOX_PASSWORD=(generated, not shown)")
        reports = work / "reports"
        cmd = [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i", str(PROVISION_INVENTORY),
            "playbooks/provision.yml",
            # the simulator's self-signed certificate; tasks end at once there; reports into the demo's folder
            "-e", "proxmox_gpu_vm_validate_certs=false",
            "-e", "proxmox_gpu_vm_task_timeout=30",
            "-e", "proxmox_gpu_vm_agent_timeout=30",
            "-e", f"proxmox_gpu_vm_report_dir={reports}",
        ]  # fmt: skip
        say("$ ansible-playbook -i inventory/examples/proxmox/provision.yml playbooks/provision.yml (+ demo -e)")
        play = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        recap = play.stdout.split("PLAY RECAP")[-1].split("\n\n")[0].strip().splitlines()[1:]
        out = {"provision_rc": play.returncode, "provision_stdout": play.stdout, "provision_stderr": play.stderr}
        out["recap"] = [line.strip() for line in recap if line.strip()]
        out["writes"] = [f"{w['endpoint']} {w['path']}" for w in sim.writes]
        out["vms"] = {
            vmid: {
                "name": vm["config"].get("name"),
                "status": vm["status"],
                "hostpci": [vm["config"][k] for k in sorted(vm["config"]) if k.startswith("hostpci")],
                "tags": vm["config"].get("tags"),
                "numa0": vm["config"].get("numa0"),
                "agent_ip": vm.get("agent_ip"),
            }
            for vmid, vm in sorted(sim.vms.items())
            if vmid != 9000
        }
        out["reports"] = sorted(p.name for p in reports.glob("*.json")) if reports.exists() else []
        (work / "provision.log").write_text(play.stdout + play.stderr)
        if play.returncode != 0:
            lines = play.stdout.splitlines()
            failed = [i for i, line in enumerate(lines) if line.startswith(("fatal:", "failed:", "[ERROR]"))]
            say("\n".join(line for i in failed for line in lines[max(0, i - 2) : i + 14]) or play.stdout[-6000:])
            say(play.stderr[-2000:])
            say(f"provision.yml failed (rc {play.returncode}); its whole output: {work / 'provision.log'}")
            return out
        for line in out["recap"]:
            say("  " + line)
        say(f"Proxmox VE API writes ({len(out['writes'])}):")
        for w in out["writes"]:
            say("  " + w)
        for vmid, vm in out["vms"].items():
            gpus = ", ".join(vm["hostpci"])
            say(f"  VM {vmid} {vm['name']}: {vm['status']}, {gpus}; numa0 {vm['numa0']}; tags {vm['tags']}")
        # the inventory plugin reads the same environment; the example verifies certificates, the simulator's is
        # self-signed: a copy with validate_certs false
        inv = work / "cluster.proxmox.yml"
        example = CLUSTER_INVENTORY.read_text()
        inv.write_text(example.replace("validate_certs: true", "validate_certs: false"))
        base = [str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(inv)]
        say("$ ansible-inventory -i inventory/examples/proxmox/cluster.proxmox.yml --graph (validate_certs false)")
        graph = subprocess.run([*base, "--graph"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        listing = subprocess.run(
            [*base, "--list", "--export"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        out.update(inventory_rc=max(graph.returncode, listing.returncode), graph=graph.stdout)
        out["inventory_stderr"] = graph.stderr + listing.stderr
        if out["inventory_rc"] != 0:
            say(graph.stderr[-4000:] + listing.stderr[-4000:])
            say("ansible-inventory failed")
            return out
        data = json.loads(listing.stdout)
        unsafe = lambda v: v["__ansible_unsafe"] if isinstance(v, dict) else v  # noqa: E731 (values from an API)
        hv = data.get("_meta", {}).get("hostvars", {})
        out["groups"] = {g: sorted(v.get("hosts", [])) for g, v in data.items() if g != "_meta" and v.get("hosts")}
        out["ansible_host"] = {h: unsafe(v.get("ansible_host")) for h, v in sorted(hv.items())}
        say(graph.stdout.rstrip())
        for host, address in out["ansible_host"].items():
            say(f"  {host}: ansible_host {address} (guest agent)")
    say("pvesim stopped. On a real cluster: docs/proxmox.md, 'A newcomer's path'.")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="work folder to keep (certificate, reports); default: a temporary one")
    a = ap.parse_args()
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        out = run_demo(a.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="proxmox-demo-") as tmp:
            out = run_demo(Path(tmp))
    return 0 if out["provision_rc"] == 0 and out.get("inventory_rc") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
