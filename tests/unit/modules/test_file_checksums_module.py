"""file_checksums: the restart decision compares a candidate unit and secrets file with the installed ones, and the
installed ones with the last-known-good, by SHA-256 in one module run each."""

from __future__ import annotations

import hashlib


def test_sums_in_the_order_given_with_empty_for_missing_files_and_folders(run_module, tmp_path):
    unit = tmp_path / "sglang-server.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    same = tmp_path / "installed.service"
    same.write_text(unit.read_text())
    missing = tmp_path / "secrets.env"
    paths = [str(unit), str(missing), str(same), str(tmp_path)]
    result, failed = run_module("file_checksums", {"paths": paths})
    assert not failed and result["changed"] is False
    want = hashlib.sha256(unit.read_bytes()).hexdigest()
    assert result["checksums"] == [want, "", want, ""]
    assert result["files"] == dict(zip(paths, [want, "", want, ""], strict=True))


def test_a_changed_byte_changes_the_sum(run_module, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("NCCL_IB_DISABLE=1\n")
    b.write_text("NCCL_IB_DISABLE=0\n")
    result, _ = run_module("file_checksums", {"paths": [str(a), str(b)]})
    assert result["checksums"][0] != result["checksums"][1]
