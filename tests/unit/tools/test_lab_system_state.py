"""The lab reads a host's state with `systemctl is-system-running` inside the host. A host whose systemd takes no
call (seen while it goes down for a reboot under load) is reported `unresponsive`: `status` and `up` carry on
instead of ending in a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))

import gpufleet_lab.lab as lab_mod  # noqa: E402
from gpufleet_lab.lab import Lab  # noqa: E402


@pytest.fixture
def systemctl_in_path(tmp_path, monkeypatch):
    """A `systemctl` first on PATH; nsenter into this test's own namespaces runs it (this machine has no systemd)."""

    def install(body: str) -> None:
        script = tmp_path / "systemctl"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    monkeypatch.setattr(lab_mod, "current_boot", lambda record: record)
    return install


def test_a_host_whose_systemd_answers_reports_its_state(systemctl_in_path):
    systemctl_in_path("echo degraded; exit 1")
    assert Lab._system_state({"leader_pid": os.getpid()}) == "degraded"


def test_a_host_whose_systemd_takes_no_call_is_unresponsive(systemctl_in_path, monkeypatch):
    systemctl_in_path("exec sleep 30")
    monkeypatch.setattr(lab_mod, "SYSTEMCTL_TIMEOUT", 1)
    assert Lab._system_state({"leader_pid": os.getpid()}) == "unresponsive"
