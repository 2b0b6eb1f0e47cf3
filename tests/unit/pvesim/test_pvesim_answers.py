"""Every pvesim answer matches the release's return schema (apidata.js): required fields, types, no field the
schema does not list (so a consumer relying on an undocumented field fails here first)."""

from __future__ import annotations

import pytest
import requests
import urllib3  # noqa: F401 (warning filter)
from pvesim.endpoints import SERVED_ENDPOINTS
from pvesim.schema import Schema
from pvesim.server import PveSimServer
from pvesim_cluster import ROOT_PW, ROOT_TOKEN, sim_of


@pytest.mark.parametrize("release", ["8.4", "9.1"])
def test_answer_check_catches_toy_answers(release):
    schema = Schema(release)
    cfg = "GET /nodes/{node}/qemu/{vmid}/config"
    assert schema.answer_problems(cfg, {"cores": "16", "digest": "x"}) == [f"{cfg}: data.cores='16' is not integer"]
    assert schema.answer_problems(cfg, {"digest": "x", "hostpci15": "0000:81:00.0", "gpu": "x"}) == [
        f"{cfg}: data.gpu is not in the schema (unknown field)"
    ]
    assert schema.answer_problems(cfg, {"digest": "x", "hostpci16": "0000:81:00.0"}) == [
        f"{cfg}: data.hostpci16 is not in the schema (unknown field)"
    ]
    pending = "GET /nodes/{node}/qemu/{vmid}/pending"
    assert schema.answer_problems(pending, [{"value": "1"}]) == [f"{pending}: data[0].key missing"]
    nodes = "GET /nodes"  # `type` is not in the schema but PVE returns it (schema.py UNDOCUMENTED_FIELDS)
    assert schema.answer_problems(nodes, [{"node": "pve1", "status": "online", "type": "node", "gpu": 1}]) == [
        f"{nodes}: data[0].gpu is not in the schema (unknown field)"
    ]


def test_cluster_resources_type_node_returns_nodes_only(root):
    assert {r["type"] for r in root("GET", "/cluster/resources", type="node")} == {"node"}
    assert {r["type"] for r in root("GET", "/cluster/resources", type="vm")} == {"qemu"}


@pytest.mark.parametrize("version", ["8.4.1", "9.1.2"])
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_every_simulator_answer_matches_the_schema(version, tmp_path):
    """Drive every served endpoint over HTTPS (token and ticket auth) and check each answer."""
    sim = sim_of(version)
    with PveSimServer(sim, tmp_path) as server:
        base = f"https://127.0.0.1:{server.port}/api2/json"
        s, pw = requests.Session(), requests.Session()
        for sess in (s, pw):
            sess.verify, sess.trust_env = False, False  # else REQUESTS_CA_BUNDLE overrides verify=False
        s.headers["Authorization"] = f"PVEAPIToken={ROOT_TOKEN[0]}={ROOT_TOKEN[1]}"
        t = s.post(f"{base}/access/ticket", data={"username": "root@pam", "password": ROOT_PW}).json()["data"]
        pw.cookies.set("PVEAuthCookie", t["ticket"])
        pw.headers["CSRFPreventionToken"] = t["CSRFPreventionToken"]
        upid = s.post(f"{base}/nodes/pve1/qemu/9001/clone", data={"newid": 401, "name": "x", "full": 1}).json()["data"]
        for path in (
            "/version",
            "/nodes",
            "/pools",
            "/cluster/resources?type=vm",
            "/cluster/resources",
            "/cluster/mapping/pci",
            "/access/permissions?path=/vms/401",
            "/nodes/pve1/hardware/pci",
            "/nodes/pve1/storage",
            "/nodes/pve1/qemu",
            "/nodes/pve1/lxc",
            "/nodes/pve1/qemu/401/config",
            f"/nodes/pve1/tasks/{upid}/status",
            f"/nodes/pve1/tasks/{upid}/log",
        ):
            assert s.get(base + path).status_code == 200, path
        conf = {"hostpci0": "0000:81:00.0,pcie=1", "machine": "q35", "agent": "1", "efidisk0": "local-lvm:1,efitype=4m"}
        r = pw.put(f"{base}/nodes/pve1/qemu/401/config", data={"args": "-fw_cfg name=opt/ovmf/X,string=1", **conf})
        assert r.status_code == 200, r.text
        assert s.post(f"{base}/nodes/pve1/qemu/401/status/start").status_code == 200
        r = pw.put(f"{base}/nodes/pve1/qemu/401/config", data={"hostpci1": "0000:82:00.0,pcie=1", "delete": "agent"})
        assert r.status_code == 200, r.text
        s.post(f"{base}/nodes/pve1/qemu/401/snapshot", data={"snapname": "before", "vmstate": 0})
        for path in (
            "/nodes/pve1/qemu/401/pending",
            "/nodes/pve1/qemu/401/status/current",
            "/nodes/pve1/qemu/401/snapshot",
            "/nodes/pve1/qemu/401/agent/network-get-interfaces",
        ):
            assert s.get(base + path).status_code == 200, path
        for path in ("shutdown", "stop"):
            assert s.post(f"{base}/nodes/pve1/qemu/401/status/{path}").status_code == 200
    served = {e["endpoint"] for e in sim.exchanges}
    assert served == set(SERVED_ENDPOINTS)
    problems = [p for e in sim.exchanges for p in sim.schema.answer_problems(e["endpoint"], e["data"])]
    assert problems == []
