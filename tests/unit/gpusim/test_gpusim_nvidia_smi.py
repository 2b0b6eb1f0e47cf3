"""The simulated nvidia-smi (lab/gpusim/nvidia_smi.py), run as a subprocess.

Checked against the real 2x H200 captures (idle: the profile's own lab/gpusim/profiles/h200x2-vm/captures/, which
the renderer must reproduce byte for byte; busy: tests/unit/fixtures/h200x2-vm/busy/), and
through the production parser (plugins/module_utils/nvidia_smi_parse.py).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SIM = REPO / "lab" / "gpusim" / "nvidia_smi.py"
PROFILES = REPO / "lab" / "gpusim" / "profiles"
CAPTURES = PROFILES / "h200x2-vm" / "captures"
BUSY = REPO / "tests" / "unit" / "fixtures" / "h200x2-vm" / "busy"

from ansible_collections.gpufleet.fleet.plugins.module_utils import nvidia_smi_parse as nsp  # noqa: E402

SIM_LINE = "gpufleet lab simulator: this is not NVIDIA's nvidia-smi"
CAPTURE_TS = "Sun Nov 29 20:59:44 2026"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
QUERY_GPU_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,"
    "compute_cap,persistence_mode,power.limit"
)
QUERY_GPU_NOUNITS_FIELDS = "index,pci.bus_id,memory.used,memory.total,compute_cap,driver_version"
QUERY_APPS_FIELDS = "pid,process_name,used_memory,gpu_uuid"
ALL_GPU_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,memory.reserved,"
    "driver_version,compute_cap,persistence_mode,power.limit,mig.mode.current,count"
)
RENDERED_PROFILES = ["h200x2-vm", "h200x1-vm", "rtx-pro-6000x8-vm", "old-driver"]


def fixture_text(name):
    return (CAPTURES / name).read_text(encoding="utf-8")


def p2p_sections():
    parts = re.split(r"^## -p2p (.)\n", fixture_text("topo-p2p.txt"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def load_profile(name):
    return json.loads((PROFILES / name / "profile.json").read_text(encoding="utf-8"))


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "gpusim-state"
    d.mkdir()
    return d


@pytest.fixture
def smi(state_dir):
    """smi(profile, *args, replay=True, timestamp=CAPTURE_TS) -> CompletedProcess."""

    def run(profile, *args, replay=True, timestamp=CAPTURE_TS, profile_dir=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSIM_")}
        env["GPUSIM_PROFILE_DIR"] = str(profile_dir or PROFILES / profile)
        env["GPUSIM_STATE_DIR"] = str(state_dir)
        if timestamp:
            env["GPUSIM_TIMESTAMP"] = timestamp
        if not replay:
            env["GPUSIM_NO_REPLAY"] = "1"
        return subprocess.run([sys.executable, str(SIM), *args], env=env, capture_output=True, text=True, timeout=30)

    return run


def write_alloc(state_dir, pid, gpus, name="sglang::scheduler_TP0", leak=False, starttime=None):
    rec = {"pid": pid, "process_name": name, "gpus": {str(k): v for k, v in gpus.items()}, "leak": leak}
    if starttime is not None:
        rec["starttime"] = starttime
    path = state_dir / f"alloc-{pid}.json"
    path.write_text(json.dumps(rec), encoding="utf-8")
    return path


def proc_starttime(pid):
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 2 :].split()[19])


# ----------------------------------------------------------------------------- the file itself


def test_script_is_single_file_stdlib_with_python3_shebang():
    source = SIM.read_text(encoding="utf-8")
    assert source.startswith("#!/usr/bin/python3\n")
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_profiles_have_the_fields_other_lab_code_reads():
    for name in RENDERED_PROFILES:
        profile = load_profile(name)
        assert profile["name"] == name
        assert profile["simulator"] == "gpufleet lab simulator"
        assert profile["driver_version"]
        for pos, gpu in enumerate(profile["gpus"]):
            assert gpu["index"] == pos
            for key in ("uuid", "pci_bus_id", "memory_total_mib", "memory_reserved_mib", "compute_cap"):
                assert gpu[key] not in (None, "")
        n = len(profile["gpus"])
        assert len(profile["topo_links"]) == n and len(profile["topo_links_pcie"]) == n
        assert set(profile["p2p"]) == set("rwnap")


# ----------------------------------------------------------------------------- h200x2: the captures


@pytest.mark.parametrize("replay", [True, False], ids=["replayed", "rendered"])
@pytest.mark.parametrize(
    ("args", "capture"),
    [
        ((), "nvidia-smi.txt"),
        (("-q",), "nvidia-smi-q.txt"),
        (("topo", "-m"), "topo-m.txt"),
        (("topo", "-mp"), "topo-mp.txt"),
        ((f"--query-gpu={QUERY_GPU_FIELDS}", "--format=csv"), "query-gpu.csv"),
        (
            (f"--query-gpu={QUERY_GPU_NOUNITS_FIELDS}", "--format=csv,noheader,nounits"),
            "query-gpu-nounits.csv",
        ),
        ((f"--query-compute-apps={QUERY_APPS_FIELDS}", "--format=csv"), "query-apps.csv"),
        (("nvlink", "-s"), "nvlink.txt"),
    ],
)
def test_h200x2_idle_outputs_equal_the_captures(smi, args, capture, replay):
    result = smi("h200x2-vm", *args, replay=replay)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == fixture_text(capture)
    assert result.stderr == ""


@pytest.mark.parametrize("replay", [True, False], ids=["replayed", "rendered"])
@pytest.mark.parametrize("mode", list("rwnap"))
def test_h200x2_p2p_equals_the_capture(smi, mode, replay):
    result = smi("h200x2-vm", "topo", "-p2p", mode, replay=replay)
    assert result.returncode == 0
    assert result.stdout == p2p_sections()[mode]


def test_timestamp_is_live_in_the_capture_format(smi):
    plain = smi("h200x2-vm", timestamp=None).stdout.split("\n")
    assert re.fullmatch(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}       ", plain[0])
    assert plain[1:] == fixture_text("nvidia-smi.txt").split("\n")[1:]
    q = smi("h200x2-vm", "-q", timestamp=None).stdout
    expected = fixture_text("nvidia-smi-q.txt")
    assert re.sub(r"(?m)^Timestamp .*$", "", q) == re.sub(r"(?m)^Timestamp .*$", "", expected)


def test_h200x2_busy_state_matches_the_busy_capture(smi, state_dir):
    # The busy capture: pid 1939 held 41478 MiB on each GPU.  It is not alive here, so the
    # entry is registered as leaked (which counts whatever the process).
    write_alloc(state_dir, 1939, {0: 41478, 1: 41478}, name="python3", leak=True)
    table = smi("h200x2-vm").stdout
    busy = (BUSY / "nvidia-smi.txt").read_text()
    assert table.split("\n")[-5:] == busy.split("\n")[-5:]  # process rows and the closing rule
    assert "|   41478MiB / 143771MiB |" in table
    nounits = smi(
        "h200x2-vm", "--query-compute-apps=pid,used_memory,gpu_bus_id", "--format=csv,noheader,nounits"
    ).stdout
    assert nounits == (BUSY / "query-apps-nounits.csv").read_text()
    apps = smi("h200x2-vm", f"--query-compute-apps={QUERY_APPS_FIELDS}", "--format=csv").stdout
    # The busy capture came from another machine of the same kind: only the UUIDs differ.
    uuid_re = r"GPU-[0-9a-f-]{36}"
    expected = (BUSY / "query-apps.csv").read_text()
    assert re.sub(uuid_re, "GPU-x", apps) == re.sub(uuid_re, "GPU-x", expected)
    q = smi("h200x2-vm", "-q", "-i", "0").stdout
    assert "        Used                                           : 41478 MiB\n" in q
    assert "        Free                                           : 101678 MiB\n" in q
    assert "        Process ID                                     : 1939\n" in q
    assert "            Used GPU Memory                            : 41478 MiB\n" in q


# ----------------------------------------------------------------------------- every profile parses


@pytest.mark.parametrize("profile", RENDERED_PROFILES)
def test_every_profile_parses_with_the_production_parser(smi, profile):
    data = load_profile(profile)
    n = len(data["gpus"])
    gpu_names = [f"GPU{i}" for i in range(n)]

    rows = nsp.parse_csv_query(smi(profile, f"--query-gpu={ALL_GPU_FIELDS}", "--format=csv").stdout)
    assert [r["index"] for r in rows] == list(range(n))
    for row, gpu in zip(rows, data["gpus"], strict=True):
        assert row["uuid"] == gpu["uuid"]
        assert row["pci.bus_id"] == gpu["pci_bus_id"]
        assert row["memory.total"] == gpu["memory_total_mib"]
        assert row["memory.reserved"] == gpu["memory_reserved_mib"]
        assert row["memory.used"] == 0
        assert row["memory.free"] == gpu["memory_total_mib"] - gpu["memory_reserved_mib"]
        assert row["driver_version"] == data["driver_version"]
        assert row["count"] == n
        assert row["mig.mode.current"] == "Disabled"
        assert nsp.compute_cap_to_arch(row["compute_cap"]) in ("sm_90", "sm_120")

    nounits = smi(profile, f"--query-gpu={ALL_GPU_FIELDS}", "--format=csv,noheader,nounits").stdout
    assert nsp.parse_csv_query(nounits, header=False, fields=ALL_GPU_FIELDS) == rows

    assert nsp.parse_csv_query(smi(profile, f"--query-compute-apps={QUERY_APPS_FIELDS}", "--format=csv").stdout) == []

    for args, key in ((("topo", "-m"), "topo_links"), (("topo", "-mp"), "topo_links_pcie")):
        topo = nsp.parse_topo_matrix(smi(profile, *args).stdout)
        assert topo["gpus"] == gpu_names
        assert topo["nics"] == []
        for i, a in enumerate(gpu_names):
            assert topo["links"][a] == {b: data[key][i][j] for j, b in enumerate(gpu_names) if i != j}
            assert topo["numa_affinity"][a] == "0"
            assert topo["cpu_affinity"][a] == data["cpu_affinity"]

    for mode in "rwnap":
        p2p = nsp.parse_p2p_matrix(smi(profile, "topo", "-p2p", mode).stdout)
        assert p2p["gpus"] == gpu_names
        assert p2p["missing_rows"] == []
        for i, a in enumerate(gpu_names):
            assert p2p["status"][a] == {b: data["p2p"][mode][i][j] for j, b in enumerate(gpu_names) if i != j}

    header = nsp.parse_smi_header(smi(profile).stdout)
    assert header == {
        "smi_version": data["driver_version"],
        "driver_version": data["driver_version"],
        "cuda_version": data["cuda_version"],
    }
    listed = smi(profile, "-L").stdout.splitlines()
    assert listed == [f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" for g in data["gpus"]]


def test_seed_machine_shape(smi):
    table = smi("rtx-pro-6000x8-vm").stdout
    lines = table.split("\n")
    assert all(len(ln) == 91 for ln in lines[1:] if ln.startswith(("|", "+")))
    assert lines[2] == ("| NVIDIA-SMI 570.172.08             Driver Version: 570.172.08     CUDA Version: 12.8     |")
    assert lines[3] == "|-----------------------------------------+------------------------+----------------------+"
    assert "|   0  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:01:00.0 Off |                    0 |" in lines
    assert "|   7  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:08:00.0 Off |                    0 |" in lines
    assert "| N/A   27C    P8             28W /  600W |       0MiB /  97887MiB |      0%      Default |" in lines
    assert " " * 89 in lines
    topo = nsp.parse_topo_matrix(smi("rtx-pro-6000x8-vm", "topo", "-m").stdout)
    assert {link for row in topo["links"].values() for link in row.values()} == {"PHB"}
    for mode in "rwnap":
        p2p = nsp.parse_p2p_matrix(smi("rtx-pro-6000x8-vm", "topo", "-p2p", mode).stdout)
        assert {s for row in p2p["status"].values() for s in row.values()} == {"NS"}
    q = smi("rtx-pro-6000x8-vm", "-q").stdout
    assert q.count("    Product Name                                       : NVIDIA RTX PRO 6000 Blackwell") == 8
    assert "Attached GPUs                                          : 8\n" in q
    old = smi("old-driver").stdout
    assert "Driver Version: 550.127.05     CUDA Version: 12.4     |" in old


def test_h200x1_is_the_capture_with_one_gpu(smi):
    topo = smi("h200x1-vm", "topo", "-m").stdout
    assert topo.split("\n")[:3] == [
        "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m",
        "GPU0\t X \t0-31\t0\t\tN/A",
        "",
    ]
    q = smi("h200x1-vm", "-q").stdout
    expected = fixture_text("nvidia-smi-q.txt")
    expected = expected[: expected.index("GPU 00000000:00:07.0")].replace(
        "Attached GPUs                                          : 2",
        "Attached GPUs                                          : 1",
    )
    assert q == expected


# ----------------------------------------------------------------------------- allocations


def query_used(smi, profile="h200x2-vm"):
    out = smi(profile, "--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits").stdout
    return {
        r["index"]: (r["memory.used"], r["memory.free"])
        for r in nsp.parse_csv_query(out, header=False, fields="index,memory.used,memory.free")
    }


def test_live_allocation_raises_memory_used_and_lists_the_process(smi, state_dir, sleeper):
    proc = sleeper()
    write_alloc(state_dir, proc.pid, {0: 88000}, starttime=proc_starttime(proc.pid))
    assert query_used(smi) == {0: (88000, 143156 - 88000), 1: (0, 143156)}
    apps = nsp.parse_csv_query(
        smi(
            "h200x2-vm",
            "--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id",
            "--format=csv",
        ).stdout
    )
    assert apps == [
        {
            "pid": proc.pid,
            "process_name": "sglang::scheduler_TP0",
            "used_gpu_memory": 88000,
            "gpu_uuid": "GPU-c0345594-416e-e0e4-2789-de58435583a0",
            "gpu_bus_id": "00000000:00:06.0",
        }
    ]
    table = smi("h200x2-vm").stdout
    assert f"|    0   N/A  N/A {proc.pid:>15}      C   sglang::scheduler_TP0" in table
    assert "No running processes found" not in table
    # -i selects the GPU for queries and the table
    assert smi("h200x2-vm", "--query-compute-apps=pid", "--format=csv,noheader", "-i", "1").stdout == ""
    assert smi("h200x2-vm", "-i", "1").stdout.count("No running processes found") == 1
    # a live allocation turns replay off: the table is rendered with live numbers
    assert table != fixture_text("nvidia-smi.txt")


def test_dead_process_allocation_disappears(smi, state_dir, sleeper):
    proc = sleeper()
    path = write_alloc(state_dir, proc.pid, {0: 1000, 1: 2000})
    assert query_used(smi)[1][0] == 2000
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while query_used(smi)[1][0] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert query_used(smi) == {0: (0, 143156), 1: (0, 143156)}
    assert not path.exists()  # pruned
    assert smi("h200x2-vm").stdout == fixture_text("nvidia-smi.txt")


def test_reused_pid_does_not_count(smi, state_dir, sleeper):
    proc = sleeper()
    write_alloc(state_dir, proc.pid, {0: 5000}, starttime=proc_starttime(proc.pid) - 1)
    assert query_used(smi)[0][0] == 0


def test_leaked_allocation_stays_until_reset(smi, state_dir, sleeper):
    proc = sleeper()
    write_alloc(state_dir, proc.pid, {1: 70000}, leak=True)
    proc.kill()
    proc.wait()
    assert query_used(smi)[1] == (70000, 143156 - 70000)
    apps = smi("h200x2-vm", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").stdout
    assert apps == f"{proc.pid}, 70000\n"
    reset = smi("h200x2-vm", "--gpusim-reset")
    assert reset.returncode == 0
    assert SIM_LINE in reset.stdout
    assert query_used(smi)[1] == (0, 143156)
    assert list(state_dir.iterdir()) == []


def test_garbage_registry_files_are_ignored(smi, state_dir):
    (state_dir / "alloc-1.json").write_text("{not json")
    (state_dir / ".tmp-alloc-2-x.part").write_text('{"pid": 1, "gpus": {"0": 5}, "leak": true}')
    write_alloc(state_dir, 3, {7: 100}, leak=True)  # no GPU 7 on this machine
    assert query_used(smi)[0][0] == 0


# ----------------------------------------------------------------------------- failures and errors


@pytest.mark.parametrize(
    "args",
    [(), ("-L",), ("-q",), ("--query-gpu=index", "--format=csv"), ("topo", "-m"), ("topo", "-p2p", "r")],
)
def test_no_driver_profile_fails_like_the_real_tool(smi, args):
    result = smi("none", *args)
    assert result.returncode == 9
    assert result.stdout == NO_DRIVER
    failure = nsp.parse_driver_failure(result.returncode, result.stdout, result.stderr)
    assert failure and "driver" in failure.lower()


def test_missing_profile_behaves_like_no_driver(smi, tmp_path):
    result = smi("x", profile_dir=tmp_path / "nothing")
    assert result.returncode == 9
    assert result.stdout == NO_DRIVER
    assert SIM_LINE in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--bogus",),
        ("-Z",),
        ("topo",),
        ("topo", "-p2p", "x"),
        ("--query-gpu=index",),  # no --format
        ("--format=csv",),
        ("--query-gpu=index", "--format=json"),
        ("-L", "-q"),
        ("-i",),
    ],
)
def test_unknown_options_fail_like_the_real_tool(smi, args):
    result = smi("h200x2-vm", *args)
    assert result.returncode == 2
    assert result.stdout == "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


@pytest.mark.parametrize("query", ["--query-gpu=index,xyz", "--query-compute-apps=pid,xyz"])
def test_unknown_field_fails_like_the_real_tool(smi, query):
    result = smi("h200x2-vm", query, "--format=csv")
    assert result.returncode == 2
    assert result.stdout == 'Field "xyz" is not a valid field to query.\n\n'
    with pytest.raises(nsp.NvidiaSmiParseError):
        nsp.parse_csv_query(result.stdout)


def test_unknown_gpu_id(smi):
    result = smi("h200x2-vm", "-i", "9")
    assert result.returncode == 6
    assert result.stdout == "No devices were found\n"
    by_uuid = smi(
        "h200x2-vm",
        "--query-gpu=index",
        "--format=csv,noheader",
        "-i",
        "GPU-95f876da-2837-2eab-094c-681759d44f8b",
    )
    assert by_uuid.stdout == "1\n"


def test_real_but_unsimulated_option_is_not_faked(smi):
    result = smi("h200x2-vm", "-x", "-q")
    assert result.returncode == 2
    assert "not simulated" in result.stderr


@pytest.mark.parametrize("profile", [*RENDERED_PROFILES, "none"])
def test_version_and_help_say_simulator(smi, profile):
    version = smi(profile, "--version")
    assert SIM_LINE in version.stdout
    helptext = smi(profile, "-h")
    assert helptext.returncode == 0
    assert SIM_LINE in helptext.stdout
    assert "--gpusim-reset" in helptext.stdout
    if profile != "none":
        assert version.returncode == 0
        assert f"DRIVER version      : {load_profile(profile)['driver_version']}\n" in version.stdout


@pytest.mark.parametrize("profile", RENDERED_PROFILES)
def test_ordinary_outputs_do_not_mention_the_simulator(smi, profile):
    for args in [(), ("-q",), ("-L",), ("topo", "-m"), ("--query-gpu=name", "--format=csv")]:
        assert "simulator" not in smi(profile, *args).stdout


# ----------------------------------------------------------------------------- GPU reset (-r / --gpu-reset)

IN_USE = (
    "The following GPUs could not be reset:\n  GPU 00000000:00:06.0: In use by another client\n\n1 device is "
    "currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics "
    "application such as an X server, or a monitoring application such as another instance of nvidia-smi). "
    "Please first kill all processes using this device and all compute applications running in the system.\n"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="a GPU reset needs root, as on a real host")
def test_gpu_reset_is_refused_while_a_live_process_holds_the_gpu(smi, state_dir, sleeper):
    proc = sleeper()
    write_alloc(state_dir, proc.pid, {0: 5000}, starttime=proc_starttime(proc.pid))
    result = smi("h200x2-vm", "--gpu-reset", "-i", "0")
    assert (result.returncode, result.stdout) == (255, IN_USE)
    assert query_used(smi)[0][0] == 5000  # nothing released


@pytest.mark.skipif(os.geteuid() != 0, reason="a GPU reset needs root, as on a real host")
def test_gpu_reset_releases_a_leaked_allocation_of_a_dead_process(smi, state_dir, sleeper):
    proc = sleeper()
    write_alloc(state_dir, proc.pid, {0: 60000, 1: 70000}, leak=True)
    proc.kill()
    proc.wait()
    result = smi("h200x2-vm", "-r", "-i", "1")
    assert (result.returncode, result.stdout) == (0, "GPU 00000000:00:07.0 was successfully reset.\n")
    assert query_used(smi)[0][0] == 60000 and query_used(smi)[1][0] == 0  # only the reset GPU is freed
    result = smi("h200x2-vm", "--gpu-reset")  # no -i: every GPU
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "GPU 00000000:00:06.0 was successfully reset.",
        "GPU 00000000:00:07.0 was successfully reset.",
    ]
    assert list(state_dir.iterdir()) == []
    assert smi("h200x2-vm", "-r", "-i", "5").returncode == 6
    assert smi("h200x2-vm", "-r", "-q").returncode == 2


# ----------------------------------------------------------------------------- metrics fields (1x H200 captures)

METRICS_CAPTURES = REPO / "tests" / "unit" / "fixtures" / "gpu-hosts" / "h200x1-metrics"
# The query of the real 1x H200 metrics captures (their README's Q): every field node_exporter's GPU script
# and alert work may ask for.
METRICS_FIELDS = re.search(r"^Q = `([^`]+)`", (METRICS_CAPTURES / "README.md").read_text(encoding="utf-8"), re.M).group(
    1
)
# Columns whose values belong to the machine and moment (the capture's H200 is another one than the profile's).
MACHINE_COLUMNS = {"uuid", "temperature.gpu", "temperature.memory", "power.draw", "clocks.sm"}


_spec = importlib.util.spec_from_file_location(
    "gpufleet_gpu_metrics", REPO / "roles/node_exporter/files/gpufleet_gpu_metrics.py"
)
_gm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gm)
METRICS_SCRIPT_FIELDS = list(_gm.GPU_FIELDS)


def metrics_capture(name):
    return (METRICS_CAPTURES / name).read_text(encoding="utf-8")


def shape(value):
    """A value's form: digits and hex letters folded (``116.60 W`` and ``75.36 W`` are both ``x.x W``)."""
    return re.sub(r"[0-9a-f]+", "x", value)


@pytest.mark.parametrize(
    ("fmt", "capture"),
    [("csv", "query-metrics-idle.csv"), ("csv,noheader,nounits", "query-metrics-idle-nounits.csv")],
)
@pytest.mark.parametrize("profile", ["h200x1-vm", "h200x2-vm"])
def test_h200_metrics_query_answers_like_the_real_h200(smi, profile, fmt, capture):
    """Same header (canonical names such as clocks.current.sm, units only where the real tool prints them), same
    value forms, and the real idle values wherever they do not depend on the machine."""
    result = smi(profile, f"--query-gpu={METRICS_FIELDS}", f"--format={fmt}", "-i", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    got, want = result.stdout.splitlines(), metrics_capture(capture).splitlines()
    assert len(got) == len(want)
    if fmt == "csv":
        assert got[0] == want[0]
    fields = METRICS_FIELDS.split(",")
    row, real = got[-1].split(", "), want[-1].split(", ")
    assert len(row) == len(real) == len(fields)
    for field, value, expected in zip(fields, row, real, strict=True):
        assert shape(value) == shape(expected), (field, value, expected)
        if field not in MACHINE_COLUMNS:
            assert value == expected, (field, value, expected)


def test_metrics_fields_with_and_without_units_agree(smi):
    for profile in RENDERED_PROFILES:
        units = smi(profile, f"--query-gpu={METRICS_FIELDS}", "--format=csv").stdout.splitlines()
        bare = smi(profile, f"--query-gpu={METRICS_FIELDS}", "--format=csv,noheader,nounits").stdout.splitlines()
        assert len(units) == len(bare) + 1 == len(load_profile(profile)["gpus"]) + 1
        for with_units, without in zip(units[1:], bare, strict=True):
            assert [re.sub(r" (%|MiB|W|MHz)$", "", v) for v in with_units.split(", ")] == without.split(", ")
        rows = nsp.parse_csv_query("\n".join(units), fields=METRICS_FIELDS)
        assert rows == nsp.parse_csv_query("\n".join(bare), header=False, fields=METRICS_FIELDS)


def test_script_metrics_query_on_the_sim_is_the_real_nounits_shape(smi):
    """node_exporter's gpufleet_gpu_metrics.py query: the simulated H200 prints what the real one printed (the
    link's maximum, which the real 1x capture did not query, as the real 2x H200's -q gives it: Gen5 x16)."""
    fields = METRICS_SCRIPT_FIELDS
    sim = smi("h200x1-vm", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits").stdout
    assert sim == (
        "0, GPU-c0345594-416e-e0e4-2789-de58435583a0, NVIDIA H200, 0, 0, 143771, 33, 75.36, 0, 0, 00000000:00:06.0, "
        "No, No, 0x0000000000000001, 5, 5, 16, 16\n"
    )
    real_row = metrics_capture("query-metrics-idle-nounits.csv").strip().split(", ")
    real = dict(zip(METRICS_FIELDS.split(","), real_row, strict=True))
    sim_cells = dict(zip(fields, sim.strip().split(", "), strict=True))
    assert {f: shape(sim_cells[f]) for f in real if f in sim_cells} == {f: shape(real[f]) for f in real if f in fields}


def test_a_planted_gpu_fault_is_answered_by_the_query_and_by_q(smi, tmp_path):
    """The profile's ``q`` key: a row remapping pending and failed, the link trained at x8."""
    planted = {"Remapped Rows / Pending": "Yes", "Remapped Rows / Remapping Failure Occurred": "Yes",
               "PCI / GPU Link Info / Link Width / Current": "8x"}  # fmt: skip
    profile = profile_copy(tmp_path, "h200x1-vm", q=planted)
    fields = "remapped_rows.pending,remapped_rows.failure,pcie.link.width.current,pcie.link.width.max"
    out = smi("h200x1-vm", f"--query-gpu={fields}", "--format=csv,noheader", profile_dir=profile).stdout
    assert out == "Yes, Yes, 8, 16\n"
    q = smi("h200x1-vm", "-q", profile_dir=profile).stdout
    assert re.search(r"Remapped Rows\n(.*\n)*?\s+Pending\s+: Yes\n\s+Remapping Failure Occurred\s+: Yes\n", q)
    assert re.search(r"Link Width\n\s+Max\s+: 16x\n\s+Current\s+: 8x\n", q)


def test_field_aliases_print_the_canonical_header(smi):
    out = smi(
        "h200x1-vm",
        "--query-gpu=clocks.sm,clocks.current.sm,clocks.mem,clocks.gr,clocks.max.sm,clocks.max.mem,"
        "clocks_throttle_reasons.active,pcie.link.gen.max,pcie.link.width.max,ecc.mode.pending",
        "--format=csv",
    ).stdout
    assert out == (
        "clocks.current.sm [MHz], clocks.current.sm [MHz], clocks.current.memory [MHz], "
        "clocks.current.graphics [MHz], clocks.max.sm [MHz], clocks.max.memory [MHz], clocks_event_reasons.active, "
        "pcie.link.gen.max, pcie.link.width.max, ecc.mode.pending\n"
        "345 MHz, 345 MHz, 3201 MHz, 345 MHz, 1980 MHz, 3201 MHz, 0x0000000000000001, 5, 16, Enabled\n"
    )


def profile_copy(tmp_path, base, **gpu_fields):
    d = tmp_path / f"{base}-custom"
    shutil.copytree(PROFILES / base, d)
    data = json.loads((d / "profile.json").read_text(encoding="utf-8"))
    for gpu in data["gpus"]:
        for key, value in gpu_fields.items():
            if value is None:
                gpu.pop(key, None)
            else:
                gpu[key] = value
    (d / "profile.json").write_text(json.dumps(data), encoding="utf-8")
    return d


ECC_QUERY = "ecc.mode.current,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total"


@pytest.mark.parametrize(
    ("fields", "answer", "cell", "q_mode", "q_dram"),
    [
        ({}, "Enabled, 0, 0", "0", "Enabled", "0"),
        ({"ecc_errors": "N/A"}, "[N/A], [N/A], [N/A]", "N/A", "N/A", "N/A"),
        ({"ecc_errors": None, "ecc_mode": "N/A"}, "[N/A], [N/A], [N/A]", "N/A", "N/A", "N/A"),
        ({"ecc_errors": None, "ecc_mode": "Disabled"}, "Disabled, [N/A], [N/A]", "Off", "Disabled", "N/A"),
        ({"ecc_errors": "2", "ecc_corrected_volatile": 7}, "Enabled, 7, 2", "2", "Enabled", "2"),
    ],
    ids=["h200", "no-ecc", "no-ecc-mode", "ecc-disabled", "errors"],
)
def test_ecc_fields_follow_the_profile(smi, tmp_path, fields, answer, cell, q_mode, q_dram):
    d = profile_copy(tmp_path, "h200x1-vm", **fields)
    out = smi("custom", f"--query-gpu={ECC_QUERY}", "--format=csv,noheader", profile_dir=d).stdout
    assert out == answer + "\n"
    table = smi("custom", profile_dir=d).stdout
    assert f"|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |{cell:>21} |" in table
    q = smi("custom", "-q", profile_dir=d, replay=False).stdout
    assert f"        Current                                        : {q_mode}\n        Pending" in q
    assert f"            DRAM Uncorrectable                         : {q_dram}\n" in q


def test_the_rest_of_the_metrics_fields_follow_the_profile(smi, tmp_path):
    d = profile_copy(
        tmp_path,
        "h200x1-vm",
        fan="45%",
        utilization_memory=25,
        temperature_memory_c=52,
        clocks_event_reasons=4,
    )
    out = smi(
        "custom",
        "--query-gpu=fan.speed,utilization.memory,temperature.memory,clocks_event_reasons.active",
        "--format=csv",
        profile_dir=d,
    ).stdout
    assert out == (
        "fan.speed [%], utilization.memory [%], temperature.memory, clocks_event_reasons.active\n"
        "45 %, 25 %, 52, 0x0000000000000004\n"
    )
