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


def launch(monkeypatch, record: str | None) -> None:
    monkeypatch.setenv("GPUFLEET_SMG_CONTROL_PLANE_API_KEYS", "gpufleet:ansible:admin:s3cret-key-0123456789")
    if record is None:
        monkeypatch.delenv("GPUFLEET_SMG_WORKERS_FILE", raising=False)
    else:
        monkeypatch.setenv("GPUFLEET_SMG_WORKERS_FILE", record)
    monkeypatch.setattr(sys, "argv", ["smg-launch.py", "--port", "30000"])
    runpy.run_path(str(LAUNCHER), run_name="__main__")


def test_the_recorded_workers_are_the_routers_startup_workers(fake_smg, monkeypatch, tmp_path):
    """A router restart (crash, OOM kill, reboot) starts with the workers the gateway's record holds: smg registers
    startup workers in the background, so it comes back serving them without Ansible."""
    record = tmp_path / "workers.json"
    record.write_text('{"workers": ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]}')
    launch(monkeypatch, str(record))
    argv = fake_smg["argv"]
    assert argv[:5] == ["--port", "30000", "--worker-urls", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    assert argv[5:] == ["--control-plane-api-keys", "gpufleet:ansible:admin:s3cret-key-0123456789"]


@pytest.mark.parametrize("content", [None, '{"workers": []}', "not json", '{"workers": "http://10.0.0.2:8000"}'])
def test_no_usable_record_starts_the_router_with_no_worker(fake_smg, monkeypatch, tmp_path, capsys, content):
    """No record yet (the first deploy), an empty one, or one that is not a list of URLs: the router starts (with no
    worker) and an unusable record is named in the journal."""
    record = tmp_path / "workers.json"
    if content is not None:
        record.write_text(content)
    launch(monkeypatch, str(record))
    assert "--worker-urls" not in fake_smg["argv"] and "launched" in fake_smg
    err = capsys.readouterr().err
    assert (f"worker record {record} not usable" in err) == (
        content in ("not json", '{"workers": "http://10.0.0.2:8000"}')
    )
