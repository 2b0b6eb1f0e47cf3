"""Every role finds the project's controller folders (reports/, locks/, .cache/) one way: from its own
role_path (roles/<role> -> the project root), never from playbook_dir, which names a different folder for
deploy.yml at the root, a playbook under playbooks/ and a Molecule scenario."""

from __future__ import annotations

import os
import re
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
FOLDER_VARIABLE = re.compile(r"_(report_dir|reports_dir|locks_dir|lock_dir|project_dir|cache_dir|wheelhouse)$")
# a folder on the controller (host folders such as /var/cache/sglang-server are not this test's)
CONTROLLER_WORDS = ("role_path", "playbook_dir", "inventory_dir", "_project_dir", "_locks_dir")
# where each role's folder lands in the project (the role's defaults, resolved as Ansible would)
EXPECTED = {
    "fleet_router_project_dir": ".",
    "fleet_router_wheelhouse": ".cache/smg/wheelhouse",
    "fleet_rulebook_project_dir": ".",
    "fleet_rulebook_wheelhouse": ".cache/rulebook/wheelhouse",
    "fleet_remediation_report_dir": "reports/remediation",
    "gpu_facts_report_dir": "reports/gpu_facts",
    "ml_env_locks_dir": "locks",
    "ml_env_lock_dir": "locks/sglang-cu128",
    "proxmox_gpu_vm_report_dir": "reports/proxmox",
    "rollout_report_dir": "reports/rollout",
    "rollout_project_dir": ".",
    "serving_bench_project_dir": ".",
    "serving_bench_cache_dir": ".cache/bench-client",
    "serving_bench_reports_dir": "reports",
    "sglang_server_report_dir": "reports/deploy",
}


def resolve(role: str, name: str, defaults: dict, playbook_dir: str) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["dirname"] = os.path.dirname
    context = {"role_path": str(ROOT / "roles" / role), "playbook_dir": playbook_dir}
    value = defaults[name]
    for _ in range(5):  # defaults that name other defaults
        if not isinstance(value, str) or "{{" not in value:
            break
        value = env.from_string(value).render({**defaults, **context})
    return os.path.normpath(value)


def folder_defaults():
    for path in sorted((ROOT / "roles").glob("*/defaults/main.yml")):
        role = path.parts[-3]
        defaults = yaml.safe_load(path.read_text()) or {}
        for name in defaults:
            value = defaults[name]
            controller = isinstance(value, str) and any(w in value for w in CONTROLLER_WORDS)
            if FOLDER_VARIABLE.search(name) and controller:
                yield pytest.param(role, name, defaults, id=name)


@pytest.mark.parametrize(("role", "name", "defaults"), list(folder_defaults()))
def test_a_role_folder_is_the_projects_whatever_the_playbook(role, name, defaults):
    assert name in EXPECTED, f"{name}: a new controller folder; add where it must land to EXPECTED"
    expected = os.path.normpath(ROOT / EXPECTED[name])
    for playbook_dir in (str(ROOT), str(ROOT / "playbooks"), str(ROOT / "roles" / role / "molecule" / "default")):
        assert resolve(role, name, defaults, playbook_dir) == expected, (name, playbook_dir, defaults[name])


def test_every_expected_folder_is_still_a_role_default():
    found = {name for _role, name, _defaults in (p.values for p in folder_defaults())}
    assert found == set(EXPECTED)
