"""One licence for the whole collection (issue 44): LICENSE at the root holds the Apache License 2.0 that galaxy.yml
names, and every role's meta/main.yml (galaxy_info.license) names the same."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
GALAXY_LICENSE = yaml.safe_load((REPO / "galaxy.yml").read_text())["license"]
ROLE_METAS = sorted((REPO / "roles").glob("*/meta/main.yml"))


def as_list(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def test_galaxy_names_apache_2_0_and_license_holds_its_text():
    assert GALAXY_LICENSE == ["Apache-2.0"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License\n" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_every_role_has_a_meta_file():
    assert {p.parts[-3] for p in ROLE_METAS} == {p.name for p in (REPO / "roles").iterdir() if p.is_dir()}


@pytest.mark.parametrize("meta", ROLE_METAS, ids=[p.parts[-3] for p in ROLE_METAS])
def test_each_role_names_the_collection_license(meta):
    info = yaml.safe_load(meta.read_text())["galaxy_info"]
    assert as_list(info["license"]) == GALAXY_LICENSE


def test_pyproject_names_no_other_license():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    if "license" in project:
        license_ = project["license"]
        assert (license_ if isinstance(license_, str) else license_.get("text")) in GALAXY_LICENSE
