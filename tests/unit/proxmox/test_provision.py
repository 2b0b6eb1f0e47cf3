"""playbooks/provision.yml against the simulated Proxmox VE API (lab/pvesim) on loopback, over HTTPS.

One scenario (module scope, the runs are the expensive part; the first run is conftest's provisioned cluster, which
other scenarios start from too): provision 3 VMs; the configs match exactly; a second
run writes nothing; a changed GPU list stays pending without permission and is applied by stop/start only after the
drain hook; the experimental GPUDirect clique is reverted when the NCCL measurement does not prove it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster import PASSWORD, TOKEN_SECRET
from proxmox_runner import ROOT, Provisioned, simulated_cluster
from pvesim.server import PveSim

HERE = Path(__file__).parent
SSHKEYS = "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIGpufleetTestKey%20ops%40gpufleet"


def expected(
    vmid: int, name: str, node_numa: int, hostpci: dict, tags: str, mmio: int, clique=False, store="local-lvm"
) -> dict:
    args = f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={mmio}"
    if clique:
        args += "".join(f" -set device.hostpci{i}.x-nv-gpudirect-clique=1" for i in range(len(hostpci)))
    return {
        # from the template (clone_vm: new disk and cloud-init volumes on the clone's storage, new MAC, vmgenid,
        # smbios uuid)
        "ostype": "l26",
        "scsihw": "virtio-scsi-single",
        "boot": "order=scsi0",
        "serial0": "socket",
        "vga": "serial0",
        "scsi0": f"{store}:vm-{vmid}-disk-0,iothread=1,size=64G",
        "ide2": f"{store}:vm-{vmid}-cloudinit,media=cdrom",
        "net0": "virtio=BC:24:11:00:00:%02X,bridge=vmbr0" % vmid,  # noqa: UP031
        "vmgenid": "00000000-0000-4000-8000-%012x" % vmid,  # noqa: UP031
        "smbios1": "uuid=00000000-0000-4000-9000-%012x" % vmid,  # noqa: UP031
        # written by the role
        "name": name,
        "cores": "16",
        "sockets": "1",
        "memory": "131072",
        "cpu": "host",
        "machine": "q35",
        "bios": "ovmf",
        "balloon": "0",
        "agent": "1",
        "ciuser": "gpufleet",
        "sshkeys": SSHKEYS,
        "ipconfig0": "ip=dhcp",
        "tags": tags,
        "hugepages": "1024",
        "keephugepages": "1",
        "numa": "1",
        "numa0": f"cpus=0-15,hostnodes={node_numa},memory=131072,policy=bind",
        "efidisk0": f"{store}:vm-{vmid}-disk-1,format=raw,efitype=4m,pre-enrolled-keys=False,size=4M",
        "args": args,
        **hostpci,
    }


def config_of(sim: PveSim, vmid: int) -> dict:
    return {k: str(v) for k, v in sim.vms[vmid]["config"].items()}


def start_stop_writes(writes: list[dict]) -> list[tuple[str, str]]:
    return [(w["path"].split("/")[4], w["path"].rsplit("/", 1)[1]) for w in writes if "/status/" in w["path"]]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, provisioned: Provisioned):
    tmp = tmp_path_factory.mktemp("provision")
    # the first run (conftest's provisioned: the cluster's first provision.yml, -v, gpu-a1 with the clique)
    out = {"first": provisioned.run, "first_reports": provisioned.reports}
    out["first_configs"] = {v: config_of(provisioned.sim, v) for v in (201, 202, 203)}
    out["first_status"] = {v: provisioned.sim.vms[v]["status"] for v in (201, 202, 203)}
    with simulated_cluster(tmp, provisioned) as (server, r):
        n = len(server.sim.writes)
        out["second"] = r.run()
        out["second_writes"] = server.sim.writes[n:]
        out["second_reports"] = {h: json.loads((r.reports / f"{h}.json").read_text()) for h in r.hosts()}
        # the GPU list of gpu-a2 changes: a second GPU
        r.hosts()["gpu-a2"]["proxmox_gpu_vm_gpus"].append({"bus": "0000:a2:00.0"})
        n = len(server.sim.writes)
        out["third"] = r.run("playbooks/provision.yml", "-e", "proxmox_gpu_vm_snapshot_before_change=true")
        out["third_writes"] = server.sim.writes[n:]
        out["third_pending"] = [
            p["key"]
            for p in server.sim.handle(
                "GET",
                "/nodes/pve1/qemu/202/pending",
                {},
                {"Authorization": f"PVEAPIToken=root@pam!gpufleet={TOKEN_SECRET}"},
            )
            if "pending" in p
        ]
        out["third_report"] = json.loads((r.reports / "gpu-a2.json").read_text())
        drain_log = tmp / "drain.log"
        n = len(server.sim.writes)
        hook = f"proxmox_gpu_vm_drain_tasks={HERE / 'drain_hook.yml'}"
        with_drain = ("-e", "proxmox_gpu_vm_apply_pending=true", "-e", hook, "-e", f"drain_log={drain_log}")
        out["fourth"] = r.run("playbooks/provision.yml", *with_drain)
        out["fourth_writes"] = server.sim.writes[n:]
        out["drain_log"] = drain_log.read_text() if drain_log.exists() else ""
        out["fourth_configs"] = {v: config_of(server.sim, v) for v in (201, 202, 203)}
        # the clique of gpu-a1 is judged by a real NCCL capture (H200 VM) against a baseline it does not beat
        n = len(server.sim.writes)
        out["clique"] = r.run(
            str(HERE / "verify_clique.yml"),
            "-l",
            "gpu-a1",
            *with_drain,
            "-e",
            "proxmox_gpu_vm_clique_baseline_busbw_gbps=300",
            "-e",
            f"nccl_file={ROOT / 'tests/unit/fixtures/h200-device/nccl-allreduce.json'}",
        )
        out["clique_writes"] = server.sim.writes[n:]
        out["clique_config"] = config_of(server.sim, 201)
        out["clique_report"] = json.loads((r.reports / "gpu-a1.json").read_text())
        out["exchanges"] = list(server.sim.exchanges)
    return out


def _ok(p) -> None:
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_three_vms_are_created_with_exactly_the_wanted_config(scenario):
    _ok(scenario["first"])
    tags = "gpu-rtx-pro-6000;gpufleet;model-"
    assert scenario["first_configs"] == {
        201: expected(
            201,
            "gpu-a1",
            0,
            {"hostpci0": "0000:81:00.0,pcie=1", "hostpci1": "0000:82:00.0,pcie=1"},
            tags + "glm5",
            524288,
            clique=True,
        ),
        202: expected(202, "gpu-a2", 1, {"hostpci0": "0000:a1:00.0,pcie=1"}, tags + "qwen3", 262144),
        203: expected(
            203,
            "gpu-b1",
            1,
            {"hostpci0": "mapping=rtxpro-b0,pcie=1", "hostpci1": "mapping=rtxpro-b1,pcie=1"},
            tags + "glm5",
            524288,
            store="ceph-vm",
        ),
    }
    assert scenario["first_status"] == {201: "running", 202: "running", 203: "running"}
    assert "changed=0" not in scenario["first"].stdout.split("PLAY RECAP")[1].splitlines()[1]


def test_second_run_changes_nothing(scenario):
    _ok(scenario["second"])
    recap = scenario["second"].stdout.split("PLAY RECAP")[1]
    for host in ("gpu-a1", "gpu-a2", "gpu-b1"):
        assert f"{host}" in recap and "changed=0" in next(line for line in recap.splitlines() if line.startswith(host))
    assert scenario["second_writes"] == []
    assert scenario["second_reports"] == scenario["first_reports"]


def test_changed_gpu_list_stays_pending_without_permission(scenario):
    _ok(scenario["third"])
    writes = scenario["third_writes"]
    # a snapshot (without RAM) of the changed VM only, before the change
    assert [(w["endpoint"], w["path"]) for w in writes] == [
        ("POST /nodes/{node}/qemu/{vmid}/snapshot", "/nodes/pve1/qemu/202/snapshot"),
        ("PUT /nodes/{node}/qemu/{vmid}/config", "/nodes/pve1/qemu/202/config"),
    ]
    assert writes[0]["params"]["vmstate"] == "0" and writes[0]["params"]["snapname"].startswith("gpufleet-")
    assert writes[1]["params"]["hostpci1"] == "0000:a2:00.0,pcie=1"
    assert start_stop_writes(writes) == []
    # the second GPU also doubles the OVMF MMIO window (args): both wait for a full stop and start
    assert scenario["third_pending"] == ["args", "hostpci1"]
    assert scenario["third_report"]["pending"] == ["args", "hostpci1"]
    assert "proxmox_gpu_vm_apply_pending" in scenario["third"].stdout


def test_pending_change_applied_by_stop_start_only_after_the_drain(scenario):
    _ok(scenario["fourth"])
    writes = scenario["fourth_writes"]
    assert start_stop_writes(writes) == [("202", "shutdown"), ("202", "start")]
    drained = [line.split() for line in scenario["drain_log"].splitlines()]
    assert [d[0] for d in drained] == ["gpu-a2"]
    stop = next(w for w in writes if w["path"].endswith("/shutdown"))
    assert int(drained[0][1]) < stop["t_ns"]
    assert scenario["fourth_configs"][202]["hostpci1"] == "0000:a2:00.0,pcie=1"


def test_unproven_clique_is_reverted_and_the_report_says_why(scenario):
    _ok(scenario["clique"])
    assert "x-nv-gpudirect-clique" not in scenario["clique_config"]["args"]
    assert scenario["clique_config"]["args"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288"
    assert start_stop_writes(scenario["clique_writes"]) == [("201", "shutdown"), ("201", "start")]
    clique = scenario["clique_report"]["gpudirect_clique"]
    assert clique["requested"] is True and clique["kept"] is False
    assert "below 360.0 GB/s (baseline 300" in clique["reason"]


def test_no_secret_in_output_or_reports(scenario):
    for key in ("first", "second", "third", "fourth", "clique"):
        text = scenario[key].stdout + scenario[key].stderr
        assert PASSWORD not in text and TOKEN_SECRET not in text
    for report in scenario["first_reports"].values():
        assert PASSWORD not in json.dumps(report)
