"""The shape of the tree a newcomer meets (one way through the code): the launch spec's flags are merged by the
sglang_server role itself, with one playbook (the benchmark's) calling its `flags` entry point by hand; no
third-party code copied into the tree; a README read in five minutes. (No private ansible-core API under plugins/:
tests/unit/tools/test_ansiballz_cache.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def tracked(*pathspec: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *pathspec], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]


def test_at_most_one_playbook_calls_the_flags_entry_point_by_hand():
    callers = [p.name for p in tracked("playbooks") if p.suffix == ".yml" and "tasks_from: flags\n" in p.read_text()]
    assert len(callers) <= 1, callers


def test_no_vendored_package_in_the_tree():
    vendored = sorted({str(p.parent.relative_to(REPO)) for p in tracked() if "_vendor" in p.parts})
    assert vendored == []


def test_the_readme_is_at_most_12_kb():
    assert (REPO / "README.md").stat().st_size <= 12 * 1024


# Declarative plays (issue 44): a play names its hosts (an inventory group, or an in-memory group an earlier play of
# the run built with add_host or group_by), keeps no scratchpad on localhost, and includes files by their names.
# docs/architecture.md, "Plays and their hosts", names the one play whose hosts are computed and the includes whose
# file names are inputs.
INCLUDES = {"include_tasks", "import_tasks", "include_vars", "include_role", "import_role", "import_playbook"}
# play -> why its hosts: may be computed
COMPUTED_HOSTS = {"playbooks/target_group.yml": "a pattern that is an input of the run, made a group by name"}
# file -> the templated include names it may have (inputs, not results of the run)
TEMPLATED_INCLUDES = {
    # the standard role idiom for OS variables: first_found over the distribution facts
    "roles/cuda_toolkit/tasks/validate.yml": ["{{ lookup('ansible.builtin.first_found', cuda_toolkit_os_vars) }}"],
    # the drain hooks: a tasks file the inventory names (proxmox_gpu_vm_drain_tasks, proxmox_gpu_vm_undrain_tasks)
    "roles/proxmox_gpu_vm/tasks/restart.yml": [
        "{{ proxmox_gpu_vm_drain_tasks }}",
        "{{ proxmox_gpu_vm_undrain_tasks }}",
    ],
}


def yaml_files(*pathspec: str) -> list[Path]:
    return [p for p in tracked(*pathspec) if p.suffix in (".yml", ".yaml")]


def plays(path: Path) -> list[dict]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, list):
        return []
    return [p for p in data if isinstance(p, dict) and "hosts" in p]


def include_names(node) -> list[str]:
    """Every file or role name of an include or import under node."""
    out: list[str] = []
    if isinstance(node, list):
        for item in node:
            out += include_names(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key.rsplit(".", 1)[-1] in INCLUDES:
                name = value.get("file", value.get("name")) if isinstance(value, dict) else value
                out += [str(name)] if name is not None else []
            out += include_names(value)
    return out


def test_no_play_keeps_a_scratchpad_on_localhost():
    # `git grep -c "hostvars\['localhost'\]" -- roles playbooks` is 0
    found = subprocess.run(
        ["git", "grep", "-c", "hostvars\\['localhost'\\]", "--", "roles", "playbooks"], cwd=REPO, capture_output=True
    ).stdout.decode()
    assert found == ""
    spellings = ('hostvars["localhost"]', "hostvars.localhost", "hostvars['127.0.0.1']")
    files = yaml_files("roles", "playbooks")
    assert [str(p.relative_to(REPO)) for p in files if any(s in p.read_text() for s in spellings)] == []


def test_plays_name_their_hosts():
    computed = {
        str(p.relative_to(REPO)): play["hosts"]
        for p in yaml_files()
        if not p.is_relative_to(REPO / "collections")
        for play in plays(p)
        if "{{" in str(play["hosts"])
    }
    assert sorted(computed) == sorted(COMPUTED_HOSTS), computed
    assert len(plays(REPO / "playbooks/target_group.yml")) == 1
    assert "playbooks/target_group.yml" in (REPO / "docs/architecture.md").read_text()


def test_no_include_computes_its_file_name():
    templated = {}
    for p in yaml_files("roles", "playbooks", "deploy.yml"):
        names = [n for n in include_names(yaml.safe_load(p.read_text())) if "{{" in n]
        if names:
            templated[str(p.relative_to(REPO))] = names
    assert templated == TEMPLATED_INCLUDES
