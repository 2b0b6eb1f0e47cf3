"""VM settings admins expect: CPU affinity and one guest NUMA node per host socket of the GPUs,
keephugepages, hostpci rombar / x-vga / romfile, the MMIO window per GPU class, mapping pools, the start timeout.

What a user sees: the configuration pvesim stored after the role's writes (pvesim accepting it as Proxmox VE
would, the start included), and the role's refusal before any write, next to pvesim's refusal of the same writes
(in-process, as test_pve_rules_contract.py). One ansible-playbook run shows the settings written by the real
playbook and a second run writing nothing.
"""

from __future__ import annotations

import copy
import json

import pytest
import test_pve_rules_contract as contract
from ansible_collections.gpufleet.fleet.plugins.filter import proxmox_gpu_vm as pgv
from cluster import HOST_NUMA, TOKEN_ID, TOKEN_SECRET, cluster
from proxmox_runner import simulated_cluster
from pvesim.server import ApiError, PveSim

TOKEN_AUTH = contract.TOKEN_AUTH


def dual_socket(**kw) -> dict:
    """gpu-a1 with one GPU on each socket of pve1 (81:00 on NUMA node 0, a1:00 on node 1)."""
    base = {
        "cores": 16,
        "sockets": 2,
        "memory": 262144,
        "host_numa_cpus": HOST_NUMA,
        "cpu_affinity": True,
        "keephugepages": True,
        "gpus": [{"bus": "0000:81:00.0"}, {"bus": "0000:a1:00.0", "numa_node": 1}],
    }
    return contract.spec(**(base | kw))


def stored(sim: PveSim, vmid: int = 201) -> dict:
    return {k: str(v) for k, v in sim.vms[vmid]["config"].items()}


def token_put(sim: PveSim, **params) -> str:
    h = {"Authorization": f"PVEAPIToken={TOKEN_ID}={TOKEN_SECRET}"}
    try:
        sim.handle("PUT", "/nodes/pve2/qemu/150/config", {k: str(v) for k, v in params.items()}, h)
    except ApiError as e:
        return e.message
    return ""


# ---- NUMA per socket, affinity, keephugepages ---------------------------------------------------------------


def test_gpus_on_two_sockets_get_a_guest_numa_node_each_and_no_affinity_that_pins_nothing():
    sim = contract.case_sim()
    s = dual_socket()
    assert contract.role_problems(sim, s) == []
    assert contract.refused_by_pve(sim, s) == ""  # stored and started
    conf = stored(sim)
    assert conf["numa"] == "1"
    assert conf["numa0"] == "cpus=0-15,hostnodes=0,memory=131072,policy=bind"
    assert conf["numa1"] == "cpus=16-31,hostnodes=1,memory=131072,policy=bind"
    # both nodes' CPUs (0-31,64-95 + 32-63,96-127) are the whole host: taskset --all-tasks 0-127 pins nothing, and
    # PVE's one affinity for all of QEMU's threads cannot keep guest node 0's vCPUs on host node 0
    assert "affinity" not in conf
    assert conf["keephugepages"] == "1" and conf["hugepages"] == "1024"
    assert sim.vms[201]["status"] == "running"
    note = pgv.affinity_note(s)
    assert note.startswith("gpu-a1: the GPUs sit on host NUMA nodes 0, 1. Proxmox VE's affinity is one CPU set")
    assert "No affinity is set: the CPUs of nodes 0, 1 are every CPU of proxmox_gpu_vm_host_numa_cpus" in note
    assert "give each socket's GPUs a VM of their own" in note


def test_a_vm_on_two_of_four_host_nodes_is_kept_off_the_other_two_and_told_so():
    four = {0: "0-15", 1: "16-31", 2: "32-47", 3: "48-63"}  # e.g. two sockets of NPS2
    s = dual_socket(host_numa_cpus=four)
    assert pgv.desired_config(s)["affinity"] == "0-31"
    assert "affinity is 0-31, the CPUs of nodes 0, 1 together" in pgv.affinity_note(s)
    assert pgv.affinity_note(dual_socket(gpus=[{"bus": "0000:81:00.0"}])) == ""  # one node: pinned to it, no note


def test_gpus_on_one_socket_bind_and_pin_to_that_socket():
    sim = contract.case_sim()
    s = dual_socket(gpus=[{"bus": "0000:a1:00.0", "numa_node": 1}, {"bus": "0000:a2:00.0", "numa_node": 1}])
    assert contract.role_problems(sim, s) == [] and contract.refused_by_pve(sim, s) == ""
    conf = stored(sim)
    assert conf["numa0"] == "cpus=0-31,hostnodes=1,memory=262144,policy=bind" and "numa1" not in conf
    assert conf["affinity"] == "32-63,96-127"


def test_the_gpus_own_numa_nodes_are_enough_for_hugepages():
    sim = contract.case_sim()
    s = dual_socket(numa_node=None, gpus=[{"bus": "0000:a1:00.0", "numa_node": 1}])
    assert contract.role_problems(sim, s) == [] and contract.refused_by_pve(sim, s) == ""
    assert stored(sim)["numa0"] == "cpus=0-31,hostnodes=1,memory=262144,policy=bind"


def test_a_gpu_without_a_numa_node_is_refused_before_any_write():
    """The API does not say on which socket a GPU sits: a GPU VM that names no NUMA node is refused (the role's
    default used to be node 0, which bound the VM of a socket-1 GPU to socket 0 without a word)."""
    sim = contract.case_sim()
    s = contract.spec(numa_node=None, hugepages="", gpus=[{"bus": "0000:a1:00.0"}])
    problems = contract.role_problems(sim, s)
    assert any(
        "gpu-a1: no host NUMA node is known for proxmox_gpu_vm_gpus[0] (0000:a1:00.0) on pve1: "
        "proxmox_gpu_vm_numa_node is not set"
        in p
        and "set proxmox_gpu_vm_numa_node (all GPUs of the VM) or proxmox_gpu_vm_gpus[i].numa_node" in p
        and "cat /sys/bus/pci/devices/<bus id>/numa_node on pve1" in p
        for p in problems
    ), problems
    assert sim.writes == []
    # what the role would have written: Proxmox VE takes it, the VM unbound (nothing tells where the GPU is)
    assert contract.refused_by_pve(sim, s) == "" and "numa0" not in stored(sim)
    # one GPU with its own node and one without: the one without is named
    s = contract.spec(numa_node=None, gpus=[{"bus": "0000:a1:00.0", "numa_node": 1}, {"mapping": "rtxpro-b0"}])
    (p,) = [p for p in pgv.static_problems([s]) if "no host NUMA node" in p]
    assert "proxmox_gpu_vm_gpus[1] (mapping rtxpro-b0)" in p and "proxmox_gpu_vm_gpus[0]" not in p


def test_without_host_cpu_lists_only_memory_is_bound():
    s = contract.spec(host_numa_cpus={}, cpu_affinity=True)
    conf = pgv.desired_config(s)
    assert "affinity" not in conf and conf["numa0"].endswith("hostnodes=0,memory=131072,policy=bind")


def test_going_back_to_one_socket_deletes_numa1_and_affinity():
    two = pgv.desired_config(dual_socket())
    one = pgv.desired_config(dual_socket(gpus=[{"bus": "0000:81:00.0"}, {"bus": "0000:a1:00.0"}], host_numa_cpus={}))
    diff = pgv.config_diff(one, two | {"efidisk0": "x", "affinity": "0-127"}, "local-lvm")
    assert diff["delete"] == ["numa1", "affinity"]  # an affinity over the whole host (written before) goes too
    assert diff["set"] == {"numa0": "cpus=0-31,hostnodes=0,memory=262144,policy=bind"}
    params = pgv.kvm_params(pgv.desired_config(dual_socket()), pgv.config_diff(two, {}, "s"), "s")
    assert params["extra"] == {"keephugepages": 1}
    assert sorted(params["numa"]) == ["numa0", "numa1"]


ROLE_ONLY = {
    "sockets not a multiple of the GPUs' host nodes": (
        dual_socket(sockets=1, cores=32),
        "proxmox_gpu_vm_sockets is 1; set proxmox_gpu_vm_sockets to 2",
    ),
    "memory that does not split into 1 GiB pages per node": (
        dual_socket(memory=263168),
        "proxmox_gpu_vm_memory_mib 263168 must split into 2 equal guest NUMA nodes of whole 1024 MiB pages",
    ),
    "more vCPUs than the pinned host CPUs": (
        dual_socket(gpus=[{"bus": "0000:81:00.0"}], cores=40, host_numa_cpus={0: "0-31"}),
        "80 vCPUs (proxmox_gpu_vm_cores x proxmox_gpu_vm_sockets) would share the 32 host CPUs",
    ),
    "a CPU list that is none": (
        dual_socket(host_numa_cpus={0: "0-31", 1: "32-x"}),
        "proxmox_gpu_vm_host_numa_cpus[1] '32-x' is not a CPU list like 0-31,64-95",
    ),
    "a GPU numa_node that is no number": (
        dual_socket(gpus=[{"bus": "0000:81:00.0", "numa_node": "one"}]),
        "proxmox_gpu_vm_gpus[0].numa_node 'one' is not a host NUMA node number",
    ),
}


@pytest.mark.parametrize("case", sorted(ROLE_ONLY))
def test_role_refuses_a_numa_layout_before_any_write(case):
    s, says = ROLE_ONLY[case]
    sim = contract.case_sim()
    problems = contract.role_problems(sim, s)
    assert any(says in p for p in problems), problems
    assert sim.writes == []


BOTH = {
    "a host NUMA node the host lacks": (
        lambda: dual_socket(gpus=[{"bus": "0000:81:00.0", "numa_node": 2}]),
        "proxmox_gpu_vm_host_numa_cpus has no CPU list for host NUMA node 2",
        "host NUMA node2 doesn't exist",
    ),
    "affinity with a token": (
        lambda: dual_socket(auth=TOKEN_AUTH, hugepages="", mmio64_mb=0, gpus=[{"mapping": "pool-pve1"}]),
        "proxmox_gpu_vm_cpu_affinity (affinity 0-31,64-95 from proxmox_gpu_vm_host_numa_cpus",
        "only root can set 'affinity' config",
    ),
    "hostpci x-vga not a boolean": (
        lambda: contract.spec(gpus=[{"bus": "0000:81:00.0", "x_vga": 2}]),
        "proxmox_gpu_vm_gpus[0].x_vga must be true or false, got 2",
        "hostpci0.x-vga: type check ('boolean') failed - got '2'",
    ),
    "hostpci romfile with ';'": (
        lambda: contract.spec(gpus=[{"bus": "0000:81:00.0", "romfile": "a;b.rom"}]),
        "proxmox_gpu_vm_gpus[0].romfile 'a;b.rom' must be a file name in /usr/share/kvm/",
        "hostpci0.romfile: value does not match the regex pattern",
    ),
}


@pytest.mark.parametrize("case", sorted(BOTH))
def test_role_and_pvesim_refuse_the_same_setting(case):
    sim, s, pve_says = contract.role_refuses_case(BOTH[case], pool_sim())
    if "x_vga" in str(s["gpus"]):  # the role renders booleans as 0/1: show pvesim's refusal of the value itself
        s = s | {"gpus": [{"bus": "0000:81:00.0"}]}
        conf = pgv.desired_config(s) | {"hostpci0": "0000:81:00.0,pcie=1,x-vga=2"}
        with pytest.raises(ApiError) as e:
            sim.handle("PUT", "/nodes/pve2/qemu/150/config", contract._str(conf), contract.headers(sim, s["auth"]))
        assert pve_says in str(e.value.errors)
    else:
        assert pve_says in contract.refused_by_pve(sim, s)


def test_keephugepages_and_affinity_are_root_only_in_pvesim():
    sim = contract.case_sim()
    assert token_put(sim, keephugepages=1) == "only root can set 'keephugepages' config\n"
    assert token_put(sim, affinity="0-31") == "only root can set 'affinity' config\n"
    s = contract.spec(auth=TOKEN_AUTH, keephugepages=True)
    assert "proxmox_gpu_vm_keephugepages" in " ".join(contract.role_problems(sim, s))


# ---- hostpci rombar / x-vga / romfile ---------------------------------------------------------------------


def test_hostpci_options_are_stored_as_written():
    sim = contract.case_sim()
    gpus = [{"bus": "0000:81:00.0", "rombar": False, "x_vga": True, "romfile": "gb202-vbios.rom"}]
    s = contract.spec(gpus=gpus)
    assert contract.role_problems(sim, s) == [] and contract.refused_by_pve(sim, s) == ""
    assert stored(sim)["hostpci0"] == "0000:81:00.0,pcie=1,rombar=0,romfile=gb202-vbios.rom,x-vga=1"


def test_unknown_gpu_keys_and_paths_in_romfile_are_refused():
    s = contract.spec(gpus=[{"bus": "0000:81:00.0", "xvga": True, "romfile": "/usr/share/kvm/x.rom"}])
    problems = pgv.static_problems([s])
    assert any("proxmox_gpu_vm_gpus[0] has unknown key(s) xvga" in p for p in problems), problems
    assert any("romfile '/usr/share/kvm/x.rom' must be a file name" in p for p in problems), problems


# ---- the MMIO window per GPU class ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu_class", "bar", "eight"),
    [
        ("rtx-pro-6000", 128, 2097152),  # 96 GB
        ("h100", 128, 2097152),  # 80 GB
        ("h200", 256, 4194304),  # 141 GB: 128 GiB was too small
        ("b200", 256, 4194304),  # 192 GB
        ("b300", 512, 8388608),  # 288 GB
        ("l40s", 64, 1048576),  # 48 GB
    ],
)
def test_bar_and_window_follow_the_gpu_memory(gpu_class, bar, eight):
    assert pgv.bar_gib(gpu_class) == bar
    assert pgv.mmio64_mb(8, bar) == eight
    assert pgv.mmio64_mb(1, bar) == bar * 1024 * 2
    assert pgv.mmio64_mb(0, bar) == 0


def test_unknown_class_and_a_window_past_ovmf_are_refused():
    assert pgv.bar_gib("mi300x") is None and pgv.mmio64_mb(2, None) is None
    problems = pgv.static_problems([contract.spec(mmio64_mb=None, gpu_class="mi300x")])
    assert any("proxmox_gpu_vm_gpu_class 'mi300x' is not in the role's table" in p for p in problems), problems
    assert any("set proxmox_gpu_vm_gpu_bar_gib" in p for p in problems)
    problems = pgv.static_problems([contract.spec(mmio64_mb=2**25)])
    assert any("above the 16777216 MiB (16 TiB) OVMF accepts" in p for p in problems), problems


def test_the_window_is_args_which_only_root_may_set():
    sim = contract.case_sim()
    s = contract.spec(auth=TOKEN_AUTH, gpus=[{"mapping": "rtxpro-b0"}], node="pve2", hugepages="")
    assert any("proxmox_gpu_vm_mmio64_mb (QEMU args" in p for p in contract.role_problems(sim, s))
    assert token_put(sim, args="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144") == (
        "only root can set 'args' config\n"
    )
    s = s | {"mmio64_mb": 0}
    assert "args" not in pgv.desired_config(s)


# ---- mapping pools ----------------------------------------------------------------------------------------


def pool_sim() -> PveSim:
    c = copy.deepcopy(cluster())
    c["mappings"].append(
        {
            "id": "pool-pve1",
            "description": "pve1 GPUs 81 and 82 (a pool: one entry per GPU)",
            "map": [
                "node=pve1,path=0000:81:00.0,id=10de:2bb1,iommugroup=40",
                "node=pve1,path=0000:82:00.0,id=10de:2bb1,iommugroup=41",
            ],
        }
    )
    c["tokens"] = {TOKEN_ID: {"secret": TOKEN_SECRET, "privsep": 0}}
    return PveSim(c)


def test_a_pool_gives_each_hostpci_the_first_free_device():
    sim = pool_sim()
    s = contract.spec(gpus=[{"mapping": "pool-pve1"}, {"mapping": "pool-pve1"}])
    assert contract.role_problems(sim, s) == []
    assert contract.refused_by_pve(sim, s) == ""
    assert stored(sim)["hostpci0"] == stored(sim)["hostpci1"] == "mapping=pool-pve1,pcie=1"
    assert sim.vms[201]["pci_chosen"] == ["0000:81:00.0", "0000:82:00.0"]


def test_a_second_vm_gets_the_device_the_first_left():
    sim = pool_sim()
    assert contract.refused_by_pve(sim, contract.spec(gpus=[{"mapping": "pool-pve1"}])) == ""
    s = contract.spec(name="gpu-a2", vmid=202, gpus=[{"mapping": "pool-pve1"}])
    assert contract.role_problems(sim, s) == []  # VM 201 runs with 81:00.0: 82:00.0 is free
    assert contract.refused_by_pve(sim, s) == ""
    assert sim.vms[202]["pci_chosen"] == ["0000:82:00.0"]


def test_an_exhausted_pool_is_refused_by_both():
    sim = pool_sim()
    s = contract.spec(gpus=[{"mapping": "pool-pve1"}] * 3)
    problems = contract.role_problems(sim, s)
    assert any(
        "proxmox_gpu_vm_gpus[2].mapping 'pool-pve1' is a pool of 2 device(s) on pve1 and none is left for it" in p
        for p in problems
    ), problems
    assert sim.writes == []
    assert contract.refused_by_pve(sim, s) == "TASK ERROR: could not find a free device for 'hostpci2'"


def test_a_pool_shared_by_two_vms_of_the_play_is_counted():
    sim = pool_sim()
    a = contract.spec(gpus=[{"mapping": "pool-pve1"}, {"mapping": "pool-pve1"}])
    b = contract.spec(name="gpu-a2", vmid=202, gpus=[{"mapping": "pool-pve1"}])
    api = contract.SimApi(sim, contract.headers(sim, a["auth"]))
    c = contract.read_cluster(api, ["pve1"], [201, 202], ["debian12-cloud"], False)
    problems = contract.rules.pve_cluster_problems([a, b], c)
    assert any("gpu-a2: proxmox_gpu_vm_gpus[0].mapping 'pool-pve1' is a pool of 2" in p for p in problems), problems
    assert not any(p.startswith("gpu-a1") for p in problems)


# ---- start timeout ----------------------------------------------------------------------------------------


def test_start_timeout_is_qemu_servers_config_aware_timeout_plus_a_margin():
    # QemuServer/Helpers.pm config_aware_timeout: memory GiB above 30 GiB, x4 with hostpci, >= 150 with hugepages,
    # +5 s per NIC. 256 GiB with GPUs: 1029 s (a start that failed at 328 s had 300 s).
    assert pgv.start_timeout({"memory": "262144", "hostpci0": "x", "net0": "virtio"}, margin=0) == 1029
    assert pgv.start_timeout({"memory": "16384", "hugepages": "1024"}, margin=0) == 150
    assert pgv.start_timeout({"memory": "16384"}, margin=0) == 30
    assert pgv.start_timeout({"memory": "131072", "hostpci0": "x"}) == 128 * 4 + 60


# ---- the real playbook ------------------------------------------------------------------------------------


def test_playbook_writes_the_settings_and_a_second_run_writes_nothing(tmp_path):
    with simulated_cluster(tmp_path) as (server, r):
        h = r.hosts()["gpu-a1"]
        h.update(
            proxmox_gpu_vm_sockets=2,
            proxmox_gpu_vm_cores=8,
            proxmox_gpu_vm_host_numa_cpus=HOST_NUMA,
            proxmox_gpu_vm_gpus=[
                {"bus": "0000:81:00.0", "rombar": False},
                {"bus": "0000:a1:00.0", "numa_node": 1, "romfile": "gb202.rom"},
            ],
        )
        first = r.run("playbooks/provision.yml", "-l", "gpu-a1")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
        conf = stored(server.sim)
        assert conf["numa0"] == "cpus=0-7,hostnodes=0,memory=65536,policy=bind"
        assert conf["numa1"] == "cpus=8-15,hostnodes=1,memory=65536,policy=bind"
        assert "affinity" not in conf and conf["keephugepages"] == "1"  # both sockets: a set that pins nothing
        assert "affinity is one CPU set for all of QEMU" in " ".join(first.stdout.split())  # the run says why
        report = json.loads((r.reports / "gpu-a1.json").read_text())
        assert "No affinity is set: the CPUs of nodes 0, 1" in report["affinity_note"]
        assert conf["hostpci0"] == "0000:81:00.0,pcie=1,rombar=0"
        assert conf["hostpci1"] == "0000:a1:00.0,pcie=1,romfile=gb202.rom"
        assert conf["args"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288"  # 2 x 128 GiB x 2
        assert server.sim.vms[201]["status"] == "running"
        n = len(server.sim.writes)
        second = r.run("playbooks/provision.yml", "-l", "gpu-a1")
        assert second.returncode == 0, second.stdout[-3000:]
        assert [w for w in server.sim.writes[n:] if "/config" in w["path"]] == [], json.dumps(server.sim.writes[n:])


# ---- pvesim's own rules for these settings (Proxmox VE's messages) ------------------------------------------

PVE_SAYS = {
    "affinity that is no CPU set": ({"affinity": "0-3,x"}, "invalid format - unable to parse cpuset option"),
    "affinity range backwards": ({"affinity": "5-2"}, "invalid format - unable to parse cpuset option"),
    "keephugepages not 0/1": ({"keephugepages": "yes"}, "type check ('boolean') failed - got 'yes'"),
}
START_SAYS = {
    "NUMA memory not the VM's": (
        {"numa": 1, "numa0": "cpus=0-3,hostnodes=0,memory=4096,policy=bind"},
        "total memory for NUMA nodes must be equal to vm static memory",
    ),
    "a host node the host lacks": (
        {"numa": 1, "numa0": "cpus=0-3,hostnodes=3,memory=8192,policy=bind"},
        "host NUMA node3 doesn't exist",
    ),
    "hugepages with two host nodes in one guest node": (
        {"numa": 1, "hugepages": "2", "numa0": "cpus=0-3,hostnodes=0-1,memory=8192,policy=bind"},
        "more than 1 hostnode value in numa node is not supported when hugepages are enabled at ",
    ),
    "affinity without any CPU of the host": (
        {"affinity": "500-503"},
        "start failed: command '/usr/bin/taskset --cpu-list --all-tasks 500-503 /usr/bin/kvm",
    ),
}


@pytest.mark.parametrize("case", sorted(PVE_SAYS))
def test_pvesim_refuses_a_bad_value_as_pve(case):
    params, says = PVE_SAYS[case]
    sim = contract.case_sim()
    h = contract.headers(sim, contract.ROOT_AUTH)
    with pytest.raises(ApiError) as e:
        sim.handle("PUT", "/nodes/pve2/qemu/150/config", params, h)
    assert says in next(iter(e.value.errors.values()))


@pytest.mark.parametrize("case", sorted(START_SAYS))
def test_pvesim_fails_the_start_as_pve(case):
    params, says = START_SAYS[case]
    sim = contract.case_sim()
    h = contract.headers(sim, contract.ROOT_AUTH)
    sim.handle("PUT", "/nodes/pve2/qemu/150/config", {k: str(v) for k, v in params.items()}, h)
    sim.vms[150]["status"] = "stopped"
    upid = sim.handle("POST", "/nodes/pve2/qemu/150/status/start", {}, h)
    assert sim.tasks[upid]["exitstatus"].startswith(says), sim.tasks[upid]
    assert sim.vms[150]["status"] == "stopped"
