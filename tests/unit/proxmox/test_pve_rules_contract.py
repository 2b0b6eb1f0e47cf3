"""The role's checks and the simulated Proxmox VE agree: for each rule family, the role refuses a case before any
write, and the writes the role would make for it are refused by pvesim as Proxmox VE refuses them (so neither side
can drop a rule unnoticed: without pvesim's rule or without the role's check, a case here fails).

In-process and without Ansible: the role's filters (proxmox_gpu_vm, proxmox_gpu_vm_pve_rules) over what
proxmox_gpu_vm_info's read_cluster reads from pvesim, and the clone / config / start calls of tasks/vm.yml.
"""

from __future__ import annotations

import copy

import pytest
from ansible_collections.gpufleet.fleet.plugins.filter import proxmox_gpu_vm as pgv
from ansible_collections.gpufleet.fleet.plugins.filter import proxmox_gpu_vm_pve_rules as rules
from cluster import PASSWORD, TOKEN_ID, TOKEN_SECRET, cluster
from proxmox_gpu_vm_info import read_cluster
from pvesim.server import ApiError, PveSim

ROOT_AUTH, TOKEN_AUTH = "root@pam password", f"API token {TOKEN_ID}"


class SimApi:
    """proxmoxer's attribute/call path building over PveSim.handle (GET only: what read_cluster uses)."""

    def __init__(self, sim: PveSim, headers: dict, path: str = ""):
        self.sim, self.headers, self.path = sim, headers, path

    def __getattr__(self, name: str) -> SimApi:
        return SimApi(self.sim, self.headers, f"{self.path}/{name}")

    def __call__(self, *parts) -> SimApi:
        return SimApi(self.sim, self.headers, self.path + "".join(f"/{p}" for p in parts))

    def get(self, **params):
        return self.sim.handle("GET", self.path, {k: str(v) for k, v in params.items()}, self.headers)


def headers(sim: PveSim, auth: str) -> dict:
    if auth == TOKEN_AUTH:
        return {"Authorization": f"PVEAPIToken={TOKEN_ID}={TOKEN_SECRET}"}
    t = sim.handle("POST", "/access/ticket", {"username": "root@pam", "password": PASSWORD}, {})
    return {"Cookie": f"PVEAuthCookie={t['ticket']}", "CSRFPreventionToken": t["CSRFPreventionToken"]}


def spec(**kw) -> dict:
    """A VM spec as tasks/spec.yml builds it (gpu-a1 of the test inventory)."""
    s = {
        "name": "gpu-a1",
        "node": "pve1",
        "vmid": 201,
        "template": "debian12-cloud",
        "template_node": "pve1",
        "storage": "local-lvm",
        "cores": 16,
        "sockets": 1,
        "memory": 131072,
        "cpu": "host",
        "machine": "q35",
        "bios": "ovmf",
        "hugepages": "1024",
        "numa_node": 0,
        "gpus": [{"bus": "0000:81:00.0"}],
        "mmio64_mb": 262144,
        "clique": False,
        "clique_id": 1,
        "ciuser": "gpufleet",
        "sshkeys": "",
        "ipconfig0": "ip=dhcp",
        "tags": ["gpufleet", "gpu-rtx-pro-6000"],
        "auth": ROOT_AUTH,
    }
    return s | kw


def role_problems(sim: PveSim, s: dict) -> list[str]:
    api = SimApi(sim, headers(sim, s["auth"]))
    nodes = sorted({s["node"], s["template_node"]})
    c = read_cluster(api, nodes, [s["vmid"]], [s["template"]], False)
    static = pgv.static_problems([s]) + rules.pve_static_problems([s])
    return static + pgv.cluster_problems([s], c, "gpufleet") + rules.pve_cluster_problems([s], c)


def provision(sim: PveSim, s: dict) -> str:
    """What tasks/vm.yml writes for a new VM: clone, the wanted configuration, start; "OK" or the start task's log.
    Raises ApiError when pvesim refuses a call."""
    h = headers(sim, s["auth"])
    tmpl = next(v for v in sim.vms.values() if v["template"] and v["config"]["name"] == s["template"])
    clone = {"newid": s["vmid"], "name": s["name"], "full": 1, "storage": s["storage"]}
    if s["node"] != s["template_node"]:
        clone["target"] = s["node"]
    sim.handle("POST", f"/nodes/{s['template_node']}/qemu/{tmpl['vmid']}/clone", _str(clone), h)
    conf = pgv.desired_config(s) | {"efidisk0": f"{s['storage']}:1,efitype=4m,pre-enrolled-keys=0"}
    sim.handle("PUT", f"/nodes/{s['node']}/qemu/{s['vmid']}/config", _str(conf), h)
    upid = sim.handle("POST", f"/nodes/{s['node']}/qemu/{s['vmid']}/status/start", {}, h)
    task = sim.tasks[upid]
    return "OK" if task["exitstatus"] == "OK" else " / ".join(task["log"])


def _str(d: dict) -> dict:
    return {k: str(v) for k, v in d.items()}


def refused_by_pve(sim: PveSim, s: dict) -> str:
    """pvesim's refusal of the role's writes (an API error or a failed start task); '' if all went through."""
    try:
        status = provision(sim, s)
    except ApiError as e:
        return f"{e.code} {e.message} {e.errors or ''}".strip()
    return "" if status == "OK" else status


def set_group(sim: PveSim, node: str, bus: str, group: int) -> None:
    next(d for d in sim.nodes[node]["pci"] if d["id"] == bus)["iommugroup"] = group


def role_refuses_case(case: tuple, sim: PveSim, setup_gets_sim: bool = False) -> tuple[PveSim, dict, str]:
    """A case (setup, what the role says, what pvesim says) on sim: asserts that one of the role's problems with the
    spec that setup() makes (setup(sim) with setup_gets_sim) says what the role says, before any write. Returns sim,
    the spec and what pvesim says."""
    setup, role_says, pve_says = case
    s = setup(sim) if setup_gets_sim else setup()
    problems = role_problems(sim, s)
    assert any(role_says in p for p in problems), problems
    assert sim.writes == []  # the role's checks only read
    return sim, s, pve_says


def case_sim(**changes) -> PveSim:
    c = copy.deepcopy(cluster())
    c.update(changes)
    return PveSim(c)


def test_a_valid_vm_passes_both():
    sim = case_sim()
    s = spec()
    assert role_problems(sim, s) == []
    assert refused_by_pve(sim, s) == ""


CASES = {
    "token raw bus id": (
        lambda sim: spec(auth=TOKEN_AUTH, mmio64_mb=0, hugepages="", numa_node=0),
        "proxmox_gpu_vm_gpus[0].bus",
        "only root can set 'hostpci0' config for non-mapped devices",
    ),
    "token args": (
        lambda sim: spec(auth=TOKEN_AUTH, gpus=[], hugepages=""),
        "proxmox_gpu_vm_mmio64_mb",
        "only root can set 'args' config",
    ),
    "token hugepages": (
        lambda sim: spec(auth=TOKEN_AUTH, gpus=[], mmio64_mb=0),
        "proxmox_gpu_vm_hugepages '1024' (\"only root can set 'hugepages' config\"",
        "only root can set 'hugepages' config",
    ),
    "hugepages without NUMA": (
        lambda sim: spec(numa_node=None, gpus=[], mmio64_mb=0),  # a VM with GPUs: test_vm_settings.py
        "needs NUMA, but proxmox_gpu_vm_numa_node is not set",
        "numa needs to be enabled to use hugepages",
    ),
    "no IOMMU": (
        lambda sim: [set_group(sim, "pve1", b, -1) for b in ("0000:81:00.0", "0000:81:00.1")] and spec(),
        "has no IOMMU group (iommugroup -1)",
        "cannot prepare PCI pass-through, IOMMU not present",
    ),
    "GPU of a running VM outside the play": (
        lambda sim: (
            sim.vms.__setitem__(
                160, sim._new_vm(160, "pve1", {"name": "train01", "hostpci0": "0000:81:00.0"}, "running")
            )
            or spec()
        ),
        "is also given to VM 160 'train01' (running",
        "PCI device '0000:81:00.0' already in use by VMID '160'",
    ),
    "clone to another node from local storage": (
        lambda sim: (
            sim.vms[9000]["config"].update(scsi0="local-lvm:base-9000-disk-0,size=64G")
            or spec(node="pve2", vmid=203, gpus=[{"mapping": "rtxpro-b0"}], storage="ceph-vm")
        ),
        "the template's disks are on local-lvm, not shared",
        "can't clone VM to node 'pve2' (VM uses local storage)",
    ),
    "clone to another node onto local storage": (
        lambda sim: spec(node="pve2", vmid=203, gpus=[{"mapping": "rtxpro-b0"}], storage="local-lvm"),
        "proxmox_gpu_vm_storage 'local-lvm' is not a shared storage of pve1",
        "can't clone to non-shared storage 'local-lvm'",
    ),
    "the same GPU twice in one VM (bus ids)": (
        lambda sim: spec(gpus=[{"bus": "0000:81:00.0"}, {"bus": "0000:82:00.0"}, {"bus": "0000:81:00"}]),
        "gpu-a1: proxmox_gpu_vm_gpus[0] and proxmox_gpu_vm_gpus[2] name the same device 0000:81:00.0: Proxmox VE "
        "refuses the start (\"device '0000:81:00.0' assigned more than once\"); list each GPU once",
        "TASK ERROR: device '0000:81:00.0' assigned more than once",
    ),
    "the same GPU twice in one VM (a mapping and its bus id)": (
        lambda sim: spec(node="pve2", vmid=203, storage="ceph-vm", gpus=[{"mapping": "rtxpro-b0"}, {"bus": "c1:00.0"}]),
        "gpu-a1: proxmox_gpu_vm_gpus[0] and proxmox_gpu_vm_gpus[1] name the same device 0000:c1:00.0 on pve2",
        "TASK ERROR: device '0000:c1:00.0' assigned more than once",
    ),
    "name with '_'": (
        lambda sim: spec(name="gpu_a1"),
        "proxmox_gpu_vm_name 'gpu_a1' is not a DNS name",
        "value does not look like a valid DNS name",
    ),
    "tag with '/'": (
        lambda sim: spec(tags=["gpufleet", "team/infra"]),
        "tag 'team/infra'",
        "invalid characters in tag",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_role_and_pvesim_refuse_the_same_case(case):
    sim, s, pve_says = role_refuses_case(CASES[case], case_sim(), setup_gets_sim=True)
    assert pve_says in refused_by_pve(sim, s)


def test_a_gpu_sharing_its_group_with_the_hosts_nic_is_refused_as_pvesim_would_take_the_nic():
    """Proxmox VE does not refuse this one: its start binds the whole IOMMU group to vfio-pci (qemu-server
    prepare_pci_device, pve-common pci_dev_group_bind_to_vfio) and the node loses its NIC. The role refuses it and
    says so; the writes it would make go through in pvesim, which unbinds the NIC from mlx5_core."""
    sim = case_sim()
    set_group(sim, "pve1", "0000:01:00.0", 40)
    says = (
        "gpu-a1: proxmox_gpu_vm_gpus[0] (0000:81:00.0 on pve1) shares IOMMU group 40 with 0000:01:00.0 (class "
        "0x020000, Mellanox Technologies), which the VM does not get: Proxmox VE binds every device of the group to "
        "vfio-pci when the VM starts"
    )
    _, s, _ = role_refuses_case((spec, says, None), sim)
    assert any("so the node would lose 0000:01:00.0 (its host driver is unbound" in p for p in role_problems(sim, s))
    assert sim.nodes["pve1"]["drivers"]["0000:01:00.0"] == "mlx5_core"
    assert refused_by_pve(sim, s) == ""  # started ...
    assert sim.nodes["pve1"]["drivers"]["0000:01:00.0"] == "vfio-pci"  # ... with the node's NIC taken from it


def test_an_offline_node_is_called_offline():
    """GET /nodes lists a member that is down with status offline: the VM on it is refused as such (it used to say
    'not a node of the cluster'), and so is a clone from a template node that is offline."""
    sim = case_sim()
    sim.nodes["pve2"]["status"] = "offline"
    problems = role_problems(sim, spec(node="pve2", vmid=203, gpus=[{"mapping": "rtxpro-b0"}], storage="ceph-vm"))
    assert any(
        p.startswith("gpu-a1: proxmox_gpu_vm_node 'pve2' is a node of the cluster but offline (GET /nodes)")
        and "bring pve2 back online" in p
        for p in problems
    ), problems
    assert not any("not a node of the cluster" in p for p in problems)
    sim.nodes["pve2"]["status"] = "online"
    sim.nodes["pve1"]["status"] = "offline"  # the template's node
    problems = role_problems(sim, spec(node="pve2", vmid=203, gpus=[{"mapping": "rtxpro-b0"}], storage="ceph-vm"))
    assert any("proxmox_gpu_vm_template_node 'pve1' is offline (GET /nodes)" in p for p in problems), problems
    problems = role_problems(sim, spec(node="pve7"))
    assert any(
        "proxmox_gpu_vm_node 'pve7' is not a node of the cluster (GET /nodes: pve1 offline, pve2 online)" in p
        for p in problems
    ), problems
    assert sim.writes == []
