"""Held GPU memory and its remedy, through the real playbooks/preflight.yml (the first stage of deploy.yml).

After a leaking version was stopped, the role says: enable sglang_server_held_memory_gpu_reset (or _reboot) and
deploy again. The server stage applies that remedy after its stop, but deploy.yml's preflight runs first: it
must leave leaked memory to the enabled remedy (a warning) instead of refusing the host, and refuse it when no
remedy is enabled. The simulated nvidia-smi lists a leaked allocation of a process that is gone (lab/gpusim).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_nnodes_one_source import failures, run_readers, task_msg  # noqa: E402

GONE_PID = 3999991  # no such process: the scheduler that leaked
ONE_NODE = {"tp-size": 8}


def leak(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    record = {"pid": GONE_PID, "process_name": "sglang::scheduler_TP0", "gpus": {"0": 88000}, "leak": True}
    (state / f"alloc-{GONE_PID}.json").write_text(json.dumps(record))


def test_without_a_remedy_leaked_memory_is_refused_in_preflight(tmp_path):
    leak(tmp_path)
    rc, doc = run_readers(tmp_path, host_flags=ONE_NODE)
    assert rc != 0
    (msg,) = failures(doc)
    assert f"pid {GONE_PID} sglang::scheduler_TP0 on GPU0 using 88000 MiB (process gone" in msg


def test_an_enabled_remedy_gets_its_turn_after_the_stop(tmp_path):
    leak(tmp_path)
    rc, doc = run_readers(tmp_path, {"sglang_server_held_memory_gpu_reset": True}, host_flags=ONE_NODE)
    assert rc == 0, failures(doc)
    warnings = task_msg(doc, "Report preflight warnings")
    (line,) = [w for w in warnings if str(GONE_PID) in w]
    assert "Left to the server stage's remedy (sglang_server_held_memory_gpu_reset=true)" in line
