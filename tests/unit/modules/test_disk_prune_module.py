"""disk_prune: the ml-env releases and model revisions that nothing uses go, oldest first, only while the disk lacks
room; what ml_env's links point to, what the server's unit and kept manifests name, and what is new stay. The disk's
fullness is a stand-in statvfs for the module_utils tests (a 95%-full filesystem cannot be made here); the module runs
against this machine's real filesystem."""

from __future__ import annotations

import os
import shutil
import time
from types import SimpleNamespace

from ansible_collections.gpufleet.fleet.plugins.module_utils import disk_prune

OLD = time.time() - 7 * 86400


def tree(tmp_path):
    """/opt/ml-env like ml_env leaves it (releases r1..r4, current -> r4, previous -> r3) and /srv/models with two
    revisions of one model; every folder a week old, r1 the oldest. Each release holds 10 MiB (a sparse-free file)."""
    releases, models = tmp_path / "opt/ml-env/releases", tmp_path / "srv/models/glm-5"
    for i, name in enumerate(["r1", "r2", "r3", "r4"]):
        (releases / name / "bin").mkdir(parents=True)
        (releases / name / "bin/python").write_bytes(b"x" * (10 << 20))
        os.utime(releases / name, (OLD + i, OLD + i))
    for i, rev in enumerate(["aaaa", "bbbb"]):
        (models / rev).mkdir(parents=True)
        (models / rev / "model.safetensors").write_bytes(b"w" * (1 << 20))
        os.utime(models / rev, (OLD + 10 + i, OLD + 10 + i))
    (tmp_path / "opt/ml-env/current").symlink_to(releases / "r4")
    (tmp_path / "opt/ml-env/previous").symlink_to(releases / "r3")
    unit = tmp_path / "sglang-server.service"
    unit.write_text(f"ExecStart={releases}/r4/bin/python -m sglang.launch_server --model-path {models}/bbbb\n")
    return releases, models, unit


def roots(tmp_path):
    return [{"path": str(tmp_path / "opt/ml-env/releases"), "depth": 1},
            {"path": str(tmp_path / "srv/models"), "depth": 2}]  # fmt: skip


def links(tmp_path):
    return [str(tmp_path / "opt/ml-env/current"), str(tmp_path / "opt/ml-env/previous")]


class Disk:
    """A filesystem of ``size`` bytes whose free space grows by what the stand-in rmtree removes."""

    def __init__(self, size: int, free: int):
        self.size, self.free = size, free

    def statvfs(self, _path):
        return SimpleNamespace(f_frsize=1, f_blocks=self.size, f_bavail=self.free)

    def rmtree(self, path):
        self.free += disk_prune.folder_bytes(path)
        shutil.rmtree(path)


def test_a_full_disk_loses_the_oldest_unused_folders_until_it_has_room(tmp_path):
    releases, models, unit = tree(tmp_path)
    disk = Disk(size=100 << 20, free=5 << 20)  # 95% full; each old release frees 10%
    result = disk_prune.prune(roots(tmp_path), links(tmp_path), [str(unit)], 0.2,
                              statvfs=disk.statvfs, rmtree=disk.rmtree)  # fmt: skip
    # r1 (5% -> 15%), r2 (-> 25%): then there is room; the model's old revision is not needed
    assert [r["path"] for r in result["removed"]] == [str(releases / "r1"), str(releases / "r2")]
    assert result["freed_bytes"] == 20 << 20
    assert result["free_ratio_before"] == 0.05 and result["free_ratio_after"] == 0.25
    assert sorted(p.name for p in releases.iterdir()) == ["r3", "r4"]
    assert (models / "aaaa").exists()


def test_what_is_in_use_stays_however_full_the_disk(tmp_path):
    releases, models, unit = tree(tmp_path)
    lkg = tmp_path / "manifest.json"  # the last-known-good runs r2 with the old revision
    lkg.write_text(f'{{"release": "{releases}/r2", "argv": ["--model-path", "{models}/aaaa"]}}')
    disk = Disk(size=100 << 20, free=1 << 20)
    result = disk_prune.prune(roots(tmp_path), links(tmp_path), [str(unit), str(lkg)], 0.99,
                              statvfs=disk.statvfs, rmtree=disk.rmtree)  # fmt: skip
    assert [r["path"] for r in result["removed"]] == [str(releases / "r1")]
    assert sorted(result["kept"]) == sorted(
        [str(releases / n) for n in ("r2", "r3", "r4")] + [str(models / "aaaa"), str(models / "bbbb")]
    )


def test_a_folder_changed_within_the_minimum_age_stays(tmp_path):
    releases, _models, unit = tree(tmp_path)
    (releases / "r5").mkdir()  # a release being built now
    disk = Disk(size=100 << 20, free=1 << 20)
    result = disk_prune.prune(roots(tmp_path), links(tmp_path), [str(unit)], 0.99,
                              statvfs=disk.statvfs, rmtree=disk.rmtree)  # fmt: skip
    assert (releases / "r5").exists() and str(releases / "r5") in result["kept"]


def test_a_disk_with_room_loses_nothing(tmp_path):
    releases, _models, unit = tree(tmp_path)
    disk = Disk(size=100 << 20, free=50 << 20)
    result = disk_prune.prune(roots(tmp_path), links(tmp_path), [str(unit)], 0.2,
                              statvfs=disk.statvfs, rmtree=disk.rmtree)  # fmt: skip
    assert result["removed"] == [] and len(list(releases.iterdir())) == 4


def test_check_mode_removes_nothing_and_counts_what_would_go(tmp_path):
    releases, _models, unit = tree(tmp_path)
    disk = Disk(size=100 << 20, free=5 << 20)
    result = disk_prune.prune(roots(tmp_path), links(tmp_path), [str(unit)], 0.2, remove=False,
                              statvfs=disk.statvfs, rmtree=disk.rmtree)  # fmt: skip
    assert [r["path"] for r in result["removed"]] == [str(releases / "r1"), str(releases / "r2")]
    assert result["free_ratio_after"] == 0.25 and len(list(releases.iterdir())) == 4


def test_the_module_on_this_machine_removes_every_unused_old_folder_for_a_target_of_all(run_module, tmp_path):
    releases, models, unit = tree(tmp_path)
    args = {"roots": roots(tmp_path), "keep_links": links(tmp_path), "keep_files": [str(unit)], "free_ratio": 1.0}
    result, failed = run_module("disk_prune", args)
    assert not failed and result["changed"] is True
    assert sorted(r["path"] for r in result["removed"]) == sorted(
        [str(releases / "r1"), str(releases / "r2"), str(models / "aaaa")]
    )
    assert sorted(p.name for p in releases.iterdir()) == ["r3", "r4"] and [p.name for p in models.iterdir()] == ["bbbb"]
    again, _ = run_module("disk_prune", args)
    assert again["changed"] is False and again["removed"] == []


def test_the_module_refuses_a_relative_root_or_a_ratio_out_of_range(run_module, tmp_path):
    result, failed = run_module("disk_prune", {"roots": [{"path": "releases"}]})
    assert failed and "absolute path" in result["msg"]
    result, failed = run_module("disk_prune", {"roots": roots(tmp_path), "free_ratio": 1.5})
    assert failed and "free_ratio must be above 0 and at most 1, got 1.5" in result["msg"]
