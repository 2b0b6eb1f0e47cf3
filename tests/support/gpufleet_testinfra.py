"""Helpers shared by the testinfra suites of gpufleet's Molecule scenarios.

Service checks include the unit's journal in their failure message, so a red test says why.
"""

from __future__ import annotations

import os

import pytest
import testinfra


def journal(host, unit: str, lines: int = 60) -> str:
    return host.run(f"journalctl -u {unit} -n {lines} --no-pager -o short-precise").stdout


def assert_unit_active(host, unit: str) -> None:
    service = host.service(unit)
    if not service.is_running:
        state = host.run(f"systemctl status {unit} --no-pager").stdout
        pytest.fail(
            f"{unit} is not running on {host.backend.get_hostname()}\n{state}\n"
            f"--- journalctl -u {unit} ---\n{journal(host, unit)}"
        )


@pytest.fixture
def host_by_name():
    """Open a testinfra host for another instance of the same Molecule inventory."""
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]

    def _get(name: str):
        return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")

    return _get
