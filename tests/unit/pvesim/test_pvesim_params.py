"""pvesim refuses the parameter values Proxmox VE refuses, with PVE's HTTP 400 shape and messages.

Each case is a value PVE's parameter verification (pve-common PVE::JSONSchema check_prop / parse_property_string,
formats of pve-common and qemu-server) refuses for PUT /nodes/{node}/qemu/{vmid}/config; the expected message is
PVE's own. Nothing of a refused request is written.
"""

from __future__ import annotations

import json

import pytest
import requests
import urllib3  # noqa: F401 (warning filter)
from pvesim.server import PveSimServer
from pvesim_cluster import ROOT_TOKEN, sim_of

CONFIG = "/nodes/pve1/qemu/100/config"
NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties"
NO_MATCH = "value does not match the regex pattern"


def fe(path: str, msg: str) -> str:
    """A property-string error as PVE words it (parse_property_string's "format error" with its errors)."""
    return f"invalid format - format error\n{path}: {msg}\n"


def bad_key(key: str) -> str:
    return f"invalid format - invalid key in comma-separated list property: {key}\n"


REFUSED = [
    ("hostpci0", "0000:81:00.0,pcie=2", fe("hostpci0.pcie", "type check ('boolean') failed - got '2'")),
    ("hostpci0", "0000:81:00.0,pcie=1,nvlink=1", bad_key("nvlink")),
    ("hostpci0", "0000:81:00.0,x-vga=yes,rombar=2", fe("hostpci0.rombar", "type check ('boolean') failed - got '2'")),
    ("hostpci0", "0000:81:00.0,mdev=a/b", fe("hostpci0.mdev", NO_MATCH)),
    ("hostpci0", "0000:81:00.0;bogus", fe("hostpci0.host", NO_MATCH)),
    ("hostpci0", "0000:81:00.0,vendor-id=10de", fe("hostpci0.vendor-id", NO_MATCH)),
    ("hostpci0", "mapping=1gpu", fe("hostpci0.mapping", "invalid format - invalid configuration ID '1gpu'\n")),
    (
        "numa0",
        "cpus=0-15,hostnodes=0,policy=strict",
        fe("numa0.policy", "value 'strict' does not have a value in the enumeration 'preferred, bind, interleave'"),
    ),
    ("numa0", "hostnodes=0,memory=1024", fe("numa0.cpus", "property is missing and it is not optional")),
    ("hugepages", "4", "value '4' does not have a value in the enumeration 'any, 2, 1024'"),
    ("machine", "q36", fe("machine.type", NO_MATCH)),
    ("tags", "gpufleet;model/glm5", "invalid format - invalid characters in tag\n"),
    ("name", "gpu_a1", "invalid format - value does not look like a valid DNS name\n"),
    ("memory", "8", fe("memory.current", "value must have a minimum value of 16")),
    ("cores", "abc", "type check ('integer') failed - got 'abc'"),
    ("cores", "0", "value must have a minimum value of 1"),
    ("numa", "yes", "type check ('boolean') failed - got 'yes'"),
    (
        "cpu",
        "skylake-ish",
        "invalid format - Built-in cputype 'skylake-ish' is not defined (missing 'custom-' prefix?)\n",
    ),
    (
        "ipconfig0",
        "ip=10.0.0.5",
        fe("ipconfig0.ip", "invalid format - value does not look like a valid ipv4 network configuration\n"),
    ),
    (
        "efidisk0",
        "local-lvm:1,efitype=8m",
        fe("efidisk0.efitype", "value '8m' does not have a value in the enumeration '2m, 4m'"),
    ),
    ("hostpci16", "0000:81:00.0", NOT_IN_SCHEMA),
    ("numa8", "cpus=0", NOT_IN_SCHEMA),
    ("sshkeys", "ssh-ed25519 AAAA", "invalid format - invalid urlencoded string: ssh-ed25519 AAAA\n"),
]


@pytest.mark.parametrize(("param", "value", "message"), REFUSED, ids=[f"{p}={v}" for p, v, _ in REFUSED])
def test_refused_like_pve(root, sim, param, value, message):
    before = json.dumps(sim.vms[100])
    e = root.error("PUT", CONFIG, **{param: value})
    assert (e.code, e.message, e.errors) == (400, "Parameter verification failed.\n", {param: message})
    assert json.dumps(sim.vms[100]) == before


def test_unknown_delete_entry_refused(root, sim):
    e = root.error("PUT", CONFIG, delete="cores,hostpci99")
    assert (e.code, e.errors) == (400, {"delete": "unknown option 'hostpci99'"})
    e = root.error("PUT", CONFIG, delete="cores", cores=4)
    assert e.errors == {"delete": "you can't use '-cores' and -delete cores' at the same time"}
    assert sim.vms[100]["config"]["cores"] == 4


def test_index_maxima_from_qemu_server(sim):
    imax = sim.schema.index_max
    assert (imax["hostpci"]["count"], imax["numa"]["count"]) == (16, 8)
    assert "PCI.pm" in imax["hostpci"]["source"] and "$MAX_NUMA" in imax["numa"]["source"]


def test_release_differences_come_from_the_schema():
    """hostpci `driver=` exists since qemu-server 9 (PCI.pm $hostpci_fmt): 8.4 refuses it, 9.1 takes it."""
    from pvesim_cluster import Client

    old, new = Client(sim_of("8.4.1")), Client(sim_of("9.1.2"))
    assert old.error("PUT", CONFIG, hostpci0="0000:81:00.0,driver=keep").errors == {"hostpci0": bad_key("driver")}
    assert new("PUT", CONFIG, hostpci0="0000:81:00.0,driver=keep") is None


def test_value_checks_accept_what_pve_accepts(root, sim):
    root(
        "PUT",
        CONFIG,
        name="gpu-a1",
        tags="gpufleet;model-glm5",
        memory="131072",
        hugepages="1024",
        machine="q35",
        numa=1,
        numa0="cpus=0-15,hostnodes=0,memory=131072,policy=bind",
        hostpci0="0000:81:00.0,pcie=1",
        hostpci15="mapping=rtx-b0,pcie=1",
        cpu="host",
        ipconfig0="ip=dhcp",
        sshkeys="ssh-ed25519%20AAAA",
        efidisk0="local-lvm:1,efitype=4m,pre-enrolled-keys=0",
    )
    assert sim.vms[100]["config"]["hostpci15"] == "mapping=rtx-b0,pcie=1"


def test_a_check_pvesim_does_not_simulate_is_refused_not_accepted(root):
    e = root.error("PUT", CONFIG, cpu="host,flags=+pcid")
    assert e.code == 501 and "does not simulate the value check of pve-vm-cpu-conf.flags" in e.message


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_error_shape_over_https(tmp_path):
    """pve-http-server Formatter/Standard.pm (json): {"data": null, "errors": {...}, "message": ...}, HTTP 400."""
    with PveSimServer(sim_of(), tmp_path) as server:
        s = requests.Session()
        s.verify, s.trust_env = False, False
        s.headers["Authorization"] = f"PVEAPIToken={ROOT_TOKEN[0]}={ROOT_TOKEN[1]}"
        r = s.put(f"https://127.0.0.1:{server.port}/api2/json{CONFIG}", data={"hugepages": "4", "cores": "abc"})
        assert (r.status_code, r.reason) == (400, "Parameter verification failed.")
        assert r.json() == {
            "data": None,
            "errors": {
                "hugepages": "value '4' does not have a value in the enumeration 'any, 2, 1024'",
                "cores": "type check ('integer') failed - got 'abc'",
            },
            "message": "Parameter verification failed.\n",
        }
        assert "simulated Proxmox VE API" in r.headers["Server"]
        assert server.sim.writes[-1]["params"] == {"hugepages": "4", "cores": "abc"}  # it reached the API
