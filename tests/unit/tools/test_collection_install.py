"""The built collection, installed as a user installs it, runs a role and a playbook by FQCN.

`ansible-galaxy collection build` at the root, `ansible-galaxy collection install -p <tmp>` of the artifact,
then, from a folder with no ansible.cfg and with only the installed path as the collections path:
a playbook that runs the role gpufleet.fleet.gpu_facts on localhost against the lab's simulated
nvidia-smi (lab/gpusim), and `ansible-playbook gpufleet.fleet.deploy --syntax-check`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
BIN = REPO / ".venv" / "bin"
SIM = REPO / "lab" / "gpusim" / "nvidia_smi.py"
PROFILES = REPO / "lab" / "gpusim" / "profiles"
pytestmark = pytest.mark.skipif(not (BIN / "ansible-galaxy").exists(), reason="needs the project's venv (make venv)")


def run(argv, cwd, env=None, check=True):
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(artifact, collections path, user folder, environment) of the collection built and installed."""
    tmp = tmp_path_factory.mktemp("collection")
    run([BIN / "ansible-galaxy", "collection", "build", REPO, "--output-path", tmp / "dist"], cwd=tmp)
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    artifact = tmp / "dist" / f"gpufleet-fleet-{galaxy['version']}.tar.gz"
    run(
        [BIN / "ansible-galaxy", "collection", "install", "--offline", "--no-deps", "-p", tmp / "installed", artifact],
        cwd=tmp,
    )
    user = tmp / "user"
    user.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k not in ("PYTHONPATH", "GPUFLEET_ROOT")
    }
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(tmp / "installed"),
        ANSIBLE_CONFIG=str(user / "ansible.cfg"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        HOME=str(user),
    )
    (user / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = false\n")
    return artifact, tmp / "installed", user, env


def test_the_artifact_holds_the_collection_and_nothing_of_the_checkout(installed):
    artifact, path, _user, _env = installed
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
    for needed in ("MANIFEST.json", "LICENSE", "meta/runtime.yml", "playbooks/deploy.yml",
                   "roles/gpu_facts/tasks/main.yml", "plugins/modules/gpu_facts.py",
                   "plugins/module_utils/procfs.py", "plugins/filter/gpu_facts_filters.py"):  # fmt: skip
        assert needed in names, needed
    checkout_only = (".venv", ".cache", "collections", "lab", "tests", ".git", "ansible.cfg", "molecule", "benchmarks")
    assert not [n for n in names if n.split("/")[0] in checkout_only]
    installed_root = path / "ansible_collections" / "gpufleet" / "fleet"
    assert json.loads((installed_root / "MANIFEST.json").read_text())["collection_info"]["name"] == "fleet"
    assert not installed_root.is_symlink()


def test_a_role_runs_from_the_installed_collection_by_its_fqcn(installed):
    _artifact, path, user, env = installed
    smi = user / "nvidia-smi"
    smi.write_text(
        f"#!/bin/sh\nGPUSIM_PROFILE_DIR={PROFILES / 'h200x2-vm'} GPUSIM_STATE_DIR={user / 'gpusim'} "
        f'exec {sys.executable} {SIM} "$@"\n'
    )
    smi.chmod(0o755)
    (user / "site.yml").write_text(
        "- name: GPU facts from the installed collection\n"
        "  hosts: localhost\n"
        "  connection: local\n"
        "  gather_facts: false\n"
        "  roles:\n"
        "    - role: gpufleet.fleet.gpu_facts\n"
        f"      gpu_facts_nvidia_smi: {smi}\n"
        "      gpu_facts_use_nvml: false\n"
        "  tasks:\n"
        "    - name: Show what the role found\n"
        "      ansible.builtin.debug:\n"
        '        msg: "{{ ansible_facts.gpu_facts.gpu_count }} GPUs, {{ gpu_facts_comm.profile }}"\n'
    )
    proc = run([BIN / "ansible-playbook", "-i", "localhost,", "site.yml"], cwd=user, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "TASK [gpufleet.fleet.gpu_facts : Gather GPU facts" in out or "TASK [gpufleet.fleet.gpu_facts :" in out, out
    assert '"msg": "2 GPUs, ' in out, out
    assert "ok=" in out and "failed=0" in out
    # the role's module ran from the installed copy, not from a checkout
    doc = run([BIN / "ansible-doc", "-t", "module", "--json", "gpufleet.fleet.gpu_facts"], cwd=user, env=env)
    assert str(path) in json.loads(doc.stdout)["gpufleet.fleet.gpu_facts"]["doc"]["filename"]


def test_the_deploy_playbook_is_reachable_by_its_fqcn(installed):
    _artifact, path, user, env = installed
    proc = run(
        [BIN / "ansible-playbook", "-i", "localhost,", "gpufleet.fleet.deploy", "--syntax-check"],
        cwd=user, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the playbook ansible-playbook found is the installed collection's
    assert f"playbook: {path}/ansible_collections/gpufleet/fleet/playbooks/deploy.yml" in proc.stdout, proc.stdout
