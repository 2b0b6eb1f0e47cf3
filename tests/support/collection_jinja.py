"""Render role templates outside Ansible with the collection's filters, named as the templates call them.

Templates call filters by FQCN (``gpufleet.fleet.systemd_environment``); Jinja accepts dotted filter names.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import jinja2

FILTER_DIR = Path(__file__).resolve().parents[2] / "plugins" / "filter"
PACKAGE = "ansible_collections.gpufleet.fleet.plugins.filter"


def collection_filters() -> dict:
    """Every filter of plugins/filter under its FQCN (gpufleet.fleet.<name>)."""
    found = {}
    for path in sorted(FILTER_DIR.glob("*.py")):
        module = importlib.import_module(f"{PACKAGE}.{path.stem}")
        found.update({f"gpufleet.fleet.{name}": fn for name, fn in module.FilterModule().filters().items()})
    return found


def environment(**options) -> jinja2.Environment:
    """A Jinja environment (keep_trailing_newline as Ansible's template module) with the collection's filters."""
    env = jinja2.Environment(keep_trailing_newline=True, **options)
    env.filters.update(collection_filters())
    return env
