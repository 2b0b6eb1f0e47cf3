"""The role's pure filters: the GPUDirect clique verdict and the pending keys."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.filter import proxmox_gpu_vm as pgv

ROOT = Path(__file__).resolve().parents[3]
NCCL = json.loads((ROOT / "tests/unit/fixtures/h200-device/nccl-allreduce.json").read_text())


def test_clique_kept_only_with_a_completed_all_reduce_and_a_gain():
    best = max(NCCL["summary"]["busbw_gbps"]["derived"].items(), key=lambda kv: float(kv[0]))[1]
    assert pgv.clique_verdict(NCCL, best / 1.5, 0.2)["keep"] is True
    assert pgv.clique_verdict(NCCL, best, 0.2)["keep"] is False
    assert "no baseline" in pgv.clique_verdict(NCCL, None, 0.2)["reason"]
    assert "no NCCL all-reduce measurement" in pgv.clique_verdict(None, 10, 0.2)["reason"]
    hung = json.loads(json.dumps(NCCL))
    derived = next(v for v in hung["variants"] if v["name"] == "derived")
    derived.update(ok=False, error="TimeoutError('all-reduce did not finish')")
    assert "did not complete with the clique: TimeoutError" in pgv.clique_verdict(hung, 1, 0.2)["reason"]
    wrong = json.loads(json.dumps(NCCL))
    next(v for v in wrong["variants"] if v["name"] == "derived")["results"][0]["correct"] = False
    assert "wrong sums at [1.0] MiB" in pgv.clique_verdict(wrong, 1, 0.2)["reason"]


def test_pending_keys_include_pending_deletes():
    pending = [
        {"key": "cores", "value": "16"},
        {"key": "hostpci1", "pending": "0000:a2:00.0,pcie=1"},
        {"key": "hostpci3", "value": "0000:c1:00.0", "delete": 1},
    ]
    assert pgv.pending_keys(pending) == ["hostpci1", "hostpci3"]
