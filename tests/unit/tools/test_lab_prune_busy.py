"""`prune` (run by make test while other labs come up) must not take a lab that is being brought up for a stale one:
until its first host is recorded, such a lab has state (its subnet) and no live host."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))

import gpufleet_lab.lab as lab_mod  # noqa: E402
from gpufleet_lab.lab import Lab, LabSpec  # noqa: E402


@pytest.fixture
def state_root(tmp_path, monkeypatch):
    monkeypatch.setattr(lab_mod, "STATE_ROOT", tmp_path)
    return tmp_path


def _lab_without_hosts(name: str) -> Lab:
    lab = Lab(name, log=lambda _msg: None)
    lab.dir.mkdir(parents=True)
    lab.save({"name": name, "subnet": "10.222.1.0/24", "hosts": {}})
    return lab


def test_a_lab_with_state_and_no_live_host_is_stale(state_root):
    assert _lab_without_hosts("half-up").is_stale()


def test_a_lab_whose_folder_another_process_locked_is_not_stale(state_root):
    lab = _lab_without_hosts("coming-up")
    fd = os.open(lab.dir, os.O_RDONLY | os.O_DIRECTORY)  # another open file: flock conflicts as across processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert lab.busy() and not lab.is_stale()
    finally:
        os.close(fd)
    assert not lab.busy() and lab.is_stale()


def test_up_holds_the_lock_while_it_brings_the_lab_up(state_root, monkeypatch):
    seen = {}

    def fake_up(self, spec, base):  # the state `up` writes before its first host exists
        self.save({"name": self.name, "subnet": "10.222.2.0/24", "hosts": {}})
        seen["stale_for_prune"] = Lab(self.name).is_stale()
        return {"lab": self.name}

    monkeypatch.setattr(lab_mod, "ensure_base", lambda *a, **k: Path("/nonexistent-base"))
    monkeypatch.setattr(Lab, "_up", fake_up)
    Lab("racing", log=lambda _msg: None).up(LabSpec(name="racing", hosts=1))
    assert seen == {"stale_for_prune": False}
    assert json.loads((state_root / "racing" / "state.json").read_text())["hosts"] == {}
    assert Lab("racing").is_stale()  # once `up` is over, a lab left without hosts is stale again


def test_a_removed_folder_is_not_busy(state_root):
    assert not Lab("never-made").busy()


def test_down_holds_the_lock_while_it_takes_the_lab_down(state_root, monkeypatch):
    lab = _lab_without_hosts("going-down")
    seen = {}

    def fake_down(self):
        seen["busy_for_prune"] = Lab(self.name).busy()
        return {"lab": self.name, "removed": [], "changed": False}

    monkeypatch.setattr(Lab, "_down", fake_down)
    lab.down()
    assert seen == {"busy_for_prune": True}
