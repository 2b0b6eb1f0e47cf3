"""Filters of fleet_monitor: the scrape targets of the fleet, from the inventory."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter.fleet_router import fleet_worker_urls
from ansible_collections.gpufleet.fleet.plugins.filter.rollout import rollout_worker_models
from ansible_collections.gpufleet.fleet.plugins.filter.serving_bench import gpu_class


def _address(host: str, hostvars) -> str:
    return str(hostvars[host].get("ansible_host") or host)


def fleet_monitor_targets(
    groups: dict,
    hostvars,
    server_group: str = "sglang_servers",
    router_group: str = "fleet_routers",
    monitor_group: str = "fleet_monitors",
) -> dict:
    """What the monitor scrapes, from the inventory: ``servers`` (the engine's /metrics of every server that serves
    HTTP: rank 0 of a multi-node server), ``routers`` (smg's Prometheus port), ``nodes`` (node-exporter on every
    host of the three groups, each once). Labels: the inventory name of the host and, for a server, its GPU class
    ('<GPU name> x<count>' from its GPU facts, or its serving_bench_gpu_class), the key of the latency thresholds,
    and its model as the rollout counts it (rollout_model, else the served-model-name), the key of the worker counts."""
    servers = list(groups.get(server_group) or [])
    routers = list(groups.get(router_group) or [])
    monitors = list(groups.get(monitor_group) or [])
    out: dict = {"servers": [], "routers": [], "nodes": []}
    # every server that serves HTTP is scraped, also one kept out of the router (fleet_router_register: false)
    urls = fleet_worker_urls(servers, hostvars, 0, groups, registered_only=False)
    in_router = fleet_worker_urls(servers, hostvars, 0, groups)
    models = rollout_worker_models(list(urls), hostvars)  # the model the rollout's disruption budget counts by
    for host, url in urls.items():
        hv = hostvars[host]
        try:
            cls = gpu_class((hv.get("ansible_facts") or {}).get("gpu_facts"), hv.get("serving_bench_gpu_class", ""))
        except AnsibleFilterError as exc:
            raise AnsibleFilterError(f"fleet_monitor: {host}: {exc}") from exc
        out["servers"].append(
            {
                "host": host,
                "address": url.removeprefix("http://").rsplit(":", 1)[0],
                # the port the router's worker URL uses (fleet_router_worker_port: the common flags' port)
                "port": int((hv.get("sglang_server_args_common") or {}).get("port", 8000)),
                "gpu_class": cls,
                "model": models[host],
                "in_router": host in in_router,
            }
        )
    for host in routers:
        hv = hostvars[host]
        out["routers"].append(
            {
                "host": host,
                "address": _address(host, hostvars),
                "port": int(hv.get("fleet_router_prometheus_port", 29000)),
            }
        )
    seen: set = set()
    for role, hosts in (("server", servers), ("router", routers), ("monitor", monitors)):
        for host in hosts:
            if host in seen:
                continue
            seen.add(host)
            hv = hostvars[host]
            listen = hv.get("node_exporter_listen_host") or _address(host, hostvars)
            if listen in ("0.0.0.0", "::", "[::]"):
                listen = _address(host, hostvars)
            out["nodes"].append(
                {"host": host, "address": listen, "port": int(hv.get("node_exporter_port", 9100)), "role": role}
            )
    return out


class FilterModule:
    def filters(self):
        return {"fleet_monitor_targets": fleet_monitor_targets}
