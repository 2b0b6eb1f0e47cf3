"""roles/gpu_facts/files/allreduce_bw.py: formulas, variants, summary; the real H200 report it produced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gpu_facts_helpers import BENCH, DEVICE, ab


def test_busbw_is_the_nccl_tests_formula():
    gib = 1024**3
    # 2 ranks: busbw == algbw; 8 ranks: factor 2*7/8
    assert ab.busbw_gbps(gib, 0.01, 2) == pytest.approx(gib / 0.01 / 1e9)
    assert ab.busbw_gbps(gib, 0.01, 8) == pytest.approx(gib / 0.01 / 1e9 * 1.75)
    assert ab.busbw_gbps(gib, 0.0, 8) == 0.0
    assert ab.algbw_gbps(1e9, 1.0) == 1.0


def test_parse_variant():
    assert ab.parse_variant('derived={"NCCL_P2P_LEVEL": "PHB", "NCCL_MIN_NCHANNELS": 8}') == (
        "derived",
        {"NCCL_P2P_LEVEL": "PHB", "NCCL_MIN_NCHANNELS": "8"},
    )
    assert ab.parse_variant("defaults={}") == ("defaults", {})
    assert ab.parse_variant("defaults=") == ("defaults", {})
    assert ab.parse_variant("off=NCCL_P2P_DISABLE=1,NCCL_SHM_DISABLE=1") == (
        "off",
        {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
    )
    with pytest.raises(Exception, match="NAME=ENV"):
        ab.parse_variant("=x")


def test_transports_from_nccl_logs(tmp_path):
    log = tmp_path / "nccl.h.1.log"
    log.write_text(
        "vm:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
        "vm:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
        "vm:1:2 [0] NCCL INFO other line\n"
    )
    assert ab.transports_from_logs([str(log), str(tmp_path / "missing")]) == ["P2P/CUMEM", "SHM/direct/direct"]


def _variant(name, values):
    return {"name": name, "ok": True, "results": [{"size_mib": s, "busbw_gbps": v} for s, v in values.items()]}


def test_summary_best_and_ratios():
    summary = ab.summarize(
        [_variant("derived", {1: 10.0, 64: 95.0, 1024: 300.0}), _variant("defaults", {1: 20.0, 64: 100.0, 1024: 290.0}),
         {"name": "broken", "ok": False}]
    )  # fmt: skip
    assert summary["reference"] == "derived"
    assert summary["best"]["1"] == {"variant": "defaults", "busbw_gbps": 20.0}
    assert summary["reference_vs_best"] == {"1": 0.5, "64": 0.95, "1024": 1.0}
    assert summary["min_ratio"] == 0.5 and summary["min_ratio_large"] == 0.95
    assert ab.summarize([{"name": "x", "ok": False}])["best"] == {}


def test_the_h200_report_is_consistent_and_the_derived_env_is_within_5_percent():
    report = json.loads((DEVICE / "nccl-allreduce.json").read_text())
    assert report["status"] == "ok" and report["world_size"] == 2
    names = [v["name"] for v in report["variants"]]
    assert names == ["derived", "defaults", "seed", "p2p_level_phb", "p2p_off", "p2p_off_shm_off"]
    for variant in report["variants"]:
        for row in variant["results"]:
            assert row["correct"]
            seconds = row["time_us"] / 1e6
            assert row["busbw_gbps"] == pytest.approx(ab.busbw_gbps(row["bytes"], seconds, 2), rel=0.01)
    assert ab.summarize(report["variants"]) == report["summary"]
    assert report["summary"]["min_ratio"] >= 0.95  # every size, 1 MiB .. 1 GiB
    by_name = {v["name"]: v for v in report["variants"]}
    assert by_name["derived"]["env"] == {}
    assert by_name["derived"]["transports"] == ["P2P/CUMEM"]
    assert by_name["p2p_off"]["transports"] == ["SHM/direct/direct"]
    assert by_name["p2p_off_shm_off"]["transports"] == ["NET/Socket/0"]
    big = report["summary"]["busbw_gbps"]
    assert big["derived"]["1024"] > 10 * big["p2p_off"]["1024"]  # P2P off: about 10x slower
    assert big["p2p_off"]["1024"] > 5 * big["p2p_off_shm_off"]["1024"]  # SHM off as well: sockets


def test_one_gpu_is_not_applicable():
    report = json.loads((DEVICE / "nccl-allreduce-one-gpu.json").read_text())
    assert report["status"] == "not_applicable" and report["world_size"] == 1


def test_without_torch_probe_and_refusal(tmp_path):
    script = f"{BENCH}/allreduce_bw.py"
    code = "import sys; sys.modules['torch'] = None; sys.argv = [sys.argv[0]] + sys.argv[1:]; "
    code += f"exec(open({script!r}).read())"
    probe = subprocess.run([sys.executable, "-c", code, "--probe"], capture_output=True, text=True, check=False)
    assert probe.returncode == 0
    assert json.loads(probe.stdout)["probe"]["torch"] is None
    out = tmp_path / "r.json"
    run = subprocess.run(
        [sys.executable, "-c", code, "--json-out", str(out)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 2
    report = json.loads(out.read_text())
    assert report["status"] == "unavailable" and "torch not importable" in report["message"]
