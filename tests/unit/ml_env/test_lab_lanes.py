"""The lab's engine lanes (locks/lab-sim, locks/lab-sim-cu130): the lab inventory (inventory/lab/group_vars, lab
equipment only) wires the simulator's engine version and the CUDA toolkit from the host's lane, and the driver floor
of the lane's CUDA holds against the lab's simulated drivers (lab/gpusim profiles)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpufleet.fleet.plugins.filter import cuda_toolkit as cuda_filters
from role_flags import render  # tests/support

REPO = Path(__file__).resolve().parents[3]
FLOORS = yaml.safe_load((REPO / "roles/cuda_toolkit/vars/driver_floors.yml").read_text())["cuda_toolkit_driver_floors"]
EXPR = (
    "{{ {'engine': sglang_server_environment.SGLANG_SIM_ENGINE_VERSION, 'cuda': cuda_toolkit_version,"
    " 'method': cuda_toolkit_method, 'lane': gpufleet_lab_lane.lock} }}"
)


def profile_driver(name: str) -> str:
    return json.loads((REPO / "lab/gpusim/profiles" / name / "profile.json").read_text())["driver_version"]


@pytest.mark.parametrize(
    ("lock", "expected"),
    [(None, {"engine": "0.5.9", "cuda": "12.8", "method": "apt", "lane": "lab-sim"}),
     ("lab-sim-cu130", {"engine": "0.5.23", "cuda": "13.0", "method": "wheels", "lane": "lab-sim-cu130"})],
)  # fmt: skip
def test_the_lab_inventory_takes_the_engine_version_and_cuda_from_the_hosts_lane(tmp_path, lock, expected):
    (tmp_path / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"gpufleet_lab": {"hosts": {"lab-01": {"ansible_connection": "local"}}}}}})
    )
    (tmp_path / "group_vars").symlink_to(REPO / "inventory/lab/group_vars")
    extra = {"ml_env_lock": lock} if lock else {}
    assert render(tmp_path / "hosts.yml", "lab-01", EXPR, extra, tmp_path) == expected


def test_the_cuda_13_lane_needs_a_580_driver_which_the_h200_profiles_have_and_the_rtx_pro_capture_lacks():
    lane_cuda = yaml.safe_load((REPO / "locks/lab-sim-cu130/lock.yml").read_text())["cuda_version"]
    assert FLOORS[lane_cuda] == "580.65.06"
    for name in ("h200x1-vm", "h200x2-vm"):
        assert cuda_filters.driver_problem(profile_driver(name), lane_cuda, FLOORS) == ""
    problem = cuda_filters.driver_problem(profile_driver("rtx-pro-6000x8-vm"), lane_cuda, FLOORS)
    assert problem.startswith("NVIDIA driver 570.172.08 is older than 580.65.06, the minimum for CUDA 13.0: upgrade")
    # the lab-sim lane (CUDA 12.8) runs on every profile with a driver but old-driver's
    assert cuda_filters.driver_problem(profile_driver("rtx-pro-6000x8-vm"), "12.8", FLOORS) == ""
