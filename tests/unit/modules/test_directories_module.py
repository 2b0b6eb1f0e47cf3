"""directories: several directories (owner, group, mode) in one module run (sglang_server, ml_env, fleet_router);
changed only when a directory was created or its attributes differ; a file in the way is refused by path."""

from __future__ import annotations

import os
import stat


def _mode(path) -> str:
    return oct(stat.S_IMODE(os.stat(path).st_mode))


def test_creates_missing_directories_with_their_modes_then_changes_nothing(run_module, tmp_path):
    dirs = [
        {"path": str(tmp_path / "etc"), "owner": "root", "group": "root", "mode": "0755"},
        {"path": str(tmp_path / "etc/candidate"), "owner": "root", "group": "root", "mode": "0700"},
        {"path": str(tmp_path / "cache/deep"), "mode": "0750"},
    ]
    result, failed = run_module("directories", {"directories": dirs})
    assert not failed and result["changed"] is True
    assert result["changed_paths"] == [d["path"] for d in dirs]
    assert [_mode(d["path"]) for d in dirs] == ["0o755", "0o700", "0o750"]
    again, _ = run_module("directories", {"directories": dirs})
    assert again["changed"] is False and again["changed_paths"] == []


def test_a_wrong_mode_is_corrected_and_reported(run_module, tmp_path):
    (tmp_path / "state").mkdir(mode=0o777)
    os.chmod(tmp_path / "state", 0o777)
    result, _ = run_module("directories", {"directories": [{"path": str(tmp_path / "state"), "mode": "0755"}]})
    assert result["changed_paths"] == [str(tmp_path / "state")] and _mode(tmp_path / "state") == "0o755"


def test_a_file_in_the_way_is_refused_by_path(run_module, tmp_path):
    (tmp_path / "candidate").write_text("not a directory")
    result, failed = run_module("directories", {"directories": [{"path": str(tmp_path / "candidate")}]})
    assert (
        failed
        and result["msg"] == f"{tmp_path / 'candidate'} exists and is not a directory: move it away or fix the path"
    )
