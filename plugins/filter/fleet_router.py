"""Filters of fleet_router: the workers' URLs from inventory and smg's extra flags."""

from __future__ import annotations


def fleet_worker_url(host: str, hostvars, port) -> str:
    hv = hostvars[host]
    address = hv.get("fleet_router_worker_address") or hv.get("ansible_host") or host
    return f"http://{address}:{port}"


def multinode_nodes(host: str, group, groups) -> list:
    """The nodes of the server ``host`` belongs to, rank 0 first: the inventory group ``group`` (the host's
    sglang_server_multinode_group) in inventory order, else the host alone (docs/multinode.md).
    playbooks/vars/fleet.yml derives sglang_server_nodes with it; the router and rollout filters, which see
    other hosts through hostvars, call it with their sglang_server_multinode_group."""
    groups = groups or {}
    return list(groups[group]) if group and group in groups else [host]


def _nodes_of(host: str, hostvars, groups) -> list:
    return multinode_nodes(host, hostvars[host].get("sglang_server_multinode_group"), groups)


def fleet_worker_urls(hosts: list, hostvars, port, groups=None, registered_only: bool = True) -> dict:
    """{host: URL} of the hosts that serve HTTP: a non-zero rank of a multi-node server (SGLang serves HTTP on
    rank 0 only) is left out, and, with registered_only, a host with fleet_router_register: false (the monitor
    watches it all the same) or a quarantined one (fleet_remediation's fact fleet_remediation_quarantine, read by
    its quarantine_state entry point: a GPU fault a person fixes; docs/runbook.md)."""
    held_out = fleet_quarantined(hosts, hostvars)
    return {
        h: fleet_worker_url(h, hostvars, port)
        for h in hosts
        if (not registered_only or (hostvars[h].get("fleet_router_register", True) and h not in held_out))
        and _nodes_of(h, hostvars, groups)[0] == h
    }


def fleet_quarantined(hosts: list, hostvars) -> dict:
    """{host: quarantine record} of the ``hosts`` whose fleet_remediation quarantine record was read in this run
    (entry point quarantine_state, fact fleet_remediation_quarantine) and says they are quarantined."""
    return {h: hostvars[h]["fleet_remediation_quarantine"] for h in hosts
            if hostvars[h].get("fleet_remediation_quarantine")}  # fmt: skip


def fleet_shared_addresses(hosts: list, hostvars) -> dict:
    """{address: [hosts]} of the addresses (ansible_host, else the inventory name) that more than one of ``hosts``
    has: gpufleet runs one server per host, and two server hosts on one machine share its GPUs, port and unit."""
    by_address: dict = {}
    for host in hosts:
        address = str(hostvars[host].get("ansible_host") or host).strip().lower()
        by_address.setdefault(address, []).append(host)
    return {address: names for address, names in by_address.items() if len(names) > 1}


def smg_extra_argv(extra: dict) -> list[str]:
    """{flag: value} -> argv: true = a bare --flag, false/None = left out, a list = the flag with several values."""
    argv: list[str] = []
    for flag, value in (extra or {}).items():
        if value is None or value is False:
            continue
        argv.append("--" + str(flag).lstrip("-"))
        if value is True:
            continue
        if isinstance(value, list):
            argv.extend(str(v) for v in value)
        else:
            argv.append(str(value))
    return argv


class FilterModule:
    def filters(self):
        return {
            "fleet_worker_urls": fleet_worker_urls,
            "fleet_quarantined": fleet_quarantined,
            "fleet_shared_addresses": fleet_shared_addresses,
            "smg_extra_argv": smg_extra_argv,
            "sglang_multinode_nodes": multinode_nodes,
        }
