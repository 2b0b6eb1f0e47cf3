"""sglang_server_readback: the deploy report's read-back in one module run. Only NCCL_* leaves the host (the
process environment also holds the EnvironmentFile's secrets); the last-known-good manifest comes with it."""

from __future__ import annotations

import json

import sglang_server_readback as mod
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_readback import env_readback
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import show_properties

SHOW = 'MainPID=4242\nEnvironment="CUDA_HOME=/usr/local/cuda 12" NCCL_P2P_LEVEL=PHB NCCL_IB_DISABLE=1\n'
ENVIRON = b"HF_TOKEN=hf_secret\0SGLANG_SERVER_API_KEY=sk-lab\0NCCL_MIN_NCHANNELS=8\0NCCL_SHM_DISABLE=1\0"


def test_env_readback_keeps_only_nccl_from_the_process_or_the_unit():
    props = show_properties(SHOW)
    got = env_readback(props, ENVIRON)
    assert got == {"source": "process", "main_pid": 4242,
                   "nccl_env": {"NCCL_MIN_NCHANNELS": "8", "NCCL_SHM_DISABLE": "1"}}  # fmt: skip
    assert env_readback(props)["nccl_env"] == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "PHB"}
    assert env_readback(show_properties(""))["source"] == "none"
    assert env_readback(show_properties("MainPID=0"))["main_pid"] == 0


def test_the_module_reads_the_running_process_and_the_manifest_and_returns_no_secret(tmp_path):
    (tmp_path / "proc/4242").mkdir(parents=True)
    (tmp_path / "proc/4242/environ").write_bytes(ENVIRON)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"release_id": "sim-a", "unit_sha256": "ab12"}))
    calls = []

    def runner(argv, timeout=60):
        calls.append(argv)
        return 0, SHOW, ""

    got = mod.readback("sglang-server.service", str(manifest), runner=runner, proc_root=str(tmp_path / "proc"))
    assert calls == [["systemctl", "show", "--property=MainPID", "--property=Environment", "sglang-server.service"]]
    assert got["source"] == "process" and got["nccl_env"] == {"NCCL_MIN_NCHANNELS": "8", "NCCL_SHM_DISABLE": "1"}
    assert got["manifest"] == {"release_id": "sim-a", "unit_sha256": "ab12"}
    assert "hf_secret" not in json.dumps(got) and "sk-lab" not in json.dumps(got)


def test_a_stopped_server_falls_back_to_the_unit_and_a_missing_manifest_is_empty(tmp_path):
    show = 'MainPID=0\nEnvironment="NCCL_P2P_LEVEL=PHB"\n'
    got = mod.readback("sglang-server.service", str(tmp_path / "none.json"), runner=lambda a, timeout=60: (0, show, ""))
    assert got == {"source": "unit", "main_pid": 0, "nccl_env": {"NCCL_P2P_LEVEL": "PHB"}, "manifest": {}}
    (tmp_path / "bad.json").write_text("not json")
    assert (
        mod.readback("u", str(tmp_path / "bad.json"), runner=lambda a, timeout=60: (1, "", "no unit"))["manifest"] == {}
    )
