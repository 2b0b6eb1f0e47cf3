"""plugins/module_utils/nvidia_smi_parse.py over real captures and edge cases.

The real captures (2x H200 VM, driver 580.159.04): idle, the ones the lab simulator replays
(lab/gpusim/profiles/h200x2-vm/captures/); busy, tests/unit/fixtures/h200x2-vm/busy/.
"""

from __future__ import annotations

import re

import pytest
from ansible_collections.gpufleet.fleet.plugins.module_utils import nvidia_smi_parse as nsp
from gpu_facts_helpers import H200X2, H200X2_CAPTURES, REPO

UUID0 = "GPU-c0345594-416e-e0e4-2789-de58435583a0"
UUID1 = "GPU-95f876da-2837-2eab-094c-681759d44f8b"


def capture(name):
    """An idle capture (the simulator's replay files)."""
    return (H200X2_CAPTURES / name).read_text(encoding="utf-8")


def busy_capture(name):
    """A capture while a process held GPU memory."""
    return (H200X2 / "busy" / name).read_text(encoding="utf-8")


def p2p_capture(mode):
    parts = re.split(r"^## -p2p (.)\n", capture("topo-p2p.txt"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))[mode]


def test_module_does_not_import_ansible():
    source = (REPO / "plugins/module_utils/nvidia_smi_parse.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+ansible", source, flags=re.M)


# ----------------------------------------------------------------------------- strip_ansi


def test_strip_ansi():
    assert nsp.strip_ansi("\t\x1b[4mGPU0\tGPU1\x1b[0m") == "\tGPU0\tGPU1"
    assert nsp.strip_ansi("\x1b[1;32mOK\x1b[0m \x1b[Kx") == "OK x"
    assert nsp.strip_ansi(b"\x1b[4mGPU0\x1b[0m") == "GPU0"
    assert nsp.strip_ansi(None) == ""
    assert nsp.strip_ansi("no escapes\t") == "no escapes\t"


# ----------------------------------------------------------------------------- CSV, real captures


# The idle capture's two GPUs: index, UUID, PCI bus id.
GPUS = [(0, UUID0, "00000000:00:06.0"), (1, UUID1, "00000000:00:07.0")]


def test_query_gpu_capture():
    rows = nsp.parse_csv_query(capture("query-gpu.csv"))
    same = {
        "name": "NVIDIA H200",
        "memory.total": 143771,
        "memory.used": 0,
        "memory.free": 143156,
        "driver_version": "580.159.04",
        "compute_cap": "9.0",
        "persistence_mode": "Enabled",
        "power.limit": 700.0,
    }
    assert rows == [{"index": index, "uuid": uuid, "pci.bus_id": bus, **same} for index, uuid, bus in GPUS]


def test_query_gpu_nounits_capture():
    fields = "index,pci.bus_id,memory.used,memory.total,compute_cap,driver_version"
    rows = nsp.parse_csv_query(capture("query-gpu-nounits.csv"), header=False, fields=fields)
    same = {"memory.used": 0, "memory.total": 143771, "compute_cap": "9.0", "driver_version": "580.159.04"}
    assert rows == [{"index": index, "pci.bus_id": bus, **same} for index, _uuid, bus in GPUS]
    # fields as a list work too
    assert nsp.parse_csv_query(capture("query-gpu-nounits.csv"), header=False, fields=fields.split(",")) == rows


def test_query_apps_captures():
    assert nsp.parse_csv_query(capture("query-apps.csv")) == []
    busy = nsp.parse_csv_query(busy_capture("query-apps.csv"))
    assert busy == [
        {
            "pid": 1939,
            "process_name": "python3",
            "used_gpu_memory": 41478,
            "gpu_uuid": "GPU-483b2718-0f2f-e111-88e6-125b57dd46ad",
        },
        {
            "pid": 1939,
            "process_name": "python3",
            "used_gpu_memory": 41478,
            "gpu_uuid": "GPU-2b001742-6c30-a5de-f6d7-8a2f2de0c67d",
        },
    ]
    nounits = nsp.parse_csv_query(
        busy_capture("query-apps-nounits.csv"), header=False, fields="pid,used_memory,gpu_bus_id"
    )
    assert nounits == [
        {"pid": 1939, "used_memory": 41478, "gpu_bus_id": "00000000:00:06.0"},
        {"pid": 1939, "used_memory": 41478, "gpu_bus_id": "00000000:00:07.0"},
    ]
    gpus = nsp.parse_csv_query(busy_capture("query-gpu.csv"), header=False, fields="index,memory.used,memory.total")
    assert [g["memory.used"] for g in gpus] == [41487, 41487]


# ----------------------------------------------------------------------------- CSV, edge cases


def test_mixed_models_mig_and_na_values():
    text = (
        "index, name, memory.total [MiB], memory.used [MiB], compute_cap, mig.mode.current, "
        "power.limit [W], memory.reserved [MiB]\r\n"
        "0, NVIDIA H100 80GB HBM3, 81559 MiB, 0 MiB, 9.0, Enabled, 700.00 W, 530 MiB\r\n"
        "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB, 1 MiB, 12.0, Disabled, 600.00 W, "
        "[N/A]\r\n"
        "2, NVIDIA GeForce RTX 4090, 24564 MiB, 312 MiB, 8.9, [N/A], [Not Supported], N/A\r\n"
    )
    rows = nsp.parse_csv_query(text)
    assert [r["name"] for r in rows] == [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "NVIDIA GeForce RTX 4090",
    ]
    assert [r["mig.mode.current"] for r in rows] == ["Enabled", "Disabled", None]
    assert [r["power.limit"] for r in rows] == [700.0, 600.0, None]
    assert [r["memory.reserved"] for r in rows] == [530, None, None]
    assert [r["memory.total"] for r in rows] == [81559, 97887, 24564]
    assert [nsp.compute_cap_to_arch(r["compute_cap"]) for r in rows] == ["sm_90", "sm_120", "sm_89"]


def test_mig_enabled_memory_is_na():
    # With MIG on, per-GPU memory.used is [N/A] on some drivers.
    text = "index, mig.mode.current, mig.mode.pending, memory.used [MiB]\n0, Enabled, Enabled, [N/A]\n"
    assert nsp.parse_csv_query(text) == [
        {"index": 0, "mig.mode.current": "Enabled", "mig.mode.pending": "Enabled", "memory.used": None}
    ]


def test_header_keeps_units_with_nounits():
    text = "memory.total [MiB], power.draw [W], utilization.gpu [%]\n143771, 75.36, 3\n"
    assert nsp.parse_csv_query(text) == [{"memory.total": 143771, "power.draw": 75.36, "utilization.gpu": 3}]


def test_fields_override_header_names():
    text = "name, pci.bus_id\nNVIDIA H200, 00000000:00:06.0\n"
    assert nsp.parse_csv_query(text, fields="gpu_name,gpu_bus_id") == [
        {"gpu_name": "NVIDIA H200", "gpu_bus_id": "00000000:00:06.0"}
    ]


def test_comma_in_process_name():
    text = "pid, process_name, used_gpu_memory [MiB]\n42, python3 -c a,b, 10 MiB\n43, odd, name, 20 MiB\n"
    assert nsp.parse_csv_query(text) == [
        {"pid": 42, "process_name": "python3 -c a,b", "used_gpu_memory": 10},
        {"pid": 43, "process_name": "odd, name", "used_gpu_memory": 20},
    ]


def test_empty_output_and_blank_lines():
    assert nsp.parse_csv_query("", header=False, fields="index") == []
    assert nsp.parse_csv_query("\n\n0\n\n1\n", header=False, fields="index") == [{"index": 0}, {"index": 1}]


@pytest.mark.parametrize(
    ("text", "kwargs"),
    [
        ('Field "xyz" is not a valid field to query.\n\n', {}),
        ('Field "xyz" is not a valid field to query.\n\n', {"header": False, "fields": "xyz"}),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n\n",
            {"header": False, "fields": "index"},
        ),
        ("No devices were found\n", {"header": False, "fields": "index"}),
        ("0, 1\n", {"header": False, "fields": "index"}),  # wrong width
        ("0\n", {"header": False}),  # no fields
        ("", {}),  # no header
    ],
)
def test_csv_errors_raise(text, kwargs):
    with pytest.raises(nsp.NvidiaSmiParseError):
        nsp.parse_csv_query(text, **kwargs)


# ----------------------------------------------------------------------------- topo -m


def test_topo_m_capture():
    topo = nsp.parse_topo_matrix(capture("topo-m.txt"))
    assert topo == {
        "gpus": ["GPU0", "GPU1"],
        "links": {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}},
        "nic_links": {"GPU0": {}, "GPU1": {}},
        "cpu_affinity": {"GPU0": "0-31", "GPU1": "0-31"},
        "numa_affinity": {"GPU0": "0", "GPU1": "0"},
        "gpu_numa_id": {"GPU0": None, "GPU1": None},
        "nics": [],
        "nic_names": {},
    }


def test_topo_mp_capture():
    topo = nsp.parse_topo_matrix(capture("topo-mp.txt"))
    assert topo["links"] == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}


TOPO_WITH_NICS = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\tSYS\tPIX\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tSYS\tNODE\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tNV18\tSYS\tPIX\t56-111,168-223\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tNV18\t X \tSYS\tNODE\t56-111,168-223\t1\t\tN/A\n"
    "NIC0\tPIX\tNODE\tSYS\tSYS\t X \tSYS\t\t\t\t\n"
    "NIC1\tSYS\tSYS\tPIX\tNODE\tSYS\t X \t\t\t\t\n"
    # the legend as the real NVLink machine printed it (a blank line, Legend:, X ... NV#)
    + capture("topo-m.txt")[capture("topo-m.txt").index("\nLegend:") :]
    + "\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n\n"
)


def test_topo_with_nic_columns_rows_and_legend():
    topo = nsp.parse_topo_matrix(TOPO_WITH_NICS)
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo["nics"] == ["NIC0", "NIC1"]
    assert topo["nic_names"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo["links"]["GPU0"] == {"GPU1": "NV18", "GPU2": "SYS", "GPU3": "SYS"}
    assert topo["links"]["GPU3"] == {"GPU0": "SYS", "GPU1": "SYS", "GPU2": "NV18"}
    assert set(topo["links"]) == {"GPU0", "GPU1", "GPU2", "GPU3"}  # NIC rows are not GPUs
    assert topo["nic_links"]["GPU0"] == {"NIC0": "PIX", "NIC1": "SYS"}
    assert topo["cpu_affinity"] == {
        "GPU0": "0-55,112-167",
        "GPU1": "0-55,112-167",
        "GPU2": "56-111,168-223",
        "GPU3": "56-111,168-223",
    }
    assert topo["numa_affinity"] == {"GPU0": "0", "GPU1": "0", "GPU2": "1", "GPU3": "1"}
    assert topo["gpu_numa_id"] == dict.fromkeys(topo["gpus"])


def test_topo_legacy_nic_names_and_no_gpu_numa_column():
    # Older drivers: NIC columns named after the device, no GPU NUMA ID column.
    text = (
        "\t\x1b[4mGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\x1b[0m\n"
        "GPU0\t X \tPHB\tPHB\t0-15\tN/A\n"
        "GPU1\tPHB\t X \tPHB\t0-15\tN/A\n"
        "mlx5_0\tPHB\tPHB\t X \t\t\n"
    )
    topo = nsp.parse_topo_matrix(text)
    assert topo["gpus"] == ["GPU0", "GPU1"]
    assert topo["nics"] == ["mlx5_0"]
    assert topo["links"] == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}
    assert topo["numa_affinity"] == {"GPU0": None, "GPU1": None}
    assert topo["gpu_numa_id"] == {"GPU0": None, "GPU1": None}


def test_topo_pasted_with_spaces_instead_of_tabs():
    text = (
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
        "GPU0     X      PHB     0-63    0               N/A\n"
        "GPU1    PHB      X      0-63    0               N/A\n"
    )
    topo = nsp.parse_topo_matrix(text)
    assert topo["links"] == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}
    assert topo["cpu_affinity"] == {"GPU0": "0-63", "GPU1": "0-63"}


def test_topo_eight_gpu_phb_with_crlf():
    names = [f"GPU{i}" for i in range(8)]
    lines = ["\t\x1b[4m" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for i, n in enumerate(names):
        cells = [" X " if i == j else "PHB" for j in range(8)]
        lines.append("\t".join([n, *cells, "0-63", "0", "", "N/A"]))
    topo = nsp.parse_topo_matrix("\r\n".join(lines) + "\r\n")
    assert topo["gpus"] == names
    assert all(set(row.values()) == {"PHB"} and len(row) == 7 for row in topo["links"].values())


def test_topo_without_header_raises():
    with pytest.raises(nsp.NvidiaSmiParseError):
        nsp.parse_topo_matrix("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")


# ----------------------------------------------------------------------------- topo -p2p


@pytest.mark.parametrize(("mode", "expected"), [("r", "OK"), ("w", "OK"), ("n", "OK"), ("a", "OK"), ("p", "NS")])
def test_p2p_captures(mode, expected):
    p2p = nsp.parse_p2p_matrix(p2p_capture(mode))
    assert p2p == {
        "gpus": ["GPU0", "GPU1"],
        "status": {"GPU0": {"GPU1": expected}, "GPU1": {"GPU0": expected}},
        "missing_rows": [],
    }


def test_p2p_missing_gpu_row_and_short_row():
    text = (
        " \t\x1b[4mGPU0\tGPU1\tGPU2\t\x1b[0m\n"
        " GPU0\tX\tCNS\tCNS\t\n"
        " GPU1\tCNS\tX\t\n"  # short row: GPU2 cell missing
        "\n"
        "Legend:\n\n  X    = Self\n  OK   = Status Ok\n  DR   = Disabled by regkey\n"
    )
    p2p = nsp.parse_p2p_matrix(text)
    assert p2p["gpus"] == ["GPU0", "GPU1", "GPU2"]
    assert p2p["status"] == {"GPU0": {"GPU1": "CNS", "GPU2": "CNS"}, "GPU1": {"GPU0": "CNS"}}
    assert p2p["missing_rows"] == ["GPU2"]


def test_p2p_without_ansi_or_trailing_tabs():
    text = " \tGPU0\tGPU1\n GPU0\tX\tGNS\n GPU1\tGNS\tX\n"
    assert nsp.parse_p2p_matrix(text)["status"] == {"GPU0": {"GPU1": "GNS"}, "GPU1": {"GPU0": "GNS"}}


def test_p2p_without_header_raises():
    with pytest.raises(nsp.NvidiaSmiParseError):
        nsp.parse_p2p_matrix("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")


# ----------------------------------------------------------------------------- banner


def test_smi_header_capture_and_variants():
    assert nsp.parse_smi_header(capture("nvidia-smi.txt")) == {
        "smi_version": "580.159.04",
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
    }
    old = "| NVIDIA-SMI 570.172.08             Driver Version: 570.172.08     CUDA Version: 12.8     |"
    assert nsp.parse_smi_header(old)["cuda_version"] == "12.8"
    new = "| NVIDIA-SMI 610.43.02              KMD Version: 610.43.02     CUDA UMD Version: 13.3     |"
    assert nsp.parse_smi_header(new)["driver_version"] == "610.43.02"
    na = "| NVIDIA-SMI 580.105.06   Driver Version: 580.105.06   CUDA Version: N/A   |"
    assert nsp.parse_smi_header(na)["cuda_version"] is None
    assert nsp.parse_smi_header("nothing here") is None


# ----------------------------------------------------------------------------- failures


NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


def test_driver_failure_messages():
    msg = nsp.parse_driver_failure(9, NO_DRIVER, "")
    assert "driver not loaded" in msg.lower() and "rc 9" in msg
    assert "not installed" in nsp.parse_driver_failure(127, "", "/bin/sh: 1: nvidia-smi: not found")
    assert "not installed" in nsp.parse_driver_failure(1, "", "bash: nvidia-smi: command not found")
    assert "not installed" in nsp.parse_driver_failure(2, "", "[Errno 2] No such file or directory: 'nvidia-smi'")
    assert "mismatch" in nsp.parse_driver_failure(
        18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n", ""
    )
    assert "NVML" in nsp.parse_driver_failure(255, "Failed to initialize NVML: Unknown Error\n", "")
    assert "no NVIDIA GPU" in nsp.parse_driver_failure(6, "No devices were found\n", "")
    assert "lost" in nsp.parse_driver_failure(
        15, "Unable to determine the device handle for GPU0000:00:06.0: GPU is lost.\n", ""
    )
    assert "rc 3" in nsp.parse_driver_failure(3, "something odd\n", "")


def test_no_failure_on_success():
    assert nsp.parse_driver_failure(0, capture("nvidia-smi.txt"), "") is None
    assert nsp.parse_driver_failure(0, capture("query-gpu.csv"), "") is None
    assert nsp.parse_driver_failure(0, "", "") is None


# ----------------------------------------------------------------------------- compute capability


@pytest.mark.parametrize(
    ("cap", "arch"),
    [
        ("12.0", "sm_120"),
        ("9.0", "sm_90"),
        ("8.6", "sm_86"),
        ("10.0", "sm_100"),
        ("12.1", "sm_121"),
        (9.0, "sm_90"),
    ],
)
def test_compute_cap_to_arch(cap, arch):
    assert nsp.compute_cap_to_arch(cap) == arch


def test_compute_cap_to_arch_invalid():
    assert nsp.compute_cap_to_arch(None) is None
    for bad in ("", "9", "sm_90", "[N/A]", "9.0.1"):
        with pytest.raises(ValueError):
            nsp.compute_cap_to_arch(bad)
