"""roles/fleet_router/files/smg-launch.py: smg's control-plane keys come from the environment, never argv."""

from __future__ import annotations

import runpy
import sys
import types
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[3] / "roles/fleet_router/files/smg-launch.py"


@pytest.fixture
def fake_smg(monkeypatch):
    seen = {}
    mod = types.ModuleType("smg.launch_router")
    mod.parse_router_args = lambda argv: seen.setdefault("argv", argv)
    mod.launch_router = lambda args: seen.setdefault("launched", args)
    monkeypatch.setitem(sys.modules, "smg", types.ModuleType("smg"))
    monkeypatch.setitem(sys.modules, "smg.launch_router", mod)
    return seen


def test_keys_from_the_environment_reach_smg_and_leave_the_environment(fake_smg, monkeypatch):
    monkeypatch.setenv("GPUFLEET_SMG_CONTROL_PLANE_API_KEYS", "gpufleet:ansible:admin:s3cret-key-0123456789")
    monkeypatch.setattr(sys, "argv", ["smg-launch.py", "--port", "30000"])
    runpy.run_path(str(LAUNCHER), run_name="__main__")
    assert fake_smg["argv"] == [
        "--port",
        "30000",
        "--control-plane-api-keys",
        "gpufleet:ansible:admin:s3cret-key-0123456789",
    ]
    assert "GPUFLEET_SMG_CONTROL_PLANE_API_KEYS" not in __import__("os").environ
    assert "s3cret" not in " ".join(sys.argv)


def test_no_key_no_router(fake_smg, monkeypatch):
    monkeypatch.delenv("GPUFLEET_SMG_CONTROL_PLANE_API_KEYS", raising=False)
    monkeypatch.setattr(sys, "argv", ["smg-launch.py"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(LAUNCHER), run_name="__main__")
    assert "worker API would be open to anyone" in str(exc.value.code)
    assert "launched" not in fake_smg
