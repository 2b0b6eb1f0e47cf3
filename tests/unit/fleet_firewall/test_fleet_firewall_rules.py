"""Who may reach each host's scraped ports (filter fleet_firewall_rules, over the monitor's targets): a server's port
answers the gateways, the monitors, the controller and its listed clients; node-exporter's and smg's metrics ports
the monitors and the controller only; a bad address is refused naming host and variable; the controller is the
address the host sees it come from (its route source)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter.fleet_firewall import fleet_firewall_rules, route_source
from ansible_collections.gpufleet.fleet.plugins.filter.fleet_monitor import fleet_monitor_targets

RTX = {"gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}] * 8}
GROUPS = {"sglang_servers": ["gpu-01", "gpu-02"], "fleet_routers": ["gw-01"], "fleet_monitors": ["gw-01"]}


def hostvars(**extra) -> dict:
    ctl = "fleet_firewall_controller"
    hv = {
        "gpu-01": {"ansible_host": "10.0.0.11", "ansible_facts": {"gpu_facts": RTX}, ctl: "10.0.0.1",
                   "fleet_firewall_clients": ["192.0.2.0/24", "2001:db8::7"]},
        "gpu-02": {"ansible_host": "10.0.0.12", "ansible_facts": {"gpu_facts": RTX}, ctl: ["10.0.0.1"],
                   "sglang_server_args_common": {"port": 8100}},
        "gw-01": {"ansible_host": "10.0.0.2", ctl: "10.0.0.1"},
    }  # fmt: skip
    for host, values in extra.items():
        hv[host].update(values)
    return hv


def rules(hv: dict) -> dict:
    return fleet_firewall_rules(fleet_monitor_targets(GROUPS, hv), GROUPS, hv)


def test_each_scraped_port_answers_only_who_should_reach_it():
    out = rules(hostvars())
    assert out["gpu-01"] == [
        {"name": "SGLang server (API and /metrics)", "port": 8000,
         "sources": ["10.0.0.1/32", "10.0.0.2/32", "192.0.2.0/24", "2001:db8::7/128"]},
        {"name": "node-exporter", "port": 9100, "sources": ["10.0.0.1/32", "10.0.0.2/32"]},
    ]  # fmt: skip
    # the other server is no client of this one; its own port is the common flags' port
    assert out["gpu-02"][0] == {"name": "SGLang server (API and /metrics)", "port": 8100,
                                "sources": ["10.0.0.1/32", "10.0.0.2/32"]}  # fmt: skip
    # the gateway: smg's metrics and node-exporter, for the monitor (itself here) and the controller; its API stays open
    assert out["gw-01"] == [
        {"name": "smg metrics", "port": 29000, "sources": ["10.0.0.1/32", "10.0.0.2/32"]},
        {"name": "node-exporter", "port": 9100, "sources": ["10.0.0.1/32", "10.0.0.2/32"]},
    ]


def test_a_host_with_the_firewall_off_gets_no_rules():
    assert rules(hostvars(**{"gpu-01": {"fleet_firewall_enabled": "false"}}))["gpu-01"] == []
    with pytest.raises(AnsibleFilterError, match="gpu-01: fleet_firewall_enabled='maybe' is not a boolean"):
        rules(hostvars(**{"gpu-01": {"fleet_firewall_enabled": "maybe"}}))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"fleet_firewall_clients": ["10.0.0.300/8"]},
            r"gpu-01: fleet_firewall_clients\[0\]='10.0.0.300/8' is not an address",
        ),
        ({"fleet_firewall_clients": "10.0.0.0/8"}, "gpu-01: fleet_firewall_clients must be a list"),
        ({"fleet_firewall_controller": ["ctl.example"]}, r"gpu-01: fleet_firewall_controller\[0\]='ctl.example'"),
        (
            {"fleet_firewall_controller": [], "ansible_host": "no-such-host.invalid"},
            "gpu-01: ansible_host 'no-such-host.invalid' does not resolve",
        ),
    ],
)
def test_bad_input_is_refused_naming_host_and_variable(values, message):
    with pytest.raises(AnsibleFilterError, match=message):
        rules(hostvars(**{"gpu-01": values}))


def test_a_monitor_named_by_a_name_that_does_not_resolve_is_refused():
    with pytest.raises(AnsibleFilterError, match="gw-01: ansible_host 'no-such-host.invalid' does not resolve"):
        rules(hostvars(**{"gw-01": {"ansible_host": "no-such-host.invalid"}}))


def test_the_controller_is_its_route_source_toward_the_host():
    """Without fleet_firewall_controller, the controller's address is the source its connections to the host carry:
    toward loopback that is loopback (a UDP connect sends nothing)."""
    hv = hostvars(**{"gpu-01": {"ansible_host": "127.0.0.1", "fleet_firewall_controller": []}})
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert "127.0.0.1/32" in rules(hv)["gpu-01"][0]["sources"]
