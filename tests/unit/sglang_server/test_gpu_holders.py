"""Foreign GPU holders named by PID, user and command: the role's own readers over the real H200 captures.

tests/unit/fixtures/h200-device/gpu-holder/ holds what a real H200 machine printed while a process of user
``intruder`` (uid 1001) held 21 GiB, while it died, and after (docs/measurements/h200-gpu-release.md), plus
that process's /proc/<pid>/{status,cmdline,cgroup}. The same readers run in the gpu_facts preflight
(deploy.yml's first stage) and in the sglang_server validation (before any stop).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "unit" / "gpu_facts"))

from ansible_collections.gpufleet.fleet.plugins.filter import gpu_facts_filters as gff  # noqa: E402
from ansible_collections.gpufleet.fleet.plugins.module_utils import gpu_facts_collect as gfc  # noqa: E402
from ansible_collections.gpufleet.fleet.plugins.module_utils import nvidia_smi_parse as nsp  # noqa: E402
from ansible_collections.gpufleet.fleet.plugins.module_utils import procfs  # noqa: E402
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_holders as server_holders  # noqa: E402
from gpu_facts_helpers import device_facts  # noqa: E402

CAPTURE = REPO / "tests" / "unit" / "fixtures" / "h200-device" / "gpu-holder"
PROC = str(CAPTURE / "proc")  # holds only /proc/457 (the holder while it held the memory)
USERS = {1001: "intruder"}.get  # `id intruder` there: uid=1001(intruder)
UNIT = "sglang-server.service"
COMMAND = (
    "/opt/torch/.venv/bin/python3 -c \"import torch,time;x=torch.ones(5<<30,device='cuda');"
    "torch.cuda.synchronize();print('ready',flush=True);time.sleep(900)\""
)


def probe_runner(state):
    """nvidia-smi as sglang_server_holders.gpu_state calls it, answered from one captured state."""

    def run(argv, timeout=60):
        query = argv[1]
        if query == "--query-gpu=index,uuid,memory.used":
            return 0, (CAPTURE / f"{state}-query-gpu-probe.csv").read_text(), ""
        if query == "--query-compute-apps=pid,gpu_uuid,used_memory,process_name":
            return 0, (CAPTURE / f"{state}-query-apps-probe.csv").read_text(), ""
        raise AssertionError(f"unexpected command {argv}")

    return run


def probe(state):
    gs = server_holders.gpu_state(runner=probe_runner(state))
    ours, foreign = server_holders.classify_gpu_processes(gs["processes"], UNIT, proc_root=PROC, name_of=USERS)
    return gs, ours, foreign


def test_probe_names_the_live_holder_by_pid_user_and_command():
    gs, ours, foreign = probe("held")
    assert gs["gpus"][0]["memory_used_mib"] == 21099
    assert ours == []
    assert [(f["pid"], f["alive"], f["uid"], f["user"], f["unit"]) for f in foreign] == [
        (457, True, 1001, "intruder", "")
    ]
    assert foreign[0]["cmdline"] == COMMAND
    text = server_holders.describe_processes(foreign)
    assert text == (
        f"pid 457 (/opt/torch/.venv/bin/python3, user intruder, command `{COMMAND}`, GPUs 0, 21090 MiB, unit none)"
    )
    assert server_holders.holders_remedy(foreign).startswith(
        "pid 457: ask user intruder to end it or, as root, kill 457;"
    )


def test_probe_sees_nothing_before_and_after_the_holder():
    for state in ("idle", "after"):
        gs, ours, foreign = probe(state)
        assert gs["processes"] == [] and ours == [] and foreign == []
        assert gs["gpus"][0]["memory_used_mib"] == 0
        assert server_holders.describe_processes(foreign) == "" and server_holders.holders_remedy(foreign) == ""


def test_a_dying_holder_is_listed_as_no_data_and_counts_as_gone():
    """50 ms after SIGKILL nvidia-smi still listed pid 522 as `[No data]` with its memory; /proc had no 522."""
    gs, ours, foreign = probe("dying")
    assert gs["processes"] == [{"pid": 522, "gpu_index": 0, "used_memory_mib": 21090, "name": "[No data]"}]
    assert ours == [] and [(f["pid"], f["alive"], f["user"]) for f in foreign] == [(522, False, None)]
    assert "process gone" in server_holders.describe_processes(foreign)
    assert "a dying process frees it within about 0.3 s" in server_holders.holders_remedy(foreign)
    # 0.2 s after the signal memory.used was 0 while the row was still listed
    gs, _ours, foreign = probe("dying-released")
    assert gs["gpus"][0]["memory_used_mib"] == 0 and [f["pid"] for f in foreign] == [522]


def gpu_facts_processes(state):
    text = (CAPTURE / f"{state}-query-apps-module.csv").read_text()
    rows = nsp.parse_csv_query(text, header=False, fields=gfc.APP_FIELDS)
    uuid = (CAPTURE / "idle-query-gpu-module.csv").read_text().split(", ")[2]
    info = functools.partial(gfc._proc_info, proc_root=PROC, user_name=USERS)
    unit_of = functools.partial(gfc._unit_of, proc_root=PROC)
    return gfc.build_processes(rows, [{"index": 0, "uuid": uuid}], unit_of=unit_of, proc_info=info)


def test_gpu_facts_reads_user_and_command_of_the_holder():
    assert gpu_facts_processes("idle") == []
    (proc,) = gpu_facts_processes("held")
    assert proc["pid"] == 457 and proc["gpu_index"] == 0 and proc["used_memory_mib"] == 21090
    assert (proc["alive"], proc["uid"], proc["user"], proc["cmdline"]) == (True, 1001, "intruder", COMMAND)
    assert proc["unit"] is None  # cgroup `0::/process_api/...`: no systemd unit on that machine


def test_preflight_refuses_the_holder_with_pid_user_command_and_remedy():
    facts = copy.deepcopy(device_facts())
    facts["processes"] = gpu_facts_processes("held")
    facts["gpus"][0]["memory_used_mib"] = 21099
    result = gff.gpu_preflight_problems(
        facts,
        {
            "host": "h200-01",
            "cuda_version": "12.8",
            "cuda_driver_floors": {"12.8": "570.26"},
            "arch_min_cuda": {"sm_90": "11.8"},
            "arch_max_cuda": {},
            "server_args": {"tp": 2},
            "own_units": [UNIT],
            "idle_memory_mib": 512,
        },
    )
    (problem,) = [p for p in result["errors"] if p["check"] == "gpus_busy"]
    assert (
        f"pid 457 /opt/torch/.venv/bin/python3, user intruder, command `{COMMAND}`, on GPU0 using 21090 MiB "
        "(unit none)" in problem["message"]
    )
    assert "Nothing was changed or stopped" in problem["message"]
    assert "pid 457: ask user intruder to end it or, as root, kill 457" in problem["fix"]
    assert "nvidia-smi --query-compute-apps" in problem["text"]


def test_a_holder_inside_an_unrelated_service_is_killed_not_its_service():
    """On the lab (no logind sessions) a user's job started from an ssh login runs in ssh.service."""
    item = {"pid": 486, "gpu_index": 0, "used_memory_mib": 2048, "name": "/usr/bin/python3", "alive": True}
    item |= {"unit": "ssh.service", "user": "intruder", "cmdline": "/usr/bin/python3 /usr/local/bin/gpusim-hold"}
    remedy = server_holders.holders_remedy([item, dict(item, gpu_index=1)])
    assert remedy.startswith("pid 486: ask user intruder to end it or, as root, kill 486; then check")
    assert "systemctl stop" not in remedy and remedy.endswith(server_holders.RESTARTED_BY_UNIT)


def test_preflight_merges_a_holder_of_several_gpus_and_names_a_gone_one():
    rows = [
        {"pid": 4242, "name": "/usr/bin/python3", "used_memory_mib": 20000, "gpu_index": g, "unit": "hold.service"}
        | {"alive": True, "uid": 1001, "user": "intruder", "cmdline": "/usr/bin/python3 /usr/local/bin/gpusim-hold"}
        for g in (1, 0)
    ] + [{"pid": 77, "name": "[No data]", "used_memory_mib": 5000, "gpu_index": 1, "unit": None, "alive": False}]
    holders = gff.gpu_holders(rows)
    assert [(h["pid"], h["gpus"], h["mib"]) for h in holders] == [(77, [1], 5000), (4242, [0, 1], 40000)]
    assert gff.describe_holder(holders[1]) == (
        "pid 4242 /usr/bin/python3, user intruder, command `/usr/bin/python3 /usr/local/bin/gpusim-hold`, "
        "on GPU0,GPU1 using 40000 MiB (unit hold.service)"
    )
    assert "process gone" in gff.describe_holder(holders[0])
    remedy = gff.holders_remedy(holders)
    assert "pid 4242: ask user intruder to end it or, as root, kill 4242;" in remedy
    assert remedy.endswith("restarted by its service (unit above): stop that service if it is the holder's own")
    assert "systemctl stop" not in remedy  # the unit may be ssh.service (a login's job on a host without logind)
    assert "pid 77 is gone" in remedy and "GPU reset" in remedy


HOSTILE = [
    (["python3", "-m", "sglang.launch_server", "--api-key", "s3cr3t", "--port", "30000"], "s3cr3t"),
    (["python3", "serve.py", "--hf-token=hf_abcdef"], "hf_abcdef"),
    (["env", "HF_TOKEN=hf_zzz", "python3", "x.py"], "hf_zzz"),
    (["tool", "--password", "p@ss word"], "p@ss word"),
    (["tool", "--client-secret=xyz123"], "xyz123"),
    (["tool", "--key", "k-999"], "k-999"),
]


@pytest.mark.parametrize(("argv", "secret"), HOSTILE)
def test_command_lines_never_show_secrets(argv, secret):
    shown = procfs.redact_cmdline(argv)
    assert secret not in shown and "***" in shown, shown
    # both roles' readers show command lines through the one procfs copy
    assert gfc.pid_cmdline is procfs.pid_cmdline and server_holders.pid_cmdline is procfs.pid_cmdline


def test_command_lines_keep_ordinary_options_and_are_bounded():
    argv = ["python3", "-m", "sglang.launch_server", "--max-total-tokens", "4096", "--tokenizer-path", "/m"]
    assert procfs.redact_cmdline(argv) == " ".join(argv)
    long = procfs.redact_cmdline(["python3"] + ["x" * 50] * 20)
    assert len(long) == procfs.CMDLINE_MAX and long.endswith("...")


def test_user_of_a_gone_process_is_unknown(tmp_path):
    assert procfs.pid_user(999999, proc_root=str(tmp_path)) == (None, None)
    assert gfc._proc_info(999999, proc_root=str(tmp_path))["alive"] is False
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "status").write_text("Name:\tpython3\nState:\tZ (zombie)\nUid:\t1001\t1001\t1001\t1001\n")
    assert procfs.pid_alive(5, proc_root=str(tmp_path)) is False
    assert gfc._proc_info(5, proc_root=str(tmp_path))["alive"] is False


def test_the_running_process_reads_as_its_own_user():
    uid, name = procfs.pid_user(os.getpid())
    assert uid == os.getuid() and name
    assert procfs.pid_alive(os.getpid())
