"""locks/update_locks.py wheelhouse-production: which wheel of each pin goes into the controller wheelhouse."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "locks"))

import update_locks as u  # noqa: E402

META = yaml.safe_load((REPO / "locks" / "sglang-cu128" / "lock.yml").read_text())
RANKED = {t: i for i, t in enumerate(u.target_tags(META["python_version"], META["python_platform"]))}


def entry(filename: str, digest: str) -> dict:
    return {"filename": filename, "url": f"https://example.invalid/{filename}", "hashes": {"sha256": digest}}


def test_every_pin_of_the_production_lock_is_read_with_its_hashes():
    pins = u.lock_pins(REPO / "locks" / "sglang-cu128")
    names = {name: version for name, version, _ in pins}
    assert len(pins) == 169
    assert names["sglang"] == "0.5.9" and names["torch"] == "2.9.1" and names["sgl-kernel"] == "0.3.21"
    assert all(hashes and all(len(h) == 64 for h in hashes) for _, _, hashes in pins)


def test_the_best_wheel_for_cp312_manylinux_2_28_is_chosen_among_the_locked_hashes():
    files = [
        entry("torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl", "a" * 64),
        entry("torch-2.9.1-cp312-cp312-manylinux_2_28_aarch64.whl", "b" * 64),
        entry("torch-2.9.1-cp312-cp312-win_amd64.whl", "c" * 64),
        entry("torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl", "d" * 64),
        entry("torch-2.9.1.tar.gz", "e" * 64),
    ]
    chosen = u.choose_wheel(files, "torch", "2.9.1", {"a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64}, RANKED)
    assert chosen["filename"] == "torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    # a wheel whose hash the lock does not hold is never taken, even when it fits
    assert u.choose_wheel(files, "torch", "2.9.1", {"a" * 64}, RANKED) is None
    # a newer glibc than the lock's platform does not fit
    newer = [entry("x-1.0-cp312-cp312-manylinux_2_34_x86_64.whl", "f" * 64)]
    assert u.choose_wheel(newer, "x", "1.0", {"f" * 64}, RANKED) is None


def test_abi3_and_pure_wheels_fit_and_the_specific_one_wins():
    files = [
        entry("sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl", "1" * 64),
        entry("sgl_kernel-0.3.21-py3-none-any.whl", "2" * 64),
    ]
    hashes = {"1" * 64, "2" * 64}
    best = u.choose_wheel(files, "sgl-kernel", "0.3.21", hashes, RANKED)
    assert best["filename"].endswith("abi3-manylinux2014_x86_64.whl")
    assert u.choose_wheel(files[1:], "sgl-kernel", "0.3.21", hashes, RANKED)["filename"].endswith("py3-none-any.whl")
