"""`make proxmox-demo`'s core (tools/proxmox_demo.py run_demo): the provisioning example
(inventory/examples/proxmox/provision.yml) provisioned by playbooks/provision.yml on a fresh pvesim, then the
inventory read back with the example inventory plugin config, with one set of environment variables for both."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml
from proxmox_runner import ROOT

spec = importlib.util.spec_from_file_location("proxmox_demo", ROOT / "tools/proxmox_demo.py")
proxmox_demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(proxmox_demo)


PASSWORD = "demo-pw-must-never-show-91c2"


def test_the_demo_provisions_two_gpu_vms_and_reads_them_back_in_the_production_groups(tmp_path: Path, monkeypatch):
    # the password is generated per run; fixed here so that every output can be searched for it
    monkeypatch.setattr(proxmox_demo.secrets, "token_urlsafe", lambda n: PASSWORD)
    said: list[str] = []
    out = proxmox_demo.run_demo(tmp_path, say=said.append)
    text = "\n".join(said)
    assert out["provision_rc"] == 0, out["provision_stdout"][-4000:] + out["provision_stderr"][-2000:]
    assert out["inventory_rc"] == 0, out["inventory_stderr"]
    # two clones, their configuration, their starts: nothing else written
    assert sorted(out["writes"]) == sorted(
        ["POST /nodes/{node}/qemu/{vmid}/clone /nodes/pve1/qemu/9000/clone"] * 2
        + [f"PUT /nodes/{{node}}/qemu/{{vmid}}/config /nodes/pve1/qemu/{v}/config" for v in (9101, 9102)] * 2
        + [f"POST /nodes/{{node}}/qemu/{{vmid}}/status/start /nodes/pve1/qemu/{v}/status/start" for v in (9101, 9102)]
    )
    assert out["vms"][9101]["hostpci"] == ["0000:81:00.0,pcie=1", "0000:82:00.0,pcie=1"]
    assert out["vms"][9102]["status"] == "running" and "hostnodes=1" in out["vms"][9102]["numa0"]
    assert out["reports"] == ["rtxpro-01.json", "rtxpro-02.json"]
    # the groups the production example has (inventory/examples/production-fleet), from the VMs' tags
    production = yaml.safe_load((ROOT / "inventory/examples/production-fleet/hosts.yml").read_text())
    servers = production["all"]["children"]["sglang_servers"]["children"]
    assert "rtx_pro_6000" in servers and "glm5" in servers
    for group in ("sglang_servers", "rtx_pro_6000", "glm5"):
        assert out["groups"][group] == ["rtxpro-01", "rtxpro-02"], out["groups"]
    # ansible_host from the guest agent (the two starts run in parallel: which VM got which address varies)
    agent = {vm["name"]: vm["agent_ip"] for vm in out["vms"].values()}
    assert out["ansible_host"] == agent and sorted(agent.values()) == ["192.0.2.11", "192.0.2.12"]
    # what the user sees, and no secret anywhere
    assert f"rtxpro-01: ansible_host {agent['rtxpro-01']} (guest agent)" in text
    assert "PROXMOX_PASSWORD=(generated, not shown)" in text and "pvesim stopped." in text
    for blob in (text, out["provision_stdout"], out["provision_stderr"], out["graph"], out["inventory_stderr"]):
        assert PASSWORD not in blob
    for report in (tmp_path / "reports").glob("*.json"):
        assert PASSWORD not in report.read_text()
