"""plugins/module_utils/gpu_facts_collect.py: the facts from real captures, the simulator and edge cases."""

from __future__ import annotations

import sys
import types

import pytest
from gpu_facts_helpers import (
    H200X2,
    KVM,
    device_facts,
    device_raw,
    device_result,
    facts_for,
    gfc,
    no_files,
    replay_runner,
)

ANSI = "\x1b[4m"
RESET = "\x1b[0m"


def test_device_capture_gives_the_facts_the_module_returned_on_the_h200():
    facts = device_facts()
    recorded = device_result()["ansible_facts"]["gpu_facts"]
    for key in ("driver_version", "cuda_driver_version", "gpu_count", "gpus", "archs", "topology", "p2p", "processes"):
        if key == "p2p":
            assert {k: v for k, v in facts[key].items() if not k.startswith("nvml")} == {
                k: v for k, v in recorded[key].items() if not k.startswith("nvml")
            }
        else:
            assert facts[key] == recorded[key], key


def test_device_h200_nvlink_p2p_ok():
    facts = device_facts()
    assert facts["gpu_count"] == 2
    assert facts["driver_version"] == "580.159.04"
    assert facts["cuda_driver_version"] == "13.0"
    assert facts["archs"] == ["sm_90"]
    assert [g["memory_total_mib"] for g in facts["gpus"]] == [143771, 143771]
    assert facts["gpus"][0]["pci_bus_id"] == "00000000:00:06.0"
    assert facts["gpus"][0]["mig_mode"] == "Disabled"
    assert facts["gpus"][1]["numa_affinity"] == "0"
    topo = facts["topology"]
    assert topo["link_types"] == ["NV18"] and topo["nvlink_all"] and topo["worst_pcie_link"] is None
    assert facts["p2p"]["all_ok"] and facts["p2p"]["statuses"] == ["OK"]
    assert facts["processes"] == [] and facts["busy_gpus"] == []
    assert facts["virtualization"]["vm"] == "kvm" and facts["virtualization"]["is_vm"] is True


def test_rtx_pro_6000_profile_is_the_seed_machine():
    facts = facts_for("rtx-pro-6000x8-vm")
    assert facts["gpu_count"] == 8
    assert facts["archs"] == ["sm_120"] and facts["compute_caps"] == ["12.0"]
    assert facts["models"] == ["NVIDIA RTX PRO 6000 Blackwell Server Edition"]
    assert facts["memory_total_mib_min"] == 97887
    assert facts["topology"]["link_types"] == ["PHB"] and not facts["topology"]["nvlink_any"]
    assert len(facts["topology"]["pairs"]) == 28
    assert facts["p2p"]["statuses"] == ["NS"] and not facts["p2p"]["all_ok"] and not facts["p2p"]["any_ok"]
    assert len(facts["p2p"]["not_ok_pairs"]) == 56
    assert facts["driver_version"] == "570.172.08" and facts["cuda_driver_version"] == "12.8"


def test_h200x2_real_captures_through_the_simulator_replay():
    facts = facts_for("h200x2-vm")
    assert facts["topology"]["matrix"] == {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}
    assert facts["p2p"]["all_ok"]


def test_missing_driver_fails_naming_command_and_output():
    run = replay_runner(
        {
            "query_gpu": (
                9,
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                "Make sure that the latest NVIDIA driver is installed and running.\n\n",
                "",
            )
        }
    )
    with pytest.raises(gfc.GpuFactsError) as err:
        gfc.collect(run, use_nvml=False, read_text=no_files)
    text = str(err.value)
    assert "NVIDIA driver not loaded" in text
    assert "nvidia-smi --query-gpu=index,name" in text and "exited 9" in text
    assert "couldn't communicate" in text
    assert err.value.rc == 9 and err.value.cmd[0] == "nvidia-smi"


def test_missing_binary_fails():
    run = replay_runner({"query_gpu": (127, "", "nvidia-smi: command not found")})
    with pytest.raises(gfc.GpuFactsError, match="nvidia-smi not found"):
        gfc.collect(run, use_nvml=False, read_text=no_files)


def test_profile_none_fails_through_the_simulator():
    with pytest.raises(gfc.GpuFactsError, match="driver not loaded"):
        facts_for("none")


def _outputs(**extra):
    out = dict(device_raw())
    out.update(extra)
    return out


def test_processes_are_mapped_to_gpus_and_units():
    raw = device_raw()
    uuid0 = "GPU-21c41a15-8217-9660-4c0b-b25f5655b3cf"
    uuid1 = "GPU-c0028a19-3800-50d6-8580-be5fc1a70124"
    apps = f"1939, python3, 41478, {uuid0}\n2001, sglang::scheduler_TP1, 88000, {uuid1}\n"
    units = {1939: "session-3.scope", 2001: "sglang-server.service"}
    info = {
        1939: {"alive": True, "uid": 1001, "user": "intruder", "cmdline": "python3 train.py"},
        2001: {"alive": True, "uid": 998, "user": "sglang", "cmdline": "sglang::scheduler_TP1"},
    }
    facts, _ = gfc.collect(
        replay_runner(_outputs(query_apps=apps)),
        use_nvml=False,
        read_text=no_files,
        unit_of=units.get,
        proc_info=info.get,
    )
    assert raw["query_apps"] == ""
    assert facts["processes"] == [
        {
            "pid": 1939,
            "name": "python3",
            "used_memory_mib": 41478,
            "gpu_uuid": uuid0,
            "gpu_index": 0,
            "unit": "session-3.scope",
            "alive": True,
            "uid": 1001,
            "user": "intruder",
            "cmdline": "python3 train.py",
        },
        {
            "pid": 2001,
            "name": "sglang::scheduler_TP1",
            "used_memory_mib": 88000,
            "gpu_uuid": uuid1,
            "gpu_index": 1,
            "unit": "sglang-server.service",
            "alive": True,
            "uid": 998,
            "user": "sglang",
            "cmdline": "sglang::scheduler_TP1",
        },
    ]
    assert facts["busy_gpus"] == [0, 1]


def test_unit_of_reads_the_cgroup(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/system.slice/sglang-server.service\n")
    assert gfc._unit_of(42, proc_root=str(tmp_path)) == "sglang-server.service"
    assert gfc._unit_of(43, proc_root=str(tmp_path)) is None


def _topo(links, nic=False):
    """A hand-made `topo -m` in the real layout (ANSI header, tabs, trailing columns)."""
    n = len(links)
    cols = [f"GPU{i}" for i in range(n)] + (["NIC0"] if nic else [])
    lines = ["\t" + ANSI + "\t".join(cols + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + RESET]
    for i, row in enumerate(links):
        cells = [" X " if j == i else row[j] for j in range(n)] + (["PIX"] if nic else [])
        lines.append(f"GPU{i}\t" + "\t".join(cells) + "\t0-63\t0\t\tN/A")
    if nic:
        lines.append("NIC0\t" + "\t".join(["PIX"] * n) + "\t X \t\t\t")
        lines += ["", "NIC Legend:", "", "  NIC0: mlx5_0"]
    return "\n".join(lines) + "\n\nLegend:\n\n  X    = Self\n"


def _p2p(status, drop_row=None):
    n = len(status)
    lines = [" \t" + ANSI + "\t".join(f"GPU{i}" for i in range(n)) + "\t" + RESET]
    for i in range(n):
        if i == drop_row:
            continue
        lines.append(f" GPU{i}\t" + "\t".join("X" if i == j else status[i][j] for j in range(n)) + "\t")
    return "\n".join(lines) + "\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n"


def _gpu_rows(names, mig="Disabled"):
    return "".join(
        f"{i}, {name}, GPU-{i:08d}-0000-0000-0000-000000000000, 00000000:0{i}:00.0, 97887, 0, 97286, "
        f"570.172.08, {'12.0' if 'RTX' in name else '9.0'}, {mig}, Enabled\n"
        for i, name in enumerate(names)
    )


def _facts(names, links, status, nic=False, drop_row=None, mig="Disabled"):
    outputs = {
        "query_gpu": _gpu_rows(names, mig),
        "topo_m": _topo(links, nic),
        "topo_p2p_r": _p2p(status, drop_row),
        "query_apps": "",
        "summary": device_raw()["summary"],
    }
    facts, _ = gfc.collect(replay_runner(outputs), use_nvml=False, read_text=no_files)
    return facts


def _matrix(n, value):
    return [[value] * n for _ in range(n)]


def test_nic_columns_are_not_gpus():
    facts = _facts(["NVIDIA H200"] * 2, _matrix(2, "PXB"), _matrix(2, "OK"), nic=True)
    assert facts["gpu_count"] == 2
    assert facts["topology"]["link_types"] == ["PXB"] and facts["topology"]["nics"] == ["NIC0"]
    assert facts["topology"]["nic_names"] == {"NIC0": "mlx5_0"}


def test_gpu_missing_from_the_p2p_table_counts_as_not_ok():
    facts = _facts(["NVIDIA H200"] * 3, _matrix(3, "PHB"), _matrix(3, "OK"), drop_row=2)
    assert facts["p2p"]["missing_gpus"] == ["GPU2"]
    assert not facts["p2p"]["all_ok"] and facts["p2p"]["any_ok"]
    assert "GPU2-GPU0:missing" in facts["p2p"]["not_ok_pairs"]


def test_mixed_models_and_mig():
    facts = _facts(
        ["NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition"],
        _matrix(2, "SYS"),
        _matrix(2, "CNS"),
        mig="Enabled",
    )
    assert facts["mixed_models"] and facts["mig_enabled"]
    assert facts["archs"] == ["sm_90", "sm_120"]
    assert facts["topology"]["worst_link"] == "SYS" and facts["p2p"]["statuses"] == ["CNS"]


def test_worst_link_mixes_nvlink_and_pcie():
    links = [["X", "NV12", "PHB"], ["NV12", "X", "PHB"], ["PHB", "PHB", "X"]]
    facts = _facts(["NVIDIA H200"] * 3, links, _matrix(3, "OK"))
    topo = facts["topology"]
    assert topo["link_types"] == ["NV12", "PHB"]
    assert topo["nvlink_any"] and not topo["nvlink_all"]
    assert topo["worst_link"] == "PHB" and topo["worst_pcie_link"] == "PHB"


def test_link_rank_order():
    assert [gfc.link_rank(x) for x in ("NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "??", None)] == [
        0, 1, 2, 3, 4, 5, 5, 6, 6,
    ]  # fmt: skip


def test_unreadable_output_names_the_command():
    run = replay_runner(_outputs(topo_m="garbage without a header\n"))
    with pytest.raises(gfc.GpuFactsError, match=r"could not read the output of `nvidia-smi topo -m`"):
        gfc.collect(run, use_nvml=False, read_text=no_files)


def test_nvml_second_source_agrees_and_disagrees(monkeypatch):
    calls = []

    fake = types.SimpleNamespace(
        NVML_P2P_CAPS_INDEX_READ=(0,),  # nvidia-ml-py 13.x really defines it as a tuple
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
    )

    def status(a, b, index):
        calls.append(index)
        return 0

    fake.nvmlDeviceGetP2PStatus = status
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    facts, _ = gfc.collect(replay_runner(device_raw()), read_text=no_files)
    assert facts["sources"] == ["nvidia-smi", "nvml"]
    assert facts["p2p"]["nvml"] == {"GPU0": {"GPU1": "OK"}, "GPU1": {"GPU0": "OK"}}
    assert facts["p2p"]["nvml_agrees"] is True and calls == [0, 0]

    fake.nvmlDeviceGetP2PStatus = lambda a, b, index: 5
    facts, _ = gfc.collect(replay_runner(device_raw()), read_text=no_files)
    assert facts["p2p"]["nvml_agrees"] is False
    assert facts["p2p"]["nvml_disagreements"][0] == "GPU0-GPU1: nvidia-smi OK, nvml NS"


def test_nvml_absent_or_failing_is_recorded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    facts, _ = gfc.collect(replay_runner(device_raw()), read_text=no_files)
    assert facts["sources"] == ["nvidia-smi"] and "not importable" in facts["nvml_error"]

    def boom():
        raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=boom))
    facts, _ = gfc.collect(replay_runner(device_raw()), read_text=no_files)
    assert "nvmlInit failed" in facts["nvml_error"] and facts["p2p"]["nvml"] is None


@pytest.mark.parametrize(
    ("virt", "files", "vm", "method"),
    [
        (KVM, {}, "kvm", "systemd-detect-virt"),
        (
            {},
            {
                "/sys/class/dmi/id/sys_vendor": "QEMU\n",
                "/sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n",
            },
            "kvm",
            "dmi",
        ),
        ({}, {"/proc/cpuinfo": "flags\t\t: fpu vme hypervisor lahf_lm\n"}, "unknown-hypervisor", "cpuinfo"),
        ({}, {"/proc/cpuinfo": "flags\t\t: fpu vme lahf_lm\n"}, "none", "cpuinfo"),
        ({("systemd-detect-virt", "--vm"): (1, "none\n", "")}, {}, "none", "systemd-detect-virt"),
    ],
)
def test_virtualization(virt, files, vm, method):
    def run(argv):
        return virt.get(tuple(argv), (127, "", "not found"))

    result = gfc.detect_virtualization(run, read_text=files.get)
    assert result["vm"] == vm and result["method"] == method
    assert result["is_vm"] is (vm != "none")


def test_device_machine_virtualization_is_an_unnamed_hypervisor():
    """The H200 machine (Firecracker) has no systemd-detect-virt and no DMI: only the CPU flag."""
    recorded = device_result()["ansible_facts"]["gpu_facts"]["virtualization"]
    assert recorded == {
        "vm": "unknown-hypervisor",
        "container": None,
        "is_vm": True,
        "method": "cpuinfo",
        "dmi_vendor": None,
        "dmi_product": None,
    }
    assert "hypervisor" in (H200X2.parent / "h200-device" / "virt.txt").read_text()


def test_disk_space_measures_the_nearest_existing_parent(tmp_path):
    (tmp_path / "a").mkdir()
    [entry] = gfc.disk_space([str(tmp_path / "a" / "b" / "c")])
    assert entry["checked_path"] == str(tmp_path / "a")
    assert entry["free_mib"] > 0 and entry["total_mib"] >= entry["free_mib"]
