"""sglang_server_swap's current_link: a rollback points the ml-env `current` link back at the restored release in the
same module run as the stop and the start (it was a task of its own in every restart flow, skipped on a deploy)."""

from __future__ import annotations

import os

import sglang_server_swap as swap


def test_the_link_is_pointed_at_the_restored_release_and_says_it_changed(tmp_path):
    a, b = tmp_path / "releases" / "a", tmp_path / "releases" / "b"
    a.mkdir(parents=True)
    b.mkdir()
    current = tmp_path / "current"
    current.symlink_to(b)
    assert swap.point_link(str(current), str(a)) is True
    assert os.readlink(current) == str(a)
    assert swap.point_link(str(current), str(a)) is False  # already there: nothing changes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "releases"]  # no temporary link left


def test_a_missing_link_is_created_and_a_stale_temporary_one_replaced(tmp_path):
    current = tmp_path / "current"
    (tmp_path / "current.gpufleet-tmp").symlink_to("/nowhere")  # left by an interrupted run
    assert swap.point_link(str(current), "/opt/ml-env/releases/a") is True
    assert os.readlink(current) == "/opt/ml-env/releases/a"
    assert not os.path.lexists(tmp_path / "current.gpufleet-tmp")
