"""Memory that stays held after a stop: what the role names (held_memory), what it writes into the kept
versions' manifests (record_stop), and the readiness bound of a rollback (sglang_rollback_ready_timeout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server_kept as kept
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_holders as server_holders
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_manifest as server_manifest


def snap(used, ours=(), foreign=(), unit_pids=()):
    return {
        "gpu_memory_used_mib": {str(k): v for k, v in used.items()},
        "gpu_ours": list(ours),
        "gpu_foreign": list(foreign),
        "unit_pids": list(unit_pids),
    }


GONE = {"pid": 4100, "gpu_index": 0, "used_memory_mib": 85000, "name": "sglang::scheduler_TP0", "alive": False}
LIVE = {
    "pid": 4242,
    "gpu_index": 1,
    "used_memory_mib": 2048,
    "name": "/usr/bin/python3",
    "alive": True,
    "user": "intruder",
    "cmdline": "/usr/bin/python3 /usr/local/bin/gpusim-hold --gpus 1 --mib 2048",
    "unit": None,
}


def test_a_leak_of_the_stopped_version_names_the_gone_pid_and_is_caused_by_the_stop():
    before = snap({0: 85000}, ours=[dict(GONE, alive=True, unit="sglang-server.service")])
    held = server_holders.held_memory(snap({0: 85000}, foreign=[GONE]), 512, before)
    assert held["gpus"] == [0] and held["gone_pids"] == [4100] and held["live_pids"] == []
    assert "pid 4100 (sglang::scheduler_TP0, GPUs 0, 85000 MiB, process gone: leaked allocation)" in held["text"]
    assert held["caused_by_stop"] is True


def test_memory_with_no_process_is_held_by_the_driver():
    held = server_holders.held_memory(snap({0: 10, 1: 90000}), 512, snap({0: 10, 1: 10}))
    assert held["gpus"] == [1] and held["no_process_gpus"] == [1]
    assert held["text"] == "GPU 1: 90000 MiB used, no process: memory held by the driver"
    assert held["caused_by_stop"] is True


def test_a_live_holder_is_named_with_user_and_command_and_blocks_a_reset():
    held = server_holders.held_memory(snap({1: 2048}, foreign=[LIVE]), 512, snap({1: 2048}, foreign=[LIVE]))
    assert held["live_pids"] == [4242]
    assert "user intruder" in held["text"] and "gpusim-hold --gpus 1" in held["text"]
    assert held["caused_by_stop"] is False  # it held the GPU before the stop: not the stopped version's doing


def write_manifest(path: Path, **extra) -> Path:
    path.write_text(json.dumps({"release_id": "sim-a", "unit_sha256": "abc", "stopped_cleanly": None, **extra}))
    return path


def test_record_stop_marks_only_the_stopped_version(tmp_path):
    lkg = write_manifest(tmp_path / "lkg.json")
    other = write_manifest(tmp_path / "prev.json", unit_sha256="def")
    held = {"text": "pid 4100 (...)", "caused_by_stop": True}
    assert server_manifest.record_stop(
        [str(lkg), str(other), str(tmp_path / "none.json")], "abc", False, held, 1.0, 10.0
    ) == [str(lkg)]
    assert json.loads(lkg.read_text())["stopped_cleanly"] is False
    assert json.loads(lkg.read_text())["last_stop"]["held"] == "pid 4100 (...)"
    assert json.loads(other.read_text())["stopped_cleanly"] is None
    # once seen to leak, a clean stop later does not make it a rollback target again
    server_manifest.record_stop([str(lkg)], "abc", True, {}, 2.0, 0.1)
    assert json.loads(lkg.read_text())["stopped_cleanly"] is False
    fresh = write_manifest(tmp_path / "fresh.json")
    server_manifest.record_stop([str(fresh)], "abc", True, {}, 2.0, 0.1)
    assert json.loads(fresh.read_text())["stopped_cleanly"] is True


def test_rollback_ready_timeout_comes_from_the_restored_version():
    # proven under 60 s, needed 9 s: 60, whatever the new version set
    assert kept.sglang_rollback_ready_timeout({"ready_timeout_s": 60, "ready_after_s": 9.2}, 4) == 60
    # a bound it barely met is stretched to twice what it needed
    assert kept.sglang_rollback_ready_timeout({"ready_timeout_s": 10, "ready_after_s": 9.2}, 4) == 19
    # an old manifest that records nothing: the start timeout
    assert kept.sglang_rollback_ready_timeout({}, 120) == 120
    with pytest.raises(ValueError):
        kept.sglang_rollback_ready_timeout({}, 0)


@pytest.mark.parametrize(
    ("value", "words"),
    [(None, "never stopped"), (True, "stopped cleanly"), (False, "left GPU memory held when stopped")],
)
def test_stop_record_in_words(value, words):
    assert kept.sglang_stop_record({"stopped_cleanly": value}).startswith(words)
