"""roles/node_exporter/files/gpufleet_gpu_metrics.py: per-GPU metrics for node-exporter's textfile collector.

Parsed from the real 1x H200 captures (tests/unit/fixtures/gpu-hosts/h200x1-metrics/, idle and busy), with the
engine's processes told apart by a fake /proc, Xid lines in the real kernel-log format, failures of nvidia-smi
and journalctl, the output checked by a strict parser of the Prometheus text format, and end to end against
the lab's simulated nvidia-smi (lab/gpusim/nvidia_smi.py).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "roles" / "node_exporter" / "files" / "gpufleet_gpu_metrics.py"
CAPTURES = REPO / "tests" / "unit" / "fixtures" / "gpu-hosts" / "h200x1-metrics"
HOLDER_CGROUP = REPO / "tests" / "unit" / "fixtures" / "h200-device" / "gpu-holder" / "proc" / "457" / "cgroup"
SIM = REPO / "lab" / "gpusim" / "nvidia_smi.py"
PROFILES = REPO / "lab" / "gpusim" / "profiles"

spec = importlib.util.spec_from_file_location("gpufleet_gpu_metrics", SCRIPT)
gm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gm)

MIB = 1048576
H200_UUID = "GPU-605329c9-a8ca-709e-4e7e-4ce89c28b937"
ENGINE = "sglang-server.service"
# The metric names alert rules are written against: the contract, spelled out once more on purpose.
METRICS = {
    "gpufleet_gpu_info": "gauge",
    "gpufleet_gpu_utilization_ratio": "gauge",
    "gpufleet_gpu_memory_used_bytes": "gauge",
    "gpufleet_gpu_memory_total_bytes": "gauge",
    "gpufleet_gpu_memory_engine_bytes": "gauge",
    "gpufleet_gpu_memory_foreign_bytes": "gauge",
    "gpufleet_gpu_temperature_celsius": "gauge",
    "gpufleet_gpu_power_watts": "gauge",
    "gpufleet_gpu_ecc_errors_corrected_total": "counter",
    "gpufleet_gpu_ecc_errors_uncorrected_total": "counter",
    "gpufleet_gpu_remapped_rows_pending": "gauge",
    "gpufleet_gpu_remapped_rows_failure": "gauge",
    "gpufleet_gpu_clock_event_active": "gauge",
    "gpufleet_gpu_pcie_link_generation": "gauge",
    "gpufleet_gpu_pcie_link_width": "gauge",
    "gpufleet_gpu_xid_errors_total": "counter",
    "gpufleet_gpu_xid_code_errors_total": "counter",
    "gpufleet_gpu_collector_success": "gauge",
    "gpufleet_gpu_collector_last_run_timestamp_seconds": "gauge",
}
# The health cells of a --query-gpu line (pci.bus_id .. pcie.link.width.max) as the idle H200 printed them.
HEALTH = ", 00000000:00:06.0, No, No, 0x0000000000000001, 5, 5, 16, 16"
# Real kernel-log lines (journalctl -k -o cat): Xid reports and other NVRM lines that are not Xids.
KERNEL_LOG = """\
nvidia-nvlink: Nvlink Core is being initialized, major device number 234
NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build
NVRM: Xid (PCI:0000:3b:00): 79, pid=2718, name=python3, GPU has fallen off the bus.
NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
NVRM: Xid (PCI:0000:00:06): 31, pid=1939, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS \
GPCCLIENT_T1_0 faulted @ 0x7f1e_42000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ
NVRM: Xid (PCI:0000:00:06): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC response \
from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5).
NVRM: GPU at PCI:0000:00:06: GPU-605329c9-a8ca-709e-4e7e-4ce89c28b937
"""


# ----------------------------------------------------------------------------- the real captures


def capture(name):
    return (CAPTURES / name).read_text(encoding="utf-8")


def readme_fields():
    """The query list (Q = `...`) the captures were taken with, from their README."""
    return re.search(r"^Q = `([^`]+)`", capture("README.md"), re.M).group(1).split(",")


def strip_units(value):
    """What ``nounits`` does to one value of a ``--format=csv`` capture."""
    return re.sub(r" (%|MiB|W|MHz)$", "", value)


def cells(line):
    return [c.strip() for c in line.split(",")]


def link_max_from_q():
    """The PCIe link's maximum generation and width, which the 1x H200 captures did not query: from the real
    ``nvidia-smi -q`` of a 2x H200 VM (the same GPU, the lab's h200x2-vm capture), PCI > GPU Link Info > Max."""
    text = (PROFILES / "h200x2-vm" / "captures" / "nvidia-smi-q.txt").read_text()
    gen = re.search(r"PCIe Generation\n\s+Max\s+: (\d+)", text).group(1)
    width = re.search(r"Link Width\n\s+Max\s+: (\d+)x", text).group(1)
    return {"pcie.link.gen.max": gen, "pcie.link.width.max": width}


def project(row, fields, wanted):
    """The nounits line nvidia-smi prints for ``wanted`` from a row queried with ``fields`` (and the link maximum
    from link_max_from_q where ``fields`` lacks it)."""
    by_name = link_max_from_q() | dict(zip(fields, row, strict=True))
    return ", ".join(by_name[f] for f in wanted) + "\n"


def idle_gpu_line():
    """The script's --query-gpu line on the idle H200, from the real nounits capture."""
    row = cells(capture("query-metrics-idle-nounits.csv").strip())
    return project(row, readme_fields(), gm.GPU_FIELDS)


def busy_gpu_line():
    """The same for the busy H200, from the units capture with its units taken off."""
    lines = capture("query-metrics-busy.csv").splitlines()
    row = [strip_units(v) for v in cells(lines[1])]
    return project(row, readme_fields(), gm.GPU_FIELDS)


def busy_apps_line():
    """``--query-compute-apps=pid,used_memory,gpu_uuid`` nounits on the busy H200 (the capture has
    process_name too, and units)."""
    lines = capture("query-apps-busy.csv").splitlines()
    fields = [re.sub(r" \[.*\]$", "", h) for h in cells(lines[0])]
    assert fields == ["pid", "process_name", "used_gpu_memory", "gpu_uuid"]
    row = [strip_units(v) for v in cells(lines[1])]
    return project(row, ["pid", "process_name", "used_memory", "gpu_uuid"], gm.APP_FIELDS)


def test_captures_are_copied_with_their_readme():
    for name in (
        "README.md",
        "help-query-gpu.txt",
        "query-metrics-idle.csv",
        "query-metrics-idle-nounits.csv",
        "query-metrics-busy.csv",
        "query-apps-busy.csv",
    ):
        assert (CAPTURES / name).is_file(), name
    fields = readme_fields()
    assert len(fields) == 27
    assert set(gm.GPU_FIELDS) - set(fields) == set(link_max_from_q())
    for name in ("query-metrics-idle.csv", "query-metrics-busy.csv"):
        header, row = capture(name).splitlines()
        assert len(cells(header)) == len(cells(row)) == len(fields)
    # Every field the script queries is one this driver answers (nvidia-smi --help-query-gpu).
    for field in gm.GPU_FIELDS:
        assert f'"{field}"' in capture("help-query-gpu.txt"), field


def test_nounits_is_the_units_capture_without_units():
    """The real nounits line has no header and the same cells as ``--format=csv`` minus ' %', ' MiB', ' W',
    ' MHz' (hex masks, [N/A], Enabled/No stay); only power.draw moved between the two readings."""
    fields = readme_fields()
    nounits = capture("query-metrics-idle-nounits.csv")
    assert nounits.count("\n") == 1 and not nounits.startswith("index")
    units = cells(capture("query-metrics-idle.csv").splitlines()[1])
    for field, with_units, bare in zip(fields, units, cells(nounits), strict=True):
        if field == "power.draw":
            assert re.fullmatch(r"\d+\.\d\d", bare) and re.fullmatch(r"\d+\.\d\d W", with_units)
        else:
            assert strip_units(with_units) == bare, field
    health = "00000000:00:06.0, No, No, 0x00000000000000{}, 5, 5, 16, 16"
    assert idle_gpu_line() == f"0, {H200_UUID}, NVIDIA H200, 0, 0, 143771, 39, 114.79, 0, 0, {health.format('01')}\n"
    assert (
        busy_gpu_line() == f"0, {H200_UUID}, NVIDIA H200, 100, 1139, 143771, 63, 691.93, 0, 0, {health.format('04')}\n"
    )
    assert busy_apps_line() == f"446, 1130, {H200_UUID}\n"


# ----------------------------------------------------------------------------- parsing


def test_parse_gpu_csv_idle_capture():
    assert gm.parse_gpu_csv(idle_gpu_line()) == [
        {
            "index": "0",
            "uuid": H200_UUID,
            "name": "NVIDIA H200",
            "utilization": 0.0,
            "memory_used_bytes": 0,
            "memory_total_bytes": 143771 * MIB,
            "temperature": 39.0,
            "power": 114.79,
            "ecc_corrected": 0,
            "ecc_uncorrected": 0,
            # the H200 in its VM: PCI address as the kernel's Xid lines write it, no row remapping pending or
            # failed, clocks down for idleness only (0x1), PCIe Gen5 x16 of Gen5 x16
            "pci": "0000:00:06",
            "remap_pending": 0,
            "remap_failure": 0,
            "clock_events": 0x1,
            "pcie_gen": (5.0, 5.0),
            "pcie_width": (16.0, 16.0),
        }
    ]


def test_parse_gpu_csv_busy_capture():
    (gpu,) = gm.parse_gpu_csv(busy_gpu_line())
    assert gpu["utilization"] == 1.0
    assert gpu["memory_used_bytes"] == 1139 * MIB
    assert gpu["temperature"] == 63.0
    assert gpu["power"] == 691.93
    assert gpu["clock_events"] == 0x4  # the software power cap under load (692 W of 700)


def test_parse_gpu_csv_tolerates_units():
    """The script asks for nounits; a value with its unit (the --format=csv shape) still reads the same."""
    lines = capture("query-metrics-busy.csv").splitlines()
    row = project(cells(lines[1]), readme_fields(), gm.GPU_FIELDS)
    assert gm.parse_gpu_csv(row) == gm.parse_gpu_csv(busy_gpu_line())


def test_parse_apps_csv_busy_capture_and_no_process():
    assert gm.parse_apps_csv(busy_apps_line()) == [{"pid": 446, "used_bytes": 1130 * MIB, "gpu_uuid": H200_UUID}]
    assert gm.parse_apps_csv("") == []  # no compute process: nvidia-smi prints nothing
    # A dying process (real, 0.05 s after SIGKILL): still listed; used_memory [N/A] where the driver has none.
    assert gm.parse_apps_csv(f"522, [N/A], {H200_UUID}\n") == [{"pid": 522, "used_bytes": None, "gpu_uuid": H200_UUID}]


@pytest.mark.parametrize("na", ["[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU requires reset]"])
def test_values_nvidia_smi_does_not_have_are_left_out(na):
    text = (
        f"0, GPU-a, NVIDIA H200, 5, 100, 143771, 40, 120.50, {na}, {na}{HEALTH}\n"
        f"1, GPU-b, NVIDIA GeForce RTX 4090, {na}, {na}, 24564, {na}, {na}, {na}, {na}, 00000000:3B:00.0, "
        f"{na}, {na}, {na}, {na}, {na}, {na}, {na}\n"
    )
    a, b = gm.parse_gpu_csv(text)
    assert a["ecc_corrected"] is None and a["ecc_uncorrected"] is None and a["utilization"] == 0.05
    assert b["utilization"] is b["memory_used_bytes"] is b["temperature"] is b["power"] is None
    assert b["remap_pending"] is b["remap_failure"] is b["clock_events"] is None and b["pcie_gen"] == (None, None)
    out = gm.render([a, b], {"0": 0, "1": 0}, 0, 1.0)
    samples = parse_exposition(out)
    assert not any(name.startswith("gpufleet_gpu_ecc_errors") for name, _, _ in samples)
    assert ("gpufleet_gpu_power_watts", {"gpu": "0"}, 120.5) in samples
    assert {labels["gpu"] for name, labels, _ in samples if name == "gpufleet_gpu_info"} == {"0", "1"}
    # GPU 1 has memory.total and its engine bytes, but no used, foreign, temperature or power sample.
    gpu1 = {name for name, labels, _ in samples if labels.get("gpu") == "1"}
    assert gpu1 == {"gpufleet_gpu_info", "gpufleet_gpu_memory_total_bytes", "gpufleet_gpu_memory_engine_bytes"}
    assert "# HELP gpufleet_gpu_ecc_errors" not in out  # no family without a sample


def test_malformed_output_is_an_error():
    for text in ("0, GPU-a, NVIDIA H200, 5\n", "No devices were found\n", "index, uuid\n"):
        with pytest.raises(gm.CollectError):
            gm.parse_gpu_csv(text)
    with pytest.raises(gm.CollectError):
        gm.parse_apps_csv("pid, used_gpu_memory [MiB], gpu_uuid\n")


def test_a_product_name_with_a_comma_and_label_escaping():
    (gpu,) = gm.parse_gpu_csv(f'3, GPU-x, Odd "GPU", rev \\2, 0, 0, 10, 30, 50.00, 0, 0{HEALTH}\n')
    assert gpu["index"] == "3" and gpu["name"] == 'Odd "GPU", rev \\2' and gpu["memory_total_bytes"] == 10 * MIB
    out = gm.render([gpu], {}, None, 5.0)
    assert 'gpufleet_gpu_info{gpu="3",uuid="GPU-x",name="Odd \\"GPU\\", rev \\\\2"} 1\n' in out
    assert ("gpufleet_gpu_info", {"gpu": "3", "uuid": "GPU-x", "name": 'Odd "GPU", rev \\2'}, 1.0) in parse_exposition(
        out
    )


# ----------------------------------------------------------------------------- the engine's processes


def fake_proc(root, processes):
    """processes: {pid: (cgroup text, state letter)}; a fake /proc/<pid>/{cgroup,status}."""
    for pid, (cgroup, state) in processes.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(cgroup)
        (d / "status").write_text(f"Name:\tpython3\nUmask:\t0022\nState:\t{state} (x)\nTgid:\t{pid}\n")
    return root


def test_engine_pids_by_cgroup(tmp_path):
    proc = fake_proc(
        tmp_path / "proc",
        {
            100: ("0::/system.slice/sglang-server.service\n", "S"),  # cgroup v2: the engine
            101: (
                "12:pids:/system.slice/sglang-server.service\n1:name=systemd:/system.slice/sglang-server.service\n",
                "R",
            ),
            102: ("0::/user.slice/user-1001.slice/session-3.scope\n", "S"),  # a user's notebook
            103: ("0::/\n", "S"),  # no unit
            105: ("0::/system.slice/sglang-server.service\n", "Z"),  # a zombie has let go of its memory
            106: ("0::/system.slice/sglang-server.service/scheduler\n", "S"),  # a sub-cgroup of the unit
            107: ("0::/system.slice/sglang-server-old.service\n", "S"),  # another unit, similar name
            108: ("0::/system.slice/smg-router.service\n", "S"),
            457: (HOLDER_CGROUP.read_text(), "S"),  # the real holder of another user (h200-device/gpu-holder)
        },
    )
    pids = [100, 101, 102, 103, 104, 105, 106, 107, 108, 457]  # 104: gone (a leaked allocation)
    assert gm.engine_pids(pids, [ENGINE], str(proc)) == {100, 101, 106}
    assert gm.engine_pids(pids, ["sglang-server"], str(proc)) == {100, 101, 106}  # as systemctl reads it
    assert gm.engine_pids(pids, [ENGINE, "smg-router.service"], str(proc)) == {100, 101, 106, 108}
    assert gm.engine_pids(pids, [], str(proc)) == set()


def test_busy_capture_memory_is_split_into_engine_and_foreign(tmp_path):
    """The real busy H200: the process held 1130 MiB while memory.used said 1139 MiB. The 9 MiB no process
    is charged with count as foreign: alert thresholds on foreign memory need that slack."""
    gpus = gm.parse_gpu_csv(busy_gpu_line())
    apps = gm.parse_apps_csv(busy_apps_line())
    proc = fake_proc(tmp_path / "proc", {446: ("0::/system.slice/sglang-server.service\n", "R")})
    engine = gm.engine_pids([a["pid"] for a in apps], [ENGINE], str(proc))
    held = gm.engine_memory(gpus, apps, engine)
    assert held == {"0": 1130 * MIB}
    samples = parse_exposition(gm.render(gpus, held, 0, 1765000000.5))
    assert ("gpufleet_gpu_memory_engine_bytes", {"gpu": "0"}, 1130 * MIB) in samples
    assert ("gpufleet_gpu_memory_foreign_bytes", {"gpu": "0"}, 9 * MIB) in samples
    # The same process outside the engine's unit (or gone): all of it is foreign.
    held = gm.engine_memory(gpus, apps, set())
    samples = parse_exposition(gm.render(gpus, held, 0, 1.0))
    assert ("gpufleet_gpu_memory_engine_bytes", {"gpu": "0"}, 0) in samples
    assert ("gpufleet_gpu_memory_foreign_bytes", {"gpu": "0"}, 1139 * MIB) in samples


def test_foreign_memory_is_never_negative_and_unknown_gpus_are_ignored():
    gpus = gm.parse_gpu_csv(f"0, GPU-a, NVIDIA H200, 0, 100, 143771, 30, 80.00, 0, 0{HEALTH}\n")
    apps = gm.parse_apps_csv("7, 150, GPU-a\n8, 20, GPU-gone\n")  # a row for a GPU the first query missed
    held = gm.engine_memory(gpus, apps, {7, 8})
    assert held == {"0": 150 * MIB}
    assert 'gpufleet_gpu_memory_foreign_bytes{gpu="0"} 0\n' in gm.render(gpus, held, None, 1.0)


# ----------------------------------------------------------------------------- Xid errors


def test_count_xid_in_real_kernel_lines():
    assert gm.count_xid(KERNEL_LOG) == 3
    assert gm.count_xid("") == 0
    # dmesg-style lines (with the kernel timestamp) count as well.
    assert gm.count_xid("[ 5012.331] NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=x, An uncorrectable ...\n") == 1


class FakeRun:
    """Stands in for subprocess.run: answers by argv[0] (a CompletedProcess, or an exception to raise)."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        answer = self.answers[os.path.basename(argv[0])]
        if callable(answer):
            answer = answer(argv)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def done(stdout="", rc=0, stderr=""):
    return subprocess.CompletedProcess([], rc, stdout, stderr)


def test_read_xid_errors_from_journalctl():
    run = FakeRun({"journalctl": done(KERNEL_LOG)})
    assert gm.read_xid_errors(run) == 3
    assert run.calls == [["journalctl", "-k", "-b", "-o", "cat", "--no-pager"]]
    assert gm.read_xid_errors(FakeRun({"journalctl": done(KERNEL_LOG.replace("NVRM: Xid", "NVRM: xid"))})) == 0


@pytest.mark.parametrize(
    "answer",
    [
        FileNotFoundError(2, "No such file or directory", "journalctl"),
        subprocess.TimeoutExpired("journalctl", 10),
        done("", 1, "Failed to get boot ID\n"),
        done(
            "",
            0,
            "Hint: You are currently not seeing messages from other users and the system.\n"
            "      Users in groups 'adm', 'systemd-journal' can see all messages.\n",
        ),
        done("", 0, "No journal files were found.\n"),
        done("", 0, ""),  # what systemd 252's journalctl -o cat prints (rc 0) where there is no journal
        done("-- No entries --\n", 0, ""),
    ],
    ids=["absent", "hangs", "fails", "no-permission", "no-journal", "no-journal-cat", "no-entries"],
)
def test_xid_metric_is_left_out_when_the_kernel_log_cannot_be_read(answer, capsys):
    assert gm.read_xid_errors(FakeRun({"journalctl": answer})) is None
    assert "Xid metric left out" in capsys.readouterr().err
    out = gm.render(gm.parse_gpu_csv(idle_gpu_line()), {"0": 0}, None, 1.0)
    assert "gpufleet_gpu_xid_errors_total" not in out
    assert "gpufleet_gpu_collector_success 1\n" in out


# ----------------------------------------------------------------------------- collect(): one run


def smi_answers(gpu_text, apps_text):
    return lambda argv: done(gpu_text if argv[1].startswith("--query-gpu=") else apps_text)


def test_collect_busy_host(tmp_path):
    proc = fake_proc(tmp_path / "proc", {446: ("0::/system.slice/sglang-server.service\n", "S")})
    run = FakeRun({"nvidia-smi": smi_answers(busy_gpu_line(), busy_apps_line()), "journalctl": done(KERNEL_LOG)})
    out = gm.collect("nvidia-smi", [ENGINE], str(proc), run=run, now=lambda: 1765000000.25)
    assert run.calls == [
        [
            "nvidia-smi",
            "--query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,"
            "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,pci.bus_id,"
            "remapped_rows.pending,remapped_rows.failure,clocks_event_reasons.active,pcie.link.gen.current,"
            "pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max",
            "--format=csv,noheader,nounits",
        ],
        ["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits"],
        ["journalctl", "-k", "-b", "-o", "cat", "--no-pager"],
    ]
    assert [ln for ln in out.splitlines() if not ln.startswith("#")] == [
        f'gpufleet_gpu_info{{gpu="0",uuid="{H200_UUID}",name="NVIDIA H200"}} 1',
        'gpufleet_gpu_utilization_ratio{gpu="0"} 1',
        f'gpufleet_gpu_memory_used_bytes{{gpu="0"}} {1139 * MIB}',
        f'gpufleet_gpu_memory_total_bytes{{gpu="0"}} {143771 * MIB}',
        f'gpufleet_gpu_memory_engine_bytes{{gpu="0"}} {1130 * MIB}',
        f'gpufleet_gpu_memory_foreign_bytes{{gpu="0"}} {9 * MIB}',
        'gpufleet_gpu_temperature_celsius{gpu="0"} 63',
        'gpufleet_gpu_power_watts{gpu="0"} 691.93',
        'gpufleet_gpu_ecc_errors_corrected_total{gpu="0"} 0',
        'gpufleet_gpu_ecc_errors_uncorrected_total{gpu="0"} 0',
        'gpufleet_gpu_remapped_rows_pending{gpu="0"} 0',
        'gpufleet_gpu_remapped_rows_failure{gpu="0"} 0',
        *[
            f'gpufleet_gpu_clock_event_active{{gpu="0",reason="{reason}"}} {int(reason == "sw_power_cap")}'
            for reason in (
                "gpu_idle",
                "applications_clocks_setting",
                "sw_power_cap",
                "hw_slowdown",
                "sync_boost",
                "sw_thermal_slowdown",
                "hw_thermal_slowdown",
                "hw_power_brake_slowdown",
                "display_clock_setting",
            )
        ],  # fmt: skip
        'gpufleet_gpu_pcie_link_generation{gpu="0",link="current"} 5',
        'gpufleet_gpu_pcie_link_generation{gpu="0",link="max"} 5',
        'gpufleet_gpu_pcie_link_width{gpu="0",link="current"} 16',
        'gpufleet_gpu_pcie_link_width{gpu="0",link="max"} 16',
        "gpufleet_gpu_xid_errors_total 3",
        # the H200 at 0000:00:06 logged Xid 31 and 119; 0000:3b:00 (79) is no GPU of this nvidia-smi
        'gpufleet_gpu_xid_code_errors_total{gpu="0",code="31"} 1',
        'gpufleet_gpu_xid_code_errors_total{gpu="0",code="119"} 1',
        'gpufleet_gpu_xid_code_errors_total{gpu="",code="79"} 1',
        "gpufleet_gpu_collector_success 1",
        "gpufleet_gpu_collector_last_run_timestamp_seconds 1765000000.25",
    ]
    types = {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", out, re.M)}
    assert types == METRICS
    assert set(re.findall(r"^# HELP (\S+) \S", out, re.M)) == set(METRICS)


NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


@pytest.mark.parametrize(
    ("smi", "said"),
    [
        (done(NO_DRIVER, 9), "exited 9: NVIDIA-SMI has failed because it couldn't communicate"),
        (done("No devices were found\n", 6), "exited 6: No devices were found"),
        (FileNotFoundError(2, "No such file or directory"), "No such file or directory"),
        (subprocess.TimeoutExpired("nvidia-smi", 10), "did not answer within 10 s"),
        (done("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n", 0), "columns"),
    ],
    ids=["no-driver", "no-devices", "absent", "hangs", "garbage"],
)
def test_nvidia_smi_failure_reports_success_0_only(smi, said, capsys):
    run = FakeRun({"nvidia-smi": smi, "journalctl": done(KERNEL_LOG)})
    out = gm.collect("nvidia-smi", [ENGINE], "/nonexistent", run=run, now=lambda: 1765000000.0)
    samples = parse_exposition(out)
    assert samples == [
        ("gpufleet_gpu_collector_success", {}, 0.0),
        ("gpufleet_gpu_collector_last_run_timestamp_seconds", {}, 1765000000.0),
    ]
    assert said in capsys.readouterr().err
    assert all(call[0] == "nvidia-smi" for call in run.calls)  # no kernel log read for a failed reading


def test_apps_query_failure_is_a_failure_too(capsys):
    def answer(argv):
        return done(idle_gpu_line()) if argv[1].startswith("--query-gpu=") else done("", 15, "Unknown Error\n")

    out = gm.collect("nvidia-smi", [ENGINE], "/nonexistent", run=FakeRun({"nvidia-smi": answer}), now=lambda: 2.0)
    assert "gpufleet_gpu_collector_success 0\n" in out and "gpufleet_gpu_info" not in out
    assert "--query-compute-apps=pid,used_memory,gpu_uuid exited 15: Unknown Error" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the text format


METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE_RE = re.compile(rf"^({METRIC_NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)\}})? (\S+)$")
HELP_RE = re.compile(rf"^# HELP ({METRIC_NAME}) (.+)$")
TYPE_RE = re.compile(rf"^# TYPE ({METRIC_NAME}) (counter|gauge|histogram|summary|untyped)$")


def parse_exposition(text):
    """A strict reader of the Prometheus text format (version 0.0.4) for what this script writes: every line a
    HELP, TYPE or sample line; HELP then TYPE once per family, before its samples, which are contiguous; float
    values; label values escaped; no series twice. Returns [(name, labels, value)]."""
    assert text.endswith("\n") and "\r" not in text
    samples, seen_series, families, current = [], set(), {}, None
    for line in text[:-1].split("\n"):
        if m := HELP_RE.match(line):
            assert m.group(1) not in families, f"family twice: {line}"
            families[m.group(1)] = None
            current = m.group(1)
            continue
        if m := TYPE_RE.match(line):
            assert m.group(1) == current and families[current] is None, f"TYPE out of place: {line}"
            families[current] = m.group(2)
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"not a sample line: {line!r}"
        name = m.group(1)
        assert name == current and families[name], f"sample outside its family: {line}"
        if families[name] == "counter":
            assert name.endswith("_total")
        labels = {}
        for key, raw in re.findall(LABEL, m.group(2) or ""):
            assert key not in labels
            labels[key] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), raw)
        value = float(m.group(m.lastindex))
        assert not math.isnan(value)
        series = (name, tuple(sorted(labels.items())))
        assert series not in seen_series, f"series twice: {line}"
        seen_series.add(series)
        samples.append((name, labels, value))
    assert all(families.values()), "a HELP without TYPE"
    return samples


def test_every_output_parses_as_prometheus_text():
    gpus = gm.parse_gpu_csv(busy_gpu_line()) + gm.parse_gpu_csv(
        "1, GPU-b, NVIDIA H200, 0, 0, 143771, 33, 75.36, [N/A], [N/A], 00000000:3B:00.0, Yes, Yes, 0x0000000000000048, "
        "5, 5, 8, 16\n"
    )
    for text in (
        gm.render(gpus, {"0": 1130 * MIB}, 3, 1765000000.123),
        gm.render(gpus, {"0": 1130 * MIB}, 3, 1765000000.123, gm.xid_codes(KERNEL_LOG)),
        gm.render(gpm := gm.parse_gpu_csv(idle_gpu_line()), gm.engine_memory(gpm, [], set()), None, 1.0),
        gm.render(None, None, None, 1765000000.0),
    ):
        samples = parse_exposition(text)
        assert {name for name, _, _ in samples} <= set(METRICS)
    samples = parse_exposition(gm.render(gpus, {"0": 1130 * MIB}, 3, 1765000000.123))
    assert [labels["gpu"] for name, labels, _ in samples if name == "gpufleet_gpu_info"] == ["0", "1"]
    assert all(0 <= v <= 1 for name, _, v in samples if name == "gpufleet_gpu_utilization_ratio")


def test_gpus_are_in_numeric_order():
    text = "".join(f"{i}, GPU-{i}, NVIDIA H200, 0, 0, 143771, 30, 80.00, 0, 0{HEALTH}\n" for i in (10, 2, 0, 1))
    out = gm.render(gm.parse_gpu_csv(text), {}, 0, 1.0)
    assert re.findall(r'^gpufleet_gpu_info\{gpu="(\d+)"', out, re.M) == ["0", "1", "2", "10"]


# ----------------------------------------------------------------------------- writing the file


def test_write_atomic_replaces_the_file_with_mode_0644(tmp_path):
    target = tmp_path / "gpufleet_gpu.prom"
    target.write_text("old\n")
    before = target.stat().st_ino
    old_umask = os.umask(0o077)
    try:
        gm.write_atomic(str(target), "gpufleet_gpu_collector_success 1\n")
    finally:
        os.umask(old_umask)
    assert target.read_text() == "gpufleet_gpu_collector_success 1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.stat().st_ino != before  # a new file renamed over the old one, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpufleet_gpu.prom"]


def test_write_atomic_keeps_the_old_file_when_it_fails(tmp_path, monkeypatch):
    target = tmp_path / "gpufleet_gpu.prom"
    target.write_text("old\n")
    seen = []

    def broken_replace(src, dst):
        seen.append(Path(src).name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gm.os, "replace", broken_replace)
    with pytest.raises(OSError):
        gm.write_atomic(str(target), "new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpufleet_gpu.prom"]
    # The temporary file sat in the same folder under a name node-exporter does not read (not *.prom).
    assert seen and seen[0].startswith(".gpufleet_gpu.prom.") and not seen[0].endswith(".prom")


def test_main_exit_status_when_the_file_cannot_be_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gm, "collect", lambda *a, **k: "gpufleet_gpu_collector_success 0\n")
    assert gm.main(["--output", str(tmp_path / "missing" / "x.prom")]) == 1
    assert "cannot write" in capsys.readouterr().err
    assert gm.main(["--output", str(tmp_path / "x.prom")]) == 0


def test_script_is_standalone_stdlib():
    source = SCRIPT.read_text(encoding="utf-8")
    assert source.startswith("#!/usr/bin/python3\n")
    assert "DCGM" in source and "textfile" in source
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


# ----------------------------------------------------------------------------- end to end: the lab's nvidia-smi


@pytest.fixture
def host(tmp_path):
    """A host for the script: bin/nvidia-smi (the simulator for a profile), bin/journalctl (the KERNEL_LOG),
    a simulator state dir and a fake /proc. ``run(profile, *extra)`` -> (CompletedProcess, samples or None)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SIM}" "$@"\n')
    journal = bindir / "journalctl"
    journal.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({KERNEL_LOG!r})\n")
    for f in (smi, journal):
        f.chmod(0o755)
    state = tmp_path / "gpusim-state"
    state.mkdir()
    proc = tmp_path / "proc"
    proc.mkdir()
    output = tmp_path / "textfile" / "gpufleet_gpu.prom"
    output.parent.mkdir()

    def run(profile, *extra, profile_dir=None, path=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSIM_")}
        env.update(
            GPUSIM_PROFILE_DIR=str(profile_dir or PROFILES / profile),
            GPUSIM_STATE_DIR=str(state),
            PATH=str(bindir) if path is None else path,
        )
        argv = [sys.executable, str(SCRIPT), "--output", str(output), "--proc-root", str(proc), *extra]
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        return result, (parse_exposition(output.read_text()) if output.exists() else None)

    run.state, run.proc, run.bindir, run.output = state, proc, bindir, output
    return run


def by_name(samples):
    out = {}
    for name, labels, value in samples:
        out.setdefault(name, {})[labels.get("gpu")] = value
    return out


def test_end_to_end_idle_h200_vm(host):
    result, samples = host("h200x1-vm", "--engine-unit", ENGINE)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    profile = json.loads((PROFILES / "h200x1-vm" / "profile.json").read_text())
    gpu = profile["gpus"][0]
    assert ("gpufleet_gpu_info", {"gpu": "0", "uuid": gpu["uuid"], "name": "NVIDIA H200"}, 1.0) in samples
    m = by_name(samples)
    assert m["gpufleet_gpu_utilization_ratio"] == {"0": 0.0}
    assert m["gpufleet_gpu_memory_used_bytes"] == {"0": 0.0}
    assert m["gpufleet_gpu_memory_total_bytes"] == {"0": 143771 * MIB}
    assert m["gpufleet_gpu_memory_engine_bytes"] == m["gpufleet_gpu_memory_foreign_bytes"] == {"0": 0.0}
    assert m["gpufleet_gpu_temperature_celsius"] == {"0": gpu["temperature_c"]}
    assert m["gpufleet_gpu_power_watts"] == {"0": gpu["power_draw_w"]}
    assert m["gpufleet_gpu_ecc_errors_corrected_total"] == m["gpufleet_gpu_ecc_errors_uncorrected_total"] == {"0": 0}
    assert m["gpufleet_gpu_xid_errors_total"] == {None: 3}
    assert m["gpufleet_gpu_collector_success"] == {None: 1}
    assert set(m) == set(METRICS)
    assert stat.S_IMODE(host.output.stat().st_mode) == 0o644


def test_end_to_end_engine_foreign_and_leaked_memory(host, sleeper):
    """2x H200: the engine (a live process in sglang-server.service) holds 88000 MiB on each GPU, a user's
    process 1000 MiB on GPU 0 and a process that is gone leaked 2000 MiB on GPU 1."""
    engine, intruder = sleeper().pid, sleeper().pid  # live PIDs (the sleeper fixture: tests/unit/conftest.py)
    allocations = [
        {"pid": engine, "process_name": "sglang::scheduler_TP0", "gpus": {"0": 88000, "1": 88000}},
        {"pid": intruder, "process_name": "/usr/bin/python3", "gpus": {"0": 1000}},
        {"pid": 4194000, "process_name": "sglang::scheduler_TP1", "gpus": {"1": 2000}, "leak": True},
    ]
    for rec in allocations:
        (host.state / f"alloc-{rec['pid']}.json").write_text(json.dumps(rec))
    fake_proc(
        host.proc,
        {
            engine: ("0::/system.slice/sglang-server.service\n", "S"),
            intruder: ("0::/user.slice/user-1001.slice/session-4.scope\n", "S"),
        },
    )
    result, samples = host("h200x2-vm", "--engine-unit", ENGINE, "--engine-unit", "smg-router.service")
    assert result.returncode == 0, result.stderr
    m = by_name(samples)
    assert m["gpufleet_gpu_memory_used_bytes"] == {"0": 89000 * MIB, "1": 90000 * MIB}
    assert m["gpufleet_gpu_memory_engine_bytes"] == {"0": 88000 * MIB, "1": 88000 * MIB}
    assert m["gpufleet_gpu_memory_foreign_bytes"] == {"0": 1000 * MIB, "1": 2000 * MIB}
    # Without --engine-unit every byte in use is foreign.
    _, samples = host("h200x2-vm")
    assert by_name(samples)["gpufleet_gpu_memory_foreign_bytes"] == {"0": 89000 * MIB, "1": 90000 * MIB}


def test_end_to_end_no_driver(host):
    host("h200x1-vm")  # a good reading first: the failure must replace it, not leave stale numbers
    result, samples = host("none", "--engine-unit", ENGINE)
    assert result.returncode == 0
    assert "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in result.stderr
    assert [(n, v) for n, _, v in samples] == [
        ("gpufleet_gpu_collector_success", 0.0),
        ("gpufleet_gpu_collector_last_run_timestamp_seconds", samples[1][2]),
    ]


def test_end_to_end_without_journalctl_or_nvidia_smi(host, tmp_path):
    (host.bindir / "journalctl").unlink()
    result, samples = host("h200x1-vm")
    assert result.returncode == 0
    names = {n for n, _, _ in samples}
    assert "gpufleet_gpu_xid_errors_total" not in names and "gpufleet_gpu_info" in names
    result, samples = host("h200x1-vm", "--nvidia-smi", str(tmp_path / "no-such-nvidia-smi"))
    assert result.returncode == 0 and "no-such-nvidia-smi" in result.stderr
    assert {n: v for n, _, v in samples}["gpufleet_gpu_collector_success"] == 0


def test_end_to_end_gpu_without_ecc(host, tmp_path):
    """A profile whose GPU has no ECC (the table's ECC cell N/A): the simulator answers [N/A] as the real tool
    does, and the ECC metrics are left out."""
    profile_dir = tmp_path / "no-ecc"
    shutil.copytree(PROFILES / "h200x1-vm", profile_dir)
    data = json.loads((profile_dir / "profile.json").read_text())
    data["gpus"][0]["ecc_errors"] = "N/A"
    (profile_dir / "profile.json").write_text(json.dumps(data))
    result, samples = host("no-ecc", profile_dir=profile_dir)
    assert result.returncode == 0, result.stderr
    names = {n for n, _, _ in samples}
    assert not {"gpufleet_gpu_ecc_errors_corrected_total", "gpufleet_gpu_ecc_errors_uncorrected_total"} & names
    assert "gpufleet_gpu_power_watts" in names


def test_a_sick_gpu_names_its_fault():
    """Row remapping pending and failed, the clocks held down by hardware slowdown for heat (0x8 | 0x40), the link
    trained at x8 of x16, and Xid codes by GPU (MIG's GPU-I form included)."""
    (gpu,) = gm.parse_gpu_csv(
        "1, GPU-b, NVIDIA H200, 97, 1200, 143771, 95, 600.00, 0, 2, 00000000:3B:00.0, Yes, Yes, 0x0000000000000048, "
        "5, 5, 8, 16\n"
    )
    kernel = (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=2718, name=python3, GPU has fallen off the bus.\n"
        "NVRM: Xid (PCI:0000:3B:00 GPU-I:01): 94, pid=12, name=python3, Contained: SM (0x1). RST: No\n"
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=2718, name=python3, GPU has fallen off the bus.\n"
    )
    assert gm.xid_codes(kernel) == {("0000:3b:00", 79): 2, ("0000:3b:00", 94): 1}
    samples = parse_exposition(gm.render([gpu], {}, 3, 1.0, gm.xid_codes(kernel)))
    values = {(name, tuple(sorted(labels.items()))): value for name, labels, value in samples}
    g = (("gpu", "1"),)
    assert values[("gpufleet_gpu_remapped_rows_pending", g)] == 1
    assert values[("gpufleet_gpu_remapped_rows_failure", g)] == 1
    active = {dict(k[1])["reason"] for k, v in values.items() if k[0] == "gpufleet_gpu_clock_event_active" and v}
    assert active == {"hw_slowdown", "hw_thermal_slowdown"}
    assert values[("gpufleet_gpu_pcie_link_width", (("gpu", "1"), ("link", "current")))] == 8
    assert values[("gpufleet_gpu_pcie_link_width", (("gpu", "1"), ("link", "max")))] == 16
    assert values[("gpufleet_gpu_xid_code_errors_total", (("code", "79"), ("gpu", "1")))] == 2
    assert values[("gpufleet_gpu_xid_code_errors_total", (("code", "94"), ("gpu", "1")))] == 1
    assert values[("gpufleet_gpu_temperature_celsius", g)] == 95
