"""nnodes has one source, the inventory's multi-node group: sglang_server's flags get it (the multi-node layer,
read once into sglang_server_parallel) and gpu_facts gets it (gpu_facts_nnodes), both from playbooks/vars/fleet.yml.

A two-node server is two inventory hosts in a group named by sglang_server_multinode_group (docs/multinode.md);
playbooks/vars/fleet.yml derives the layer sglang_server_args_multinode (nnodes 2, node-rank, dist-init-addr)
and the sglang_server role's `flags` entry point merges it with tp-size 16 of the GPU-class layer.
playbooks/preflight.yml runs for real (connection local, the lab's simulated nvidia-smi with the 8-GPU RTX PRO
6000 profile), then sglang_server's launch spec check (tasks/launch_spec.yml), then every reader is asked what it
saw: the layout (sglang_server_parallel), the derivation (gpu_comm_settings' inputs and its NCCL environment:
multi-node keeps InfiniBand on, gpu_facts_nnodes from the multi-node group), the launch spec's parallelism check
(tp 16 over 2 nodes fits 8 GPUs per node), and what the unit gets (the rendered argv and the server's GPUs). Once
gpu_facts read nnodes from `sglang_server_nnodes`, defined nowhere: the derivation got NCCL_IB_DISABLE=1 and the
preflight refused "over 1 node(s)".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import yaml
from gpu_facts_helpers import PROFILES, REPO, SIM

READERS = """
- ansible.builtin.import_playbook: {repo}/playbooks/preflight.yml

- name: The launch spec again, as sglang_server's validation runs it later in deploy.yml (playbooks/validate.yml)
  hosts: sglang_servers
  gather_facts: false
  vars_files: ["{repo}/playbooks/vars/fleet.yml"]
  tasks:
    - ansible.builtin.import_role: {{name: sglang_server, tasks_from: launch_spec.yml}}

- name: Ask every reader
  hosts: sglang_servers
  gather_facts: false
  tasks:
    - ansible.builtin.debug:
        msg:
          parallel: "{{{{ sglang_server_parallel }}}}"
          derivation_nnodes: "{{{{ gpu_facts_comm.inputs.nnodes }}}}"
          nccl_env: "{{{{ gpu_facts_comm.nccl_env }}}}"
          launch: "{{{{ sglang_server_launch_problems.summary }}}}"
          argv: "{{{{ sglang_server_flags | gpufleet.fleet.sglang_argv }}}}"
          gpus: >-
            {{{{ sglang_server_inventory_flags
                | gpufleet.fleet.sglang_gpu_indices(ansible_facts.gpu_facts.gpu_count) }}}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_readers(tmp_path, extra=None, host_flags=None, nodes=("node-a",)):
    """Run preflight.yml and the readers on ``nodes`` (two or more: one multi-node server, rank 0 first)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f"#!/bin/sh\nGPUSIM_PROFILE_DIR={PROFILES / 'rtx-pro-6000x8-vm'} GPUSIM_STATE_DIR={tmp_path / 'state'} "
        f'exec {sys.executable} {SIM} "$@"\n'
    )
    smi.chmod(0o755)
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "sglang_server_node_address": "127.0.0.1"}  # fmt: skip
    servers = {"children": {"rtx_pro_6000": {"hosts": {n: local for n in nodes}}}}
    if len(nodes) > 1:
        servers["children"]["pair"] = {"hosts": {n: {} for n in nodes}}
        (inv / "group_vars" / "pair.yml").write_text(
            yaml.safe_dump({"sglang_server_multinode_group": "pair", "sglang_server_dist_init_port": free_port()})
        )
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"sglang_servers": servers}}}))
    (inv / "group_vars" / "rtx_pro_6000.yml").write_text(
        yaml.safe_dump({"sglang_server_args_gpu_class": {"tp-size": 16}})
    )
    for node in nodes:
        (inv / "host_vars" / f"{node}.yml").write_text(yaml.safe_dump({"sglang_server_args_host": host_flags or {}}))
    (tmp_path / "readers.yml").write_text(READERS.format(repo=REPO))
    extra = {"gpu_facts_nvidia_smi": str(smi), "gpu_facts_use_nvml": False, "gpu_facts_disk_requirements": [],
             **(extra or {})}  # fmt: skip
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_NOCOLOR="1")  # fmt: skip
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inv), str(tmp_path / "readers.yml"),
         "-e", json.dumps(extra)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    doc, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("\n{") + 1 :])
    return proc.returncode, doc


def last_msg(doc, host="node-a"):
    return doc["plays"][-1]["tasks"][-1]["hosts"][host]["msg"]


def task_msg(doc, name, host="node-a"):
    """The msg of the first task called ``name`` on ``host``."""
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].split(" : ")[-1] == name and host in task["hosts"]:
                return task["hosts"][host].get("msg")
    raise AssertionError(f"no task {name!r} ran on {host}")


def failures(doc):
    return [r.get("msg", "") for p in doc["plays"] for t in p["tasks"] for r in t["hosts"].values() if r.get("failed")]


def test_nnodes_of_the_multinode_layer_reaches_every_reader(tmp_path):
    rc, doc = run_readers(tmp_path, nodes=("node-a", "node-b"))
    assert rc == 0, failures(doc)
    for rank, node in enumerate(("node-a", "node-b")):
        seen = last_msg(doc, node)
        assert seen["parallel"]["nnodes"] == 2 and seen["parallel"]["tp"] == 16 and seen["parallel"]["per_node"] == 8
        assert seen["derivation_nnodes"] == 2
        assert "NCCL_IB_DISABLE" not in seen["nccl_env"]  # the one-node branch would set it to "1"
        assert seen["launch"]["nnodes"] == 2 and seen["launch"]["gpus_needed_per_node"] == 8
        argv = seen["argv"]
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--tp-size") + 1] == "16"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert seen["gpus"] == list(range(8))


def test_nnodes_written_by_hand_is_refused_by_the_multinode_rule(tmp_path):
    # `-e '{"sglang_server_args_host":{"tp-size":16,"nnodes":2}}'` was refused "over 1 node(s)"
    # by gpu_facts (nnodes read from elsewhere). The node count has one source, the inventory's multi-node group:
    # gpu_facts derives for the one node the inventory has (gpu_facts_nnodes, playbooks/vars/fleet.yml), its
    # preflight passes, and the refusal is the multi-node rule's, naming the variable to set instead.
    rc, doc = run_readers(tmp_path, {"sglang_server_args_host": {"tp-size": 16, "nnodes": 2}})
    assert rc != 0
    assert task_msg(doc, "Show the derived communication settings")["nccl_env"]["NCCL_IB_DISABLE"] == "1"
    assert "preflight OK on node-a" in task_msg(doc, "Refuse the host when a preflight check fails")
    (msg,) = failures(doc)
    assert "over 1 node(s)" not in msg
    assert "nnodes=2 in the flags but the server has 1 node(s)" in msg and "sglang_server_multinode_group" in msg


def test_the_same_layout_on_one_node_is_refused_naming_the_flags(tmp_path):
    rc, doc = run_readers(tmp_path)
    assert rc != 0
    (msg,) = [m for m in failures(doc) if "LAUNCH SPEC REFUSED on node-a" in m]
    assert "tp x pp = 16 over 1 node(s) needs 16 GPUs per node but node-a has 8" in msg
    assert "variable: sglang_server_args_*: tp-size=16, pp-size=1, nnodes=1" in msg


def test_the_driver_floors_are_passed_in_not_read_from_the_cuda_toolkit_role(tmp_path):
    # gpu_facts owns no copy of cuda_toolkit's table: without gpu_facts_driver_floors its preflight refuses
    rc, doc = run_readers(tmp_path, {"gpu_facts_driver_floors": {}}, {"tp-size": 8})
    assert rc != 0
    (msg,) = failures(doc)
    assert "gpu_facts_driver_floors is empty" in msg and "roles/cuda_toolkit/vars/driver_floors.yml" in msg


MERGE = "Merge the flag layers and read the parallel layout (tp, pp, dp, nnodes)"


def test_the_flags_are_merged_once_per_host_per_run(tmp_path):
    """The preflight merges the flag layers; the validation's launch spec check later in the same run keeps them
    (the same layers): the merge task runs once per host, the second call is skipped."""
    rc, doc = run_readers(tmp_path, host_flags={"tp-size": 8})
    assert rc == 0, failures(doc)
    calls = [t["hosts"]["node-a"] for p in doc["plays"] for t in p["tasks"]
             if t["task"]["name"].split(" : ")[-1] == MERGE and "node-a" in t["hosts"]]  # fmt: skip
    assert len(calls) == 2  # playbooks/preflight.yml's, then the validation's
    assert [bool(c.get("skipped")) for c in calls] == [False, True]
