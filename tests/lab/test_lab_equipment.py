"""Lab equipment on lab hosts: the simulated nvidia-smi and the simulated SGLang engine under systemd."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import simfleet
from conftest import ROOT, lab, lab_json
from lab_host import health, on

sys.path.insert(0, str(ROOT / "locks"))
import update_locks  # noqa: E402 - the simulator's wheel and its dependency's (PyYAML)

NAME = "t-equip"
CAPTURES = ROOT / "lab/gpusim/profiles/h200x2-vm/captures"
SEED_FLAGS = (
    "--model /models/GLM-5-NVFP4 --served-model-name glm-5 --reasoning-parser glm45 --tool-call-parser glm47 "
    "--trust-remote-code --tp 8 --mem-fraction-static 0.92 --max-running-requests 64 --kv-cache-dtype auto "
    "--quantization modelopt_fp4 --attention-backend flashinfer --fp8-gemm-backend cutlass "
    "--nsa-decode-backend trtllm --nsa-prefill-backend trtllm --moe-runner-backend flashinfer_cutlass "
    "--disable-custom-all-reduce --enable-flashinfer-allreduce-fusion --host 0.0.0.0 --port 8000"
)
UNIT = f"""[Unit]
Description=sglang-sim with the seed's launch (gpufleet lab equipment test)

[Service]
Environment=PYTHONPATH=/opt/sglang-sim SGLANG_SIM_LOAD_SECONDS=2 SGLANG_SIM_GRAPH_SECONDS=2
ExecStart=/usr/bin/python3 -m sglang_sim.launch_server {SEED_FLAGS}
KillMode=control-group
SuccessExitStatus=SIGKILL
TimeoutStopSec=60
"""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    result = lab_json("--name", NAME, "up", "--hosts", "2", "--profile", "rtx-pro-6000x8-vm,h200x2-vm")
    yield {h["profile"]: h for h in result["hosts"]}
    lab("--name", NAME, "down", check=False)


def test_nvidia_smi_on_a_lab_host_is_the_simulator_of_its_profile(hosts):
    seed = hosts["rtx-pro-6000x8-vm"]
    assert "gpufleet lab simulator" in on(seed, "nvidia-smi --version")
    gpus = on(seed, "nvidia-smi -L").splitlines()
    assert len(gpus) == 8
    assert all("NVIDIA RTX PRO 6000 Blackwell Server Edition" in line for line in gpus)
    caps = on(seed, "nvidia-smi --query-gpu=compute_cap,memory.total --format=csv,noheader,nounits").splitlines()
    assert set(caps) == {"12.0, 97887"}


def test_h200_profile_replays_the_real_captures_byte_for_byte(hosts):
    h200 = hosts["h200x2-vm"]
    assert on(h200, "nvidia-smi topo -m") == (CAPTURES / "topo-m.txt").read_text()
    assert on(h200, "nvidia-smi topo -mp") == (CAPTURES / "topo-mp.txt").read_text()


def _memory_used(host: dict) -> list[int]:
    out = on(host, "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
    return [int(v) for v in out.split()]


def test_engine_under_systemd_with_the_seed_flags(hosts, tmp_path):
    seed = hosts["rtx-pro-6000x8-vm"]
    root = Path(
        json.loads((Path("/var/lib/gpufleet-lab") / NAME / "state.json").read_text())["hosts"][seed["name"]]["root"]
    )
    (root / "root/sim-wheels").mkdir()
    for wheel in update_locks.sim_wheels(tmp_path):  # sglang-sim and PyYAML, unpacked side by side
        shutil.copyfile(wheel, root / "root/sim-wheels" / wheel.name)
    on(seed, "for w in /root/sim-wheels/*.whl; do python3 -m zipfile -e $w /opt/sglang-sim; done")
    assert on(seed, "PYTHONPATH=/opt/sglang-sim python3 -c 'import yaml; print(yaml.__file__)'").strip() == (
        "/opt/sglang-sim/yaml/__init__.py"
    )
    on(seed, simfleet.model_folder("/models/GLM-5-NVFP4"))  # the seed's --model: what the engine reads first
    on(seed, "cat > /etc/systemd/system/sglang-sim.service && systemctl daemon-reload", stdin=UNIT)
    assert _memory_used(seed) == [0] * 8

    on(seed, "systemctl start sglang-sim.service")
    seen, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        status = health(seed["address"])
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == 200:
            break
        time.sleep(0.2)
    journal = on(seed, "journalctl -u sglang-sim.service --no-pager")
    # 0.5.9: nothing listens while the model loads (uvicorn binds after it), then 503 during the warm-up, 200
    assert seen[0] == 0 and seen[-1] == 200, f"health went {seen}\n{journal}"
    assert "The server is fired up and ready to roll!" in journal
    used = _memory_used(seed)
    assert all(mib > 0.9 * 97000 * 0.92 for mib in used), used
    apps = on(seed, "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader").splitlines()
    assert len(apps) == 8 and all("sglang::scheduler_TP" in line for line in apps)

    on(seed, "systemctl stop sglang-sim.service")
    assert _memory_used(seed) == [0] * 8
    assert on(seed, "systemctl show -P Result sglang-sim.service").strip() == "success"
