"""Filters of fleet_firewall: who may reach each fleet host's scraped ports, from the inventory and the monitor's
targets (fleet_monitor_targets)."""

from __future__ import annotations

import ipaddress
import socket

from ansible.errors import AnsibleFilterError

# The inventory variables the rules read (on a host or its groups).
CLIENTS = "fleet_firewall_clients"
CONTROLLER = "fleet_firewall_controller"
ENABLED = "fleet_firewall_enabled"


def _network(value, where: str) -> str:
    try:
        return str(ipaddress.ip_network(str(value).strip(), strict=False))
    except ValueError:
        raise AnsibleFilterError(
            f"fleet_firewall: {where}={value!r} is not an address or a network: write one as 192.0.2.7, 10.0.0.0/8 "
            "or 2001:db8::/32"
        ) from None


def _addresses(host: str, hostvars) -> list[str]:
    """The host's address as the other hosts see it: its ansible_host (an address, or a name resolved here)."""
    name = str(hostvars[host].get("ansible_host") or host)
    try:
        return [str(ipaddress.ip_address(name))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise AnsibleFilterError(
            f"fleet_firewall: {host}: ansible_host {name!r} does not resolve on the controller ({exc}): the firewall "
            "allows addresses, so give the host an address or a name that resolves"
        ) from None
    return sorted({str(info[4][0]) for info in infos})


def route_source(address: str) -> str:
    """The controller's own address on its route to ``address`` (the source the host sees of the controller's
    connections): a UDP socket is connected, which sends nothing and only asks the kernel for the route."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        return str(sock.getsockname()[0])


def _controller(host: str, hostvars) -> list[str]:
    given = hostvars[host].get(CONTROLLER)
    if given not in (None, "", []):
        items = given if isinstance(given, list) else [given]
        return [_network(v, f"{host}: {CONTROLLER}[{i}]") for i, v in enumerate(items)]
    out = []
    for address in _addresses(host, hostvars):
        try:
            out.append(_network(route_source(address), f"{host}: the controller's route source"))
        except OSError as exc:
            raise AnsibleFilterError(
                f"fleet_firewall: {host}: no route from the controller to {address} ({exc}); set {CONTROLLER} to the "
                "address the host sees the controller come from"
            ) from None
    return out


def fleet_firewall_rules(targets: dict, groups: dict, hostvars, router_group: str = "fleet_routers",
                         monitor_group: str = "fleet_monitors") -> dict:  # fmt: skip
    """{host: [{name, port, sources}]}: each port the monitor scrapes on a host (``targets``, the output of
    fleet_monitor_targets) answers the monitors and the controller only; a server's port (its API and SGLang's
    /metrics, which asks for no key) also the gateways, which proxy the API, and the host's ``fleet_firewall_clients``.
    A host with ``fleet_firewall_enabled: false`` gets no rules. Sources are networks (an address is a /32 or /128),
    sorted, each once."""
    monitors = sorted({a for h in groups.get(monitor_group) or [] for a in _addresses(h, hostvars)})
    gateways = sorted({a for h in groups.get(router_group) or [] for a in _addresses(h, hostvars)})
    ports: dict[str, list] = {}
    for kind, name in (("servers", "SGLang server (API and /metrics)"), ("routers", "smg metrics"),
                       ("nodes", "node-exporter")):  # fmt: skip
        for target in targets.get(kind) or []:
            ports.setdefault(target["host"], []).append((name, int(target["port"]), kind == "servers"))
    out: dict = {}
    for host in sorted(ports):
        hv = hostvars[host]
        if not _bool(hv.get(ENABLED, True), f"{host}: {ENABLED}"):
            out[host] = []
            continue
        clients = hv.get(CLIENTS) or []
        if not isinstance(clients, list):
            raise AnsibleFilterError(f"fleet_firewall: {host}: {CLIENTS} must be a list of addresses or networks")
        clients = [_network(v, f"{host}: {CLIENTS}[{i}]") for i, v in enumerate(clients)]
        base = [_network(a, f"{host}: a monitor's address") for a in monitors] + _controller(host, hostvars)
        rules = []
        for name, port, serving in ports[host]:
            sources = base + (
                [_network(a, f"{host}: a gateway's address") for a in gateways] + clients if serving else []
            )
            rules.append({"name": name, "port": port, "sources": sorted(set(sources), key=_order)})
        out[host] = rules
    return out


def _bool(value, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise AnsibleFilterError(f"fleet_firewall: {where}={value!r} is not a boolean (true or false)")


def _order(network: str) -> tuple:
    net = ipaddress.ip_network(network)
    return (net.version, int(net.network_address), net.prefixlen)


class FilterModule:
    def filters(self):
        return {"fleet_firewall_rules": fleet_firewall_rules, "route_source": route_source}
