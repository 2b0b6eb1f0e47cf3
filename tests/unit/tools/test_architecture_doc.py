"""docs/architecture.md against the tree: every stage playbooks/deploy.yml imports (following import_playbook
chains) and every role those plays run is in the page's stage table, every plugin of plugins/ is named in its
"## Plugins" section, and that section is what tools/architecture_doc.py renders."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "architecture.md"
sys.path.insert(0, str(REPO / "tools"))

import architecture_doc  # noqa: E402

IMPORT_PLAYBOOK = ("ansible.builtin.import_playbook", "import_playbook")
ROLE_TASKS = ("ansible.builtin.import_role", "ansible.builtin.include_role", "import_role", "include_role")


def section(title: str) -> str:
    """The page's text from the heading `## <title>` to the next `## ` heading."""
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def _roles(play: dict) -> list[str]:
    found = [r if isinstance(r, str) else r.get("role") or r.get("name") for r in play.get("roles") or []]

    def walk(tasks):
        for task in tasks or []:
            found.extend(task[key]["name"] for key in ROLE_TASKS if key in task)
            for nested in ("block", "rescue", "always"):
                walk(task.get(nested))

    for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
        walk(play.get(key))
    return [name.rsplit(".", 1)[-1] for name in found]  # gpufleet.fleet.<role> -> <role>


def stages(playbook: str = "deploy.yml") -> list[tuple[str, list[str]]]:
    """(playbooks/<file>, the roles its plays run) of each playbook deploy.yml imports, depth first."""
    out = []
    for entry in yaml.safe_load((REPO / "playbooks" / playbook).read_text()):
        imported = next((entry[key] for key in IMPORT_PLAYBOOK if key in entry), None)
        if imported:
            roles = [r for play in yaml.safe_load((REPO / "playbooks" / imported).read_text()) for r in _roles(play)]
            out.append((f"playbooks/{imported}", sorted(set(roles))))
            out.extend(stages(imported))
    return out


def plugin_names() -> list[str]:
    """What the page must name of plugins/: every file's stem (a filter's .yml is named after the filter), data files
    by their path in their folder."""
    names = []
    for path in sorted((REPO / "plugins").rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix in (".py", ".yml", ".yaml"):
            names.append(path.stem)
        else:
            names.append("/".join(path.relative_to(REPO / "plugins").parts[1:]))  # <kind>/<this part>
    return names


def test_the_stages_are_read_from_deploy_yml():
    found = dict(stages())
    # the chain as deploy.yml imports it, validate.yml's own import of the monitor's validation included
    assert {"playbooks/servers_present.yml", "playbooks/monitoring_validate.yml", "playbooks/router.yml"} <= set(found)
    monitoring = ["fleet_firewall", "fleet_monitor", "fleet_rulebook", "node_exporter"]
    assert found["playbooks/monitoring_apply.yml"] == monitoring
    assert found["playbooks/deploy_server.yml"] == ["gpu_facts", "sglang_server"]


def test_every_stage_and_its_roles_are_in_the_stage_table():
    table = section("The stages of `deploy.yml`")
    missing = [playbook for playbook, _roles in stages() if f"`{playbook}`" not in table]
    missing += sorted({f"role {role}" for _pb, roles in stages() for role in roles if f"`{role}`" not in table})
    assert not missing, f"docs/architecture.md, 'The stages of `deploy.yml`', lacks: {', '.join(missing)}"


def test_every_plugin_is_named():
    plugins = section("Plugins")
    missing = [name for name in plugin_names() if not re.search(rf"`{re.escape(name)}(\.py)?`", plugins)]
    assert plugin_names() and not missing, f"docs/architecture.md, 'Plugins', lacks: {', '.join(missing)}"


def test_the_plugins_section_is_the_rendered_one():
    text = DOC.read_text()
    assert architecture_doc.replace_section(text, architecture_doc.render()) == text, (
        "the plugins section of docs/architecture.md is out of date: run python tools/architecture_doc.py"
    )
