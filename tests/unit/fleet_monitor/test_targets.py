"""What the monitor scrapes comes from the inventory (filter fleet_monitor_targets): every server that serves HTTP
(rank 0 of a multi-node server), labelled with its inventory name and GPU class; every gateway's smg Prometheus
port; node-exporter once per host, on the address it listens on. A host removed from the inventory leaves the
targets. The critical floor of healthy workers is what the rollout's disruption budget leaves in."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter.fleet_monitor import fleet_monitor_targets
from ansible_collections.gpufleet.fleet.plugins.filter.rollout import rollout_min_in_router

H200 = {"gpus": [{"name": "NVIDIA H200"}] * 8}
RTX = {"gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}] * 8}


def hostvars() -> dict:
    return {
        "gpu-01": {"ansible_host": "10.0.0.11", "ansible_facts": {"gpu_facts": H200},
                   "sglang_server_args_common": {"port": 8100},
                   "sglang_server_args_model": {"served-model-name": "glm-5"}},
        "gpu-02": {"ansible_host": "10.0.0.12", "ansible_facts": {"gpu_facts": RTX}, "fleet_router_register": False},
        "gpu-03": {"ansible_host": "10.0.0.13", "ansible_facts": {"gpu_facts": H200},
                   "sglang_server_multinode_group": "pair", "rollout_model": "glm-5-big"},
        "gpu-04": {"ansible_host": "10.0.0.14", "ansible_facts": {"gpu_facts": H200},
                   "sglang_server_multinode_group": "pair"},
        "gw-01": {"ansible_host": "10.0.0.2", "fleet_router_prometheus_port": 29100},
        "mon-01": {"ansible_host": "10.0.0.3", "node_exporter_listen_host": "0.0.0.0", "node_exporter_port": 9200},
    }  # fmt: skip


GROUPS = {
    "sglang_servers": ["gpu-01", "gpu-02", "gpu-03", "gpu-04"],
    "pair": ["gpu-03", "gpu-04"],
    "fleet_routers": ["gw-01"],
    "fleet_monitors": ["gw-01", "mon-01"],
}


def test_targets_from_the_inventory():
    t = fleet_monitor_targets(GROUPS, hostvars())
    assert t["servers"] == [
        {"host": "gpu-01", "address": "10.0.0.11", "port": 8100, "gpu_class": "NVIDIA H200 x8", "model": "glm-5",
         "in_router": True},
        {"host": "gpu-02", "address": "10.0.0.12", "port": 8000,
         "gpu_class": "NVIDIA RTX PRO 6000 Blackwell Server Edition x8", "model": "default", "in_router": False},
        {"host": "gpu-03", "address": "10.0.0.13", "port": 8000, "gpu_class": "NVIDIA H200 x8",
         "model": "glm-5-big", "in_router": True},  # rank 0 only
    ]  # fmt: skip
    assert t["routers"] == [{"host": "gw-01", "address": "10.0.0.2", "port": 29100}]
    nodes = {n["host"]: (n["address"], n["port"], n["role"]) for n in t["nodes"]}
    assert nodes == {
        "gpu-01": ("10.0.0.11", 9100, "server"),
        "gpu-02": ("10.0.0.12", 9100, "server"),
        "gpu-03": ("10.0.0.13", 9100, "server"),
        "gpu-04": ("10.0.0.14", 9100, "server"),  # a non-zero rank has a node (and GPUs) to watch
        "gw-01": ("10.0.0.2", 9100, "router"),  # the gateway that is also a monitor: once
        "mon-01": ("10.0.0.3", 9200, "monitor"),  # listening everywhere: scraped on its own address
    }


def test_a_host_removed_from_the_inventory_leaves_the_targets():
    groups = dict(GROUPS, sglang_servers=["gpu-01", "gpu-03", "gpu-04"])
    t = fleet_monitor_targets(groups, hostvars())
    assert "gpu-02" not in [s["host"] for s in t["servers"]] + [n["host"] for n in t["nodes"]]


def test_a_server_without_gpu_facts_is_named():
    hv = hostvars()
    del hv["gpu-02"]["ansible_facts"]
    with pytest.raises(AnsibleFilterError, match="fleet_monitor: gpu-02: .*serving_bench_gpu_class"):
        fleet_monitor_targets(GROUPS, hv)
    hv["gpu-02"]["serving_bench_gpu_class"] = "rtx-pro"  # the inventory names the class
    assert fleet_monitor_targets(GROUPS, hv)["servers"][1]["gpu_class"] == "rtx-pro"


@pytest.mark.parametrize(
    ("total", "budget", "floor"), [(4, "50%", 2), (2, "50%", 1), (1, "50%", 1), (3, 1, 2), (5, "25%", 4), (0, 1, 0)]
)
def test_the_floor_of_healthy_workers_is_what_the_budget_leaves(total, budget, floor):
    assert rollout_min_in_router(total, budget) == floor
