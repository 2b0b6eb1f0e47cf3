"""The engine lanes' locks: sglang-cu130 (CUDA 13.0, the newest sglang) and sglang-cu128-0.5.10 (the CUDA
12.8 lane's last step), each pinning its engine and saying its CUDA version, whose driver floor the cuda_toolkit
role's table holds. tests/unit/ml_env/test_ml_env_locks.py checks every lock is complete and hashed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpufleet.fleet.plugins.filter.cuda_toolkit import driver_problem as cuda_toolkit_driver_problem
from ansible_collections.gpufleet.fleet.plugins.filter.ml_env_filters import parse_lock

REPO = Path(__file__).resolve().parents[3]
LOCKS = REPO / "locks"
FLOORS = yaml.safe_load((REPO / "roles/cuda_toolkit/vars/driver_floors.yml").read_text())["cuda_toolkit_driver_floors"]
SERVING = ["sglang-cu128", "sglang-cu128-0.5.10", "sglang-cu130"]
sys.path.insert(0, str(LOCKS))
import update_locks  # noqa: E402  (locks/update_locks.py)


def pins(name: str) -> dict:
    return parse_lock((LOCKS / name / "requirements.txt").read_text())["packages"]


def meta(name: str) -> dict:
    return yaml.safe_load((LOCKS / name / "lock.yml").read_text())


def test_the_cuda_13_lane_pins_the_newest_sglang_with_its_own_torch_kernel_and_flashinfer():
    p = pins("sglang-cu130")
    assert (p["sglang"], p["torch"], p["sglang-kernel"]) == ("0.5.23", "2.14.1", "0.4.10")
    assert p["flashinfer-python"] == "0.7.2"
    assert p["nvidia-cuda-runtime"].startswith("13.0.") and "nvidia-cuda-runtime-cu12" not in p
    m = meta("sglang-cu130")
    # sglang >= 0.5.11 ships manylinux_2_34 wheels only: a manylinux_2_28 resolution finds no sglang
    assert (m["python_version"], m["python_platform"], m["cuda_version"]) == ("3.12", "x86_64-manylinux_2_34", "13.0")


def test_the_cuda_12_step_pins_the_last_sglang_with_cuda_12_dependencies():
    p = pins("sglang-cu128-0.5.10")
    assert (p["sglang"], p["torch"], p["sglang-kernel"]) == ("0.5.10.post1", "2.9.1", "0.4.1")
    assert p["flashinfer-python"] == p["flashinfer-cubin"] == "0.6.7.post3"
    assert p["nvidia-cuda-runtime-cu12"].startswith("12.8.")
    assert meta("sglang-cu128-0.5.10")["cuda_version"] == "12.8"
    assert "libnuma1" in meta("sglang-cu128-0.5.10")["system_packages"]  # sglang-kernel 0.4.1 links libnuma.so.1


@pytest.mark.parametrize("name", SERVING)
def test_each_serving_lane_says_its_cuda_version_and_the_floor_table_holds_it(name):
    cuda = meta(name)["cuda_version"]
    assert cuda in FLOORS, f"{name}: CUDA {cuda} has no driver floor in roles/cuda_toolkit/vars/driver_floors.yml"
    runtime = pins(name).get("nvidia-cuda-runtime-cu12") or pins(name)["nvidia-cuda-runtime"]
    assert runtime.startswith(cuda + "."), f"{name}: lock.yml says CUDA {cuda}, the lock pins the runtime {runtime}"


def test_the_cuda_13_floor_is_the_580_driver_and_refuses_a_570_host():
    """What a host of the CUDA 13 lane sees: the 570 driver of the CUDA 12.8 fleet is refused, naming the floor."""
    assert FLOORS["13.0"] == "580.65.06"
    problem = cuda_toolkit_driver_problem("570.172.08", "13.0", FLOORS)
    assert "570.172.08" in problem and "580.65.06" in problem and "13.0" in problem
    assert cuda_toolkit_driver_problem("580.65.06", "13.0", FLOORS) == ""
    assert cuda_toolkit_driver_problem("570.172.08", meta("sglang-cu128-0.5.10")["cuda_version"], FLOORS) == ""


def test_a_lanes_production_wheelhouse_is_its_own_folder(tmp_path, monkeypatch):
    """wheelhouse-production --name sglang-cu130 without --dir fills wheelhouse-sglang-cu130, not the cu128 one."""
    seen = {}

    def fake(args):
        seen["dir"] = args.dir or str(update_locks.PROD_WHEELHOUSE_ROOT / f"wheelhouse-{args.name}")
        return 0

    monkeypatch.setattr(update_locks, "cmd_wheelhouse_production", fake)
    assert update_locks.main(["wheelhouse-production", "--name", "sglang-cu130"]) == 0
    assert seen["dir"] == "/var/cache/gpufleet-lab/wheelhouse-sglang-cu130"


@pytest.mark.parametrize("name", ["sglang-cu128-0.5.10", "sglang-cu130"])
def test_the_lane_locks_are_resolutions_uv_keeps(name, tmp_path):
    """uv re-resolves requirements.in from PyPI as of the lock's date, starting from the committed lock (see
    test_ml_env_locks.test_production_lock_is_a_resolution_uv_keeps): same pins, committed hashes on PyPI."""
    import shutil

    from test_ml_env_locks import require_pypi, uv

    require_pypi()
    lock, m = LOCKS / name, meta(name)
    out = tmp_path / "requirements.txt"
    shutil.copyfile(lock / "requirements.txt", out)
    proc = uv(
        "pip", "compile", str(lock / "requirements.in"), "--generate-hashes", "--quiet", "--no-header",
        "--python-version", m["python_version"], "--python-platform", m["python_platform"],
        "--index-url", m["index_url"], "--exclude-newer", str(m["exclude_newer"]), "-o", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh, committed = parse_lock(out.read_text()), parse_lock((lock / "requirements.txt").read_text())
    assert fresh["packages"] == committed["packages"]
    for pkg, hashes in committed["hashes"].items():
        assert set(hashes) <= set(fresh["hashes"][pkg]), f"{pkg}: a committed hash is not on the registry"


def test_a_lock_changed_in_the_same_process_is_read_again(tmp_path):
    """engine_lane keeps its answer per lock for the references of one run, but a changed lock.yml (or a new lock
    folder) is read again, never answered from before."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_flag_migration import engine_lane

    lock = tmp_path / "lab-x"
    lock.mkdir()
    (lock / "lock.yml").write_text('engine_version: "0.5.9"\n')
    assert engine_lane("lab-x", tmp_path)["engine_version"] == "0.5.9"
    (lock / "lock.yml").write_text('engine_version: "0.5.23"\ncuda_version: "13.0"\n')
    assert engine_lane("lab-x", tmp_path)["engine_version"] == "0.5.23"
    assert "names no lock folder" in engine_lane("lab-y", tmp_path)["problem"]
    (tmp_path / "lab-y").mkdir()
    (tmp_path / "lab-y" / "lock.yml").write_text('engine_version: "0.5.9"\n')
    assert engine_lane("lab-y", tmp_path)["problem"] == ""
