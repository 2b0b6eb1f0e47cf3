"""execution-environment.yml: `ansible-builder create` (tools/execution_environment.py, run by `make lint`) writes a
build context that names the collection's Python packages and collections, and the collection declares every other
collection its shipped code calls."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

import execution_environment as ee  # noqa: E402

# What galaxy.yml's build_ignore leaves out of the artifact among roles/: the Molecule scenarios (checkout only).
SHIPPED = [
    p
    for d in ("roles", "playbooks", "plugins")
    for p in sorted((REPO / d).rglob("*"))
    if p.is_file() and "molecule" not in p.relative_to(REPO).parts and p.suffix in (".yml", ".yaml", ".j2", ".py")
]


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    context = tmp_path_factory.mktemp("ee") / "context"
    ee.create(REPO, context)
    return context


def test_the_context_names_the_python_packages_and_collections(context):
    assert ee.problems(REPO, context) == []
    packages = ee.requirement_lines((context / "_build" / "requirements.txt").read_text())
    # community.proxmox's API client, which the proxmox_gpu_vm_* modules use on the controller
    assert {"proxmoxer", "requests"} <= set(packages)
    listed = yaml.safe_load((context / "_build" / "requirements.yml").read_text())["collections"]
    assert {c["name"] for c in listed} >= {"community.proxmox", "community.general", "ansible.posix"}


def test_what_the_context_lacks_is_named(context, tmp_path):
    broken = tmp_path / "context"
    (broken / "_build").mkdir(parents=True)
    requirements = (context / "_build" / "requirements.txt").read_text()
    (broken / "_build" / "requirements.txt").write_text(re.sub(r"(?m)^proxmoxer.*$", "", requirements))
    listed = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    listed["collections"] = [c for c in listed["collections"] if c["name"] != "community.proxmox"]
    (broken / "_build" / "requirements.yml").write_text(yaml.safe_dump(listed))
    (broken / "Containerfile").write_text("FROM scratch\n")
    found = ee.problems(REPO, broken)
    assert any("proxmoxer" in p for p in found), found
    assert any("community.proxmox" in p for p in found), found
    assert any("ansible-core" in p for p in found), found


def test_every_collection_the_shipped_code_calls_is_a_dependency():
    """A role or plugin that calls another collection's module or filter needs it at install time: galaxy.yml."""
    others = {c["name"] for c in yaml.safe_load((REPO / "requirements.yml").read_text())["collections"]}
    declared = set(yaml.safe_load((REPO / "galaxy.yml").read_text()).get("dependencies") or {})
    pattern = re.compile(r"\b(" + "|".join(re.escape(name) for name in sorted(others)) + r")\.[a-z_]+")
    used = {}
    for path in SHIPPED:
        for match in pattern.finditer(path.read_text(encoding="utf-8", errors="replace")):
            used.setdefault(match.group(1), str(path.relative_to(REPO)))
    missing = {name: where for name, where in used.items() if name not in declared}
    assert "community.proxmox" in used and not missing, f"not in galaxy.yml's dependencies: {missing}"
