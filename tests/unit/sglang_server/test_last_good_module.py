"""sglang_server_last_good: the installed unit and secrets become the last-known-good in one module run; the former
one becomes previous-good, whose secrets follow the configuration; nothing changes when nothing differs."""

from __future__ import annotations

import json
import stat

import pytest

UNIT = "sglang-server.service"
KEPT = 'SGLANG_SERVER_API_KEY=""\n'


@pytest.fixture
def host(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / UNIT).write_text("[Service]\nExecStart=/opt/ml-env/releases/sim-a/bin/python -m sglang.launch_server\n")
    (etc / "secrets.env").write_text('SGLANG_SERVER_API_KEY="sk-old"\n')
    state = tmp_path / "state"
    state.mkdir()
    return tmp_path


def args(root, **extra):
    return {
        "unit_path": str(root / "etc" / UNIT),
        "secrets_path": str(root / "etc" / "secrets.env"),
        "last_good_dir": str(root / "state" / "last-good"),
        "previous_good_dir": str(root / "state" / "previous-good"),
        "manifest": {"release_id": "sim-a", "stopped_cleanly": None, "ready_after_s": 3.2},
        "kept_secrets": KEPT,
        **extra,
    }


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_first_save_copies_unit_secrets_and_manifest_root_only(host, run_module):
    result, failed = run_module("sglang_server_last_good", args(host))
    assert not failed and result["changed"] and result["saved"] and not result["kept_secrets_rewritten"]
    lkg = host / "state" / "last-good"
    assert (lkg / UNIT).read_text() == (host / "etc" / UNIT).read_text()
    assert (lkg / "secrets.env").read_text() == 'SGLANG_SERVER_API_KEY="sk-old"\n'
    manifest = json.loads((lkg / "manifest.json").read_text())
    assert manifest == {"release_id": "sim-a", "stopped_cleanly": None, "ready_after_s": 3.2,
                        "unit_sha256": result["unit_sha256"]}  # fmt: skip
    assert (mode(lkg), mode(lkg / UNIT), mode(lkg / "secrets.env"), mode(lkg / "manifest.json")) == (
        0o700, 0o644, 0o600, 0o644,
    )  # fmt: skip
    assert not (host / "state" / "previous-good").exists()
    assert not list(lkg.glob(".tmp-*"))


def test_nothing_differs_nothing_changes(host, run_module):
    run_module("sglang_server_last_good", args(host))
    before = (host / "state" / "last-good" / "manifest.json").read_text()
    result, failed = run_module("sglang_server_last_good", args(host, manifest={"release_id": "other"}))
    assert not failed and result == {**result, "changed": False, "saved": False, "kept_secrets_rewritten": False}
    assert (host / "state" / "last-good" / "manifest.json").read_text() == before


def test_a_new_version_moves_the_former_to_previous_good_with_the_configured_secrets(host, run_module):
    run_module("sglang_server_last_good", args(host))
    old_unit = (host / "etc" / UNIT).read_text()
    (host / "etc" / UNIT).write_text(old_unit.replace("sim-a", "sim-b"))
    (host / "etc" / "secrets.env").write_text('SGLANG_SERVER_API_KEY="sk-new"\n')
    result, failed = run_module("sglang_server_last_good", args(host, manifest={"release_id": "sim-b"}))
    assert not failed and result["saved"] and result["kept_secrets_rewritten"]
    previous, lkg = host / "state" / "previous-good", host / "state" / "last-good"
    assert (previous / UNIT).read_text() == old_unit
    assert json.loads((previous / "manifest.json").read_text())["release_id"] == "sim-a"
    # the old key leaves no copy: the kept version's secrets are what the configuration says now
    assert (previous / "secrets.env").read_text() == KEPT and mode(previous / "secrets.env") == 0o600
    assert "sk-old" not in "".join(p.read_text() for p in host.rglob("*") if p.is_file())
    assert (lkg / "secrets.env").read_text() == 'SGLANG_SERVER_API_KEY="sk-new"\n'
    assert json.loads((lkg / "manifest.json").read_text())["release_id"] == "sim-b"
    # a third version: the one before previous-good is gone
    (host / "etc" / UNIT).write_text(old_unit.replace("sim-a", "sim-c"))
    run_module("sglang_server_last_good", args(host))
    assert "sim-b" in (previous / UNIT).read_text()


def test_a_secret_changed_in_the_configuration_reaches_previous_good_without_a_new_version(host, run_module):
    run_module("sglang_server_last_good", args(host))
    (host / "etc" / UNIT).write_text("[Service]\nExecStart=/bin/true\n")
    run_module("sglang_server_last_good", args(host))
    result, failed = run_module("sglang_server_last_good", args(host, kept_secrets='HF_TOKEN="hf_rotated"\n'))
    assert not failed and result["changed"] and not result["saved"] and result["kept_secrets_rewritten"]
    assert (host / "state" / "previous-good" / "secrets.env").read_text() == 'HF_TOKEN="hf_rotated"\n'


def test_check_mode_reports_and_writes_nothing(host, run_module):
    result, failed = run_module("sglang_server_last_good", {**args(host), "_ansible_check_mode": True})
    assert not failed and result["changed"] and result["saved"]
    assert list((host / "state").iterdir()) == []


def test_the_secret_never_leaves_in_the_result_and_a_missing_unit_fails(host, run_module):
    result, failed = run_module("sglang_server_last_good", args(host, kept_secrets='HF_TOKEN="hf_abc123"\n'))
    assert "hf_abc123" not in json.dumps(result)
    (host / "etc" / UNIT).unlink()
    result, failed = run_module("sglang_server_last_good", args(host))
    assert failed and "does not exist" in result["msg"]


def test_with_readback_unit_the_save_returns_the_reports_read_back_of_the_manifest_just_written(
    host, run_module, tmp_path, monkeypatch
):
    """The deploy report's read-back in the same module run as the save (one Python on the host fewer per restart):
    what sglang_server_readback would return right after it, the new manifest included, and no secret."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(
        "#!/bin/sh\nprintf 'MainPID=0\\nEnvironment=NCCL_P2P_LEVEL=PHB SGLANG_SERVER_API_KEY=sk-old\\n'\n"
    )
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result, failed = run_module("sglang_server_last_good", args(host, readback_unit=UNIT))
    assert not failed and result["saved"]
    manifest = json.loads((host / "state" / "last-good" / "manifest.json").read_text())
    assert result["readback"] == {"source": "unit", "main_pid": 0, "nccl_env": {"NCCL_P2P_LEVEL": "PHB"},
                                  "manifest": manifest}  # fmt: skip
    assert "sk-old" not in json.dumps(result)
    # without it, no read-back (and no systemctl call)
    again, failed = run_module("sglang_server_last_good", args(host))
    assert not failed and "readback" not in again
