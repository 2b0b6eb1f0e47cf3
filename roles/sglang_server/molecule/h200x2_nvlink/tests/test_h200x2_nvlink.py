"""2x H200 joined by NVLink (the h200x2-vm profile replays real captures): tp 2 over both GPUs, no NCCL
variable anywhere (NCCL picks NVLink itself) and SGLang's custom all-reduce left on, in the rendered unit,
in the report and in the engine that runs."""

import sglang_molecule as sm

HOST = "sglang-h200"


def test_rendered_unit_has_tp_2_no_nccl_and_custom_all_reduce_on(host):
    text = host.file(sm.UNIT_PATH).content_string
    assert "NCCL_" not in text
    argv = sm.exec_start_argv(host)
    assert sm.flag(argv, "--tp-size") == "2"
    assert "--disable-custom-all-reduce" not in argv


def test_report_records_the_nvlink_derivation(host):
    r = sm.report(HOST)
    assert r["result"] == "ok" and r["health"]["ok"] is True
    assert r["comm_profile"] == "nvlink-p2p"
    assert r["nccl_env"] == {} and r["comm_flags"] == {}
    assert r["server"]["gpus"] == [0, 1]
    assert not any(k.startswith("NCCL_") for k in r["environment"])


def test_running_engine_uses_both_gpus_without_nccl_settings(host):
    s = sm.serving(host)
    engine = s["engine"]
    assert engine is not None, s["processes"]
    assert sm.flag(engine["argv"], "--tp-size") == "2"
    assert "--disable-custom-all-reduce" not in engine["argv"]
    for proc in sm.unit_processes(host):  # engine, schedulers, detokenizer: none sees an NCCL variable
        assert not [k for k in proc["env"] if k.startswith("NCCL_")], proc["argv"]
    info = s["server_info"]
    assert sm.tp_size(info) == 2 and info["disable_custom_all_reduce"] is False
    apps = host.check_output("nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader").splitlines()
    assert len(apps) == 2 and len({a.split(",")[1].strip() for a in apps}) == 2  # one rank on each GPU
    for line in apps:
        pid = line.split(",")[0].strip()
        assert f"/system.slice/{sm.UNIT}" in host.file(f"/proc/{pid}/cgroup").content_string
    names = host.check_output("nvidia-smi --query-gpu=name --format=csv,noheader").splitlines()
    assert names == ["NVIDIA H200", "NVIDIA H200"]


def test_health_by_generation(host):
    assert sm.health(host) == "200"
    assert "Paris" in sm.ask(host, "What is the capital of France?")
