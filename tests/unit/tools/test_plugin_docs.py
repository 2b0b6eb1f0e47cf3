"""Every module and plugin of the collection documents itself in YAML that parses (ansible-doc and ansible-lint
read DOCUMENTATION, EXAMPLES and RETURN; a plain scalar such as ``C(poll: 0)`` breaks the whole document)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DOC_NAMES = ("DOCUMENTATION", "EXAMPLES", "RETURN")


def documented() -> list[tuple[Path, str, str]]:
    found = []
    for path in sorted((REPO / "plugins").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                name = getattr(node.targets[0], "id", "")
                if name in DOC_NAMES and isinstance(node.value, ast.Constant):
                    found.append((path.relative_to(REPO), name, node.value.value))
    return found


def test_every_module_has_its_three_documents():
    modules = sorted((REPO / "plugins/modules").glob("*.py"))
    have = {(p, n) for p, n, _ in documented()}
    missing = [f"{m.name} {n}" for m in modules for n in DOC_NAMES if (m.relative_to(REPO), n) not in have]
    assert modules and not missing, missing


@pytest.mark.parametrize(("path", "name", "text"), documented(), ids=lambda v: str(v)[:60])
def test_document_is_yaml(path, name, text):
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        pytest.fail(f"{path} {name} is not YAML: {err}")
    if name == "DOCUMENTATION":
        assert isinstance(data, dict) and data.get("short_description"), f"{path}: no short_description"
