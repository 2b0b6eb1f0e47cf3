"""Bridge, veth, network namespace and NAT plumbing for lab hosts (iproute2 + iptables)."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path

from gpufleet_lab.sysutil import LabError, run

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
IP_FORWARD_SAVED = Path(os.environ.get("GPUFLEET_LAB_STATE", "/var/lib/gpufleet-lab")) / "ip_forward.before"
NETWORK_LOCK = IP_FORWARD_SAVED.with_name("network.lock")


@contextlib.contextmanager
def network_lock() -> Iterator[None]:
    """Hold the machine-wide lab network lock (an flock on /var/lib/gpufleet-lab/network.lock).

    Labs come up in parallel (one per Molecule scenario): picking a free subnet and putting its gateway
    on the new bridge must be one step, or two labs can pick the same /24 before either bridge routes it.
    The lock also covers the saved ip_forward setting that the first lab writes and the last one restores.
    The kernel drops an flock when its holder dies, so a killed `up` never leaves it held.
    """
    NETWORK_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(NETWORK_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _routes() -> list[dict]:
    return json.loads(run(["ip", "-j", "route", "show", "table", "all"]).stdout or "[]")


def _conflicting_route(subnet: ipaddress.IPv4Network, own_bridge: str) -> dict | None:
    """The first route (not on our own bridge) whose destination overlaps subnet."""
    for route in _routes():
        dst = route.get("dst")
        if not dst or dst == "default" or route.get("dev") == own_bridge:
            continue
        try:
            other = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if other.version == 4 and other.prefixlen > 0 and other.overlaps(subnet):
            return route
    return None


def subnet_is_free(subnet: ipaddress.IPv4Network, own_bridge: str) -> bool:
    return _conflicting_route(subnet, own_bridge) is None


def check_subnet_free(subnet: ipaddress.IPv4Network, own_bridge: str) -> None:
    route = _conflicting_route(subnet, own_bridge)
    if route is not None:
        raise LabError(
            f"subnet {subnet} is taken: {route['dst']} is routed via {route.get('dev')}. "
            "Choose another with --subnet (make lab-up SUBNET=...)"
        )


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", name], check=False).returncode == 0


def ensure_bridge(bridge: str, gateway_cidr: str) -> bool:
    """Create the lab bridge with the gateway address; True when anything changed."""
    changed = False
    if not link_exists(bridge):
        run(["ip", "link", "add", bridge, "type", "bridge"])
        changed = True
    addrs = json.loads(run(["ip", "-j", "addr", "show", "dev", bridge]).stdout)
    have = {f"{a['local']}/{a['prefixlen']}" for i in addrs for a in i.get("addr_info", []) if a["family"] == "inet"}
    if gateway_cidr not in have:
        run(["ip", "addr", "add", gateway_cidr, "dev", bridge])
        changed = True
    if "UP" not in addrs[0].get("flags", []):
        run(["ip", "link", "set", bridge, "up"])
        changed = True
    return changed


def _rule_lines(table: str, comment: str) -> list[str]:
    out = run(["iptables", "-t", table, "-S"]).stdout.splitlines()
    return [line for line in out if f'--comment "{comment}"' in line or f"--comment {comment}" in line]


def ensure_nat(subnet: str, bridge: str, comment: str) -> bool:
    """Masquerade the lab subnet and allow forwarding for it; True when anything changed."""
    changed = False
    if IP_FORWARD.read_text().strip() != "1":
        if not IP_FORWARD_SAVED.exists():
            IP_FORWARD_SAVED.parent.mkdir(parents=True, exist_ok=True)
            IP_FORWARD_SAVED.write_text(IP_FORWARD.read_text())
        IP_FORWARD.write_text("1\n")
        changed = True
    wanted = [
        ("nat", ["POSTROUTING", "-s", subnet, "!", "-o", bridge, "-j", "MASQUERADE"]),
        ("filter", ["FORWARD", "-i", bridge, "-j", "ACCEPT"]),
        (
            "filter",
            ["FORWARD", "-o", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
        ),
    ]
    for table, rule in wanted:
        spec = rule[1:] + ["-m", "comment", "--comment", comment]
        if run(["iptables", "-t", table, "-C", rule[0], *spec], check=False).returncode != 0:
            run(["iptables", "-t", table, "-I" if table == "filter" else "-A", rule[0], *spec])
            changed = True
    return changed


def delete_nat(comment: str) -> None:
    for table in ("nat", "filter"):
        for line in _rule_lines(table, comment):
            args = line.split()
            if args[0] != "-A":
                continue
            # iptables -S quotes comments with spaces; ours have none, so split() is exact.
            run(["iptables", "-t", table, "-D", *[a.strip('"') for a in args[1:]]], check=False)


def restore_ip_forward() -> None:
    if IP_FORWARD_SAVED.exists():
        IP_FORWARD.write_text(IP_FORWARD_SAVED.read_text())
        IP_FORWARD_SAVED.unlink()


def list_netns() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def create_host_link(netns: str, veth: str, bridge: str, address_cidr: str, gateway: str) -> None:
    """A network namespace with eth0 (address, default route) joined to the lab bridge by a veth pair."""
    if netns in list_netns():
        run(["ip", "netns", "del", netns])
    delete_link(veth)
    run(["ip", "netns", "add", netns])
    peer = f"{veth}p"[:15]
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
    run(["ip", "link", "set", peer, "netns", netns])
    run(["ip", "-n", netns, "link", "set", peer, "name", "eth0"])
    run(["ip", "-n", netns, "addr", "add", address_cidr, "dev", "eth0"])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])
    run(["ip", "-n", netns, "link", "set", "eth0", "up"])
    run(["ip", "-n", netns, "route", "add", "default", "via", gateway])
    run(["ip", "link", "set", veth, "master", bridge])
    run(["ip", "link", "set", veth, "up"])


def delete_link(name: str) -> None:
    if name and link_exists(name):
        run(["ip", "link", "del", name], check=False)


def delete_host_link(netns: str, veth: str) -> None:
    delete_link(veth)
    if netns in list_netns():
        run(["ip", "netns", "del", netns], check=False)
