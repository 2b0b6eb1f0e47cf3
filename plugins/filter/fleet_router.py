"""Filters of fleet_router: the workers' URLs from inventory and smg's extra flags."""

from __future__ import annotations


def fleet_worker_url(host: str, hostvars, port) -> str:
    hv = hostvars[host]
    address = hv.get("fleet_router_worker_address") or hv.get("ansible_host") or host
    return f"http://{address}:{port}"


def fleet_worker_urls(hosts: list, hostvars, port) -> dict:
    """{host: URL} of the hosts that serve HTTP; a host with fleet_router_register: false (such as a non-zero
    rank of a multi-node server, which serves no HTTP in SGLang) is left out."""
    return {h: fleet_worker_url(h, hostvars, port) for h in hosts if hostvars[h].get("fleet_router_register", True)}


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
        return {"fleet_worker_urls": fleet_worker_urls, "smg_extra_argv": smg_extra_argv}
