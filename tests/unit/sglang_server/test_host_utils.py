"""plugins/module_utils/sglang_server_{command,systemd,journal,holders,http}.py and procfs.py over captures from a
lab host (systemctl show, ss, journalctl -o json, /proc/<pid>/cgroup: tests/unit/fixtures/sglang-server-lab/), a
fake /proc tree, the lab's simulated nvidia-smi (same formats as the real one) and a loopback HTTP server."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from ansible_collections.gpufleet.fleet.plugins.module_utils import procfs
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_command as server_command
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_holders as server_holders
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_http as server_http
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_journal as server_journal
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_systemd as server_systemd
from conftest import LAB_CAPTURES, REPO

UNIT = "sglang-server.service"


def replay(outputs: dict, calls: list | None = None):
    """A runner answering argv tuples from a dict (value: stdout, or (rc, stdout, stderr))."""

    def run(argv, timeout=60):
        if calls is not None:
            calls.append(list(argv))
        out = outputs[tuple(argv)]
        return out if isinstance(out, tuple) else (0, out, "")

    return run


def capture(name: str) -> str:
    return (LAB_CAPTURES / name).read_text()


def fake_proc(root, pid, cgroup: str, state="S", cmdline=b"python3\0-m\0x\0"):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    (d / "stat").write_text(f"{pid} (python3) {state} 1 {pid} {pid} 0 -1 4194560 0 0")
    (d / "status").write_text(f"Name:\tpython3\nState:\t{state} (sleeping)\nPid:\t{pid}\nUid:\t0\t0\t0\t0\n")
    (d / "cmdline").write_bytes(cmdline)
    return d


# ---------------------------------------------------------------- systemd unit state


def test_unit_state_of_a_running_server_from_systemctl_show():
    calls = []
    argv = ("systemctl", "show", UNIT, "--property=" + ",".join(server_systemd.UNIT_PROPS))
    state = server_systemd.unit_state(UNIT, runner=replay({argv: capture("systemctl-show-active.txt")}, calls))
    assert calls == [list(argv)]
    assert state["active_state"] == "active" and state["sub_state"] == "running"
    assert state["main_pid"] == 317 and state["n_restarts"] == 0
    assert state["invocation_id"] == "fbf24427cb1d4dae8c4ac9fbdc5a171c"
    assert state["exec_main_start_monotonic_us"] == 518144360
    assert state["fragment_path"] == "/etc/systemd/system/sglang-server.service"
    assert "error" not in state


def test_unit_state_when_systemctl_fails_is_unknown_with_the_error():
    argv = ("systemctl", "show", UNIT, "--property=" + ",".join(server_systemd.UNIT_PROPS))
    err = "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
    state = server_systemd.unit_state(UNIT, runner=replay({argv: (1, "", err)}))
    assert state["active_state"] == "unknown" and state["main_pid"] == 0 and state["n_restarts"] == 0
    assert state["error"].startswith("System has not been booted with systemd")


def test_run_reports_a_missing_program_and_a_timeout():
    assert server_command.run(["/nonexistent/program"])[0] == 127
    rc, _out, err = server_command.run(["sleep", "5"], timeout=0.2)
    assert rc == 124 and "timed out" in err


# ---------------------------------------------------------------- processes by cgroup (/proc)


def test_pid_unit_reads_the_unit_from_a_hybrid_cgroup_file(tmp_path):
    fake_proc(tmp_path, 317, capture("proc-cgroup-unit.txt"))
    fake_proc(tmp_path, 1, capture("proc-cgroup-init.txt"))
    assert procfs.pid_unit(317, str(tmp_path)) == UNIT
    assert procfs.pid_unit(1, str(tmp_path)) == "init.scope"
    assert procfs.pid_unit(4242, str(tmp_path)) is None  # gone


def test_pid_unit_of_a_user_session_and_of_no_unit(tmp_path):
    fake_proc(tmp_path, 10, "0::/user.slice/user-0.slice/session-3.scope\n")
    fake_proc(tmp_path, 11, "0::/\n")
    assert procfs.pid_unit(10, str(tmp_path)) == "session-3.scope"
    assert procfs.pid_unit(11, str(tmp_path)) == ""


def test_unit_pids_lists_live_processes_of_the_unit_only(tmp_path):
    fake_proc(tmp_path, 317, "0::/system.slice/sglang-server.service\n")
    fake_proc(tmp_path, 321, "0::/system.slice/sglang-server.service\n")
    fake_proc(tmp_path, 330, "0::/system.slice/sglang-server.service\n", state="Z")  # zombie: not alive
    fake_proc(tmp_path, 400, "0::/system.slice/foreign-listener.service\n")
    (tmp_path / "self").mkdir()
    assert procfs.unit_pids(UNIT, str(tmp_path)) == [317, 321]
    assert procfs.pid_alive(317, str(tmp_path)) and not procfs.pid_alive(330, str(tmp_path))
    assert procfs.unit_pids(UNIT, str(tmp_path / "missing")) == []


def test_pid_cmdline_joins_argv(tmp_path):
    fake_proc(tmp_path, 5, "0::/\n", cmdline=b"/opt/ml-env/releases/a/bin/python\0-m\0sglang.launch_server\0")
    assert procfs.pid_cmdline(5, str(tmp_path)) == "/opt/ml-env/releases/a/bin/python -m sglang.launch_server"
    assert procfs.pid_cmdline(6, str(tmp_path)) == ""


# ---------------------------------------------------------------- GPUs (nvidia-smi formats)


GPU_ARGV = ("nvidia-smi", "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits")
APPS_ARGV = (
    "nvidia-smi",
    "--query-compute-apps=pid,gpu_uuid,used_memory,process_name",
    "--format=csv,noheader,nounits",
)
# The real 2x H200 capture while PID 1939 held 41478 MiB on each GPU (tests/unit/fixtures/h200x2-vm/busy/:
# query-apps.csv, query-gpu.csv), in the columns and format this module asks for.
UUIDS = ("GPU-483b2718-0f2f-e111-88e6-125b57dd46ad", "GPU-2b001742-6c30-a5de-f6d7-8a2f2de0c67d")


def test_gpu_state_maps_processes_to_gpu_indexes():
    outputs = {
        GPU_ARGV: f"0, {UUIDS[0]}, 41487\n1, {UUIDS[1]}, 41487\n",
        APPS_ARGV: f"1939, {UUIDS[0]}, 41478, python3\n1939, {UUIDS[1]}, 41478, python3\n",
    }
    gs = server_holders.gpu_state(runner=replay(outputs))
    assert gs["gpus"] == {
        0: {"uuid": UUIDS[0], "memory_used_mib": 41487},
        1: {"uuid": UUIDS[1], "memory_used_mib": 41487},
    }
    assert gs["processes"] == [
        {"pid": 1939, "gpu_index": 0, "used_memory_mib": 41478, "name": "python3"},
        {"pid": 1939, "gpu_index": 1, "used_memory_mib": 41478, "name": "python3"},
    ]


def test_gpu_state_reads_not_available_memory_as_zero_and_skips_junk_rows():
    outputs = {
        GPU_ARGV: f"0, {UUIDS[0]}, [N/A]\n\n",
        APPS_ARGV: f"1939, {UUIDS[0]}, [N/A], python3\nNo running processes found\n",
    }
    gs = server_holders.gpu_state(runner=replay(outputs))
    assert gs["gpus"][0]["memory_used_mib"] == 0
    assert gs["processes"] == [{"pid": 1939, "gpu_index": 0, "used_memory_mib": 0, "name": "python3"}]


def test_gpu_state_raises_with_nvidia_smi_s_message():
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    with pytest.raises(RuntimeError, match="couldn't communicate with the NVIDIA driver"):
        server_holders.gpu_state(runner=replay({GPU_ARGV: (9, msg, "")}))


def test_gpu_state_over_the_lab_nvidia_smi(tmp_path):
    """The same queries answered by the lab's simulated nvidia-smi (the real command's formats)."""
    import os
    import subprocess
    import sys

    profile = REPO / "lab/gpusim/profiles/h200x2-vm"
    env = dict(os.environ, GPUSIM_PROFILE_DIR=str(profile), GPUSIM_STATE_DIR=str(tmp_path))

    def run(argv, timeout=60):
        proc = subprocess.run([sys.executable, str(REPO / "lab/gpusim/nvidia_smi.py"), *argv[1:]],
                              capture_output=True, text=True, env=env, check=False)  # fmt: skip
        return proc.returncode, proc.stdout, proc.stderr

    gs = server_holders.gpu_state(runner=run)
    assert sorted(gs["gpus"]) == [0, 1] and all(g["uuid"].startswith("GPU-") for g in gs["gpus"].values())
    assert gs["processes"] == []


def test_classify_splits_ours_foreign_and_leaked(tmp_path):
    fake_proc(tmp_path, 321, "0::/system.slice/sglang-server.service\n", cmdline=b"sglang::scheduler_TP0\0")
    fake_proc(tmp_path, 900, "0::/user.slice/user-1000.slice/session-4.scope\n", cmdline=b"python3\0train.py\0")
    procs = [
        {"pid": 321, "gpu_index": 0, "used_memory_mib": 88000, "name": "sglang::scheduler_TP0"},
        {"pid": 900, "gpu_index": 1, "used_memory_mib": 2000, "name": "python3"},
        {"pid": 777, "gpu_index": 1, "used_memory_mib": 50000, "name": "sglang::scheduler_TP1"},  # gone
        {"pid": 900, "gpu_index": 5, "used_memory_mib": 2000, "name": "python3"},  # not a server GPU
    ]
    ours, foreign = server_holders.classify_gpu_processes(procs, UNIT, gpus=[0, 1], proc_root=str(tmp_path))
    assert [p["pid"] for p in ours] == [321] and ours[0]["unit"] == UNIT
    assert [(p["pid"], p["alive"], p["unit"]) for p in foreign] == [
        (900, True, "session-4.scope"),
        (777, False, None),
    ]
    assert foreign[0]["cmdline"] == "python3 train.py"
    text = server_holders.describe_processes(foreign)
    assert text == (
        "pid 777 (sglang::scheduler_TP1, GPUs 1, 50000 MiB, process gone: leaked allocation); "
        "pid 900 (python3, user root, command `python3 train.py`, GPUs 1, 2000 MiB, unit session-4.scope)"
    )


def test_describe_merges_one_pid_over_several_gpus():
    items = [
        {"pid": 1939, "gpu_index": 1, "used_memory_mib": 41478, "name": "python3", "alive": True, "unit": None},
        {"pid": 1939, "gpu_index": 0, "used_memory_mib": 41478, "name": "python3", "alive": True, "unit": None},
    ]
    assert (
        server_holders.describe_processes(items) == "pid 1939 (python3, user unknown, GPUs 0,1, 82956 MiB, unit none)"
    )


def test_not_released_message_names_the_holders():
    snap = {
        "unit_pids": [],
        "gpu_ours": [],
        "gpu_foreign": [
            {"pid": 777, "gpu_index": 0, "used_memory_mib": 50000, "name": "sglang::scheduler_TP0", "alive": False}
        ],
        "gpu_memory_used_mib": {"0": 50384, "1": 384},
    }
    msg = server_holders.not_released_message(snap, UNIT, 10.04, 512)
    assert msg.startswith("GPU memory not released 10.0 s after stopping sglang-server.service: ")
    assert "pid 777 (sglang::scheduler_TP0, GPUs 0, 50000 MiB, process gone: leaked allocation)" in msg
    assert "GPU reset or a reboot" in msg
    snap2 = {"unit_pids": [321], "gpu_ours": [], "gpu_foreign": [], "gpu_memory_used_mib": {"0": 9000}}
    msg2 = server_holders.not_released_message(snap2, UNIT, 3, 512)
    assert "processes still in sglang-server.service: [321]" in msg2
    assert "GPU memory used with no process listed: {'0': 9000} MiB" in msg2


# ---------------------------------------------------------------- port listeners (ss)


def test_listeners_from_ss_output():
    argv = ("ss", "-ltnpH", "sport = :8000")
    got = server_holders.listeners(8000, runner=replay({argv: capture("ss-ltnpH-8000.txt")}))
    assert got == [{"local": "0.0.0.0:8000", "pids": [317]}]
    # a listener of another network namespace or user shows no process: it is still a listener
    assert server_holders.listeners(8000, runner=replay({argv: "LISTEN 0 4096 [::]:8000 [::]:*\n"})) == [
        {"local": "[::]:8000", "pids": []}
    ]
    assert server_holders.listeners(8000, runner=replay({argv: (1, "", "ss: not found")})) == []


# ---------------------------------------------------------------- journal and start-up phases


def test_journal_lines_of_one_start_and_its_phase_timeline():
    calls = []
    inv = "fbf24427cb1d4dae8c4ac9fbdc5a171c"
    argv = ("journalctl", "--no-pager", "-o", "json", f"_SYSTEMD_INVOCATION_ID={inv}")
    entries = server_journal.journal_lines(
        UNIT, inv, runner=replay({argv: capture("journal-start-ready.jsonl")}, calls)
    )
    assert calls == [list(argv)]
    assert len(entries) == 51
    assert all(isinstance(ts, float) and ts > 1.7e9 for ts, _ in entries)
    assert [ts for ts, _ in entries] == sorted(ts for ts, _ in entries)
    timeline = server_journal.phase_timeline(entries)
    phases = [t["phase"] for t in timeline]
    assert phases[0] == "starting" and phases[-1] == "ready"
    assert phases == [
        "starting",
        "loading weights",
        "weights loaded",
        "KV cache allocated",
        "capturing CUDA graphs",
        "CUDA graphs captured",
        "ready",
    ]
    assert server_journal.current_phase(timeline) == "ready"
    assert server_journal.current_phase(server_journal.phase_timeline(entries[:5])) != "ready"
    assert server_journal.current_phase([]) == "process started"


def test_journal_lines_of_a_start_also_match_its_main_process():
    """A process that crashes at once leaves lines journald could not tie to the unit (it read the cgroup after
    the exit): they carry only _PID. The start's lines are its invocation OR its main process since it started."""
    calls = []
    inv = "fbf24427cb1d4dae8c4ac9fbdc5a171c"
    line = json.dumps({"__REALTIME_TIMESTAMP": "1764521684000000", "_PID": "4242", "MESSAGE": "RuntimeError: x"})
    argv = (
        "journalctl", "--no-pager", "-o", "json",
        f"_SYSTEMD_INVOCATION_ID={inv}", "+", "_PID=4242", "--since=@1764521683",
    )  # fmt: skip
    entries = server_journal.journal_lines(
        UNIT, inv, runner=replay({argv: line}, calls), main_pid=4242, since=1764521683.6
    )
    assert calls == [list(argv)]
    assert entries == [(1764521684.0, "RuntimeError: x")]
    # no main process known (0): the invocation alone, as before
    assert server_journal.journal_match(UNIT, inv, 0, 1764521683.6) == [f"_SYSTEMD_INVOCATION_ID={inv}"]
    # the rollback's excerpt (filter sglang_journal_match): the start as systemd prints it; no invocation known,
    # the unit since the stop
    started = "Mon 2026-12-01 03:55:32 UTC"
    assert server_journal.journal_match(UNIT, inv, 4242, started) == [
        f"_SYSTEMD_INVOCATION_ID={inv}", "+", "_PID=4242", f"--since={started}"
    ]  # fmt: skip
    assert server_journal.journal_match(UNIT, "", 0, "", 1764521683.6) == ["-u", UNIT, "--since=@1764521683"]


def test_journal_lines_decode_binary_messages_and_skip_bad_lines():
    argv = ("journalctl", "--no-pager", "-o", "json", "-u", UNIT, "-b", "-n", "5")
    raw = "\n".join(
        [
            json.dumps({"__REALTIME_TIMESTAMP": "1764521684000000", "MESSAGE": list(b"caf\xc3\xa9 \x1b[0m ok")}),
            "not json",
            json.dumps({"__REALTIME_TIMESTAMP": "1764521685000000", "MESSAGE": None}),
        ]
    )
    entries = server_journal.journal_lines(UNIT, runner=replay({argv: raw}), lines=5)
    assert entries == [(1764521684.0, "café \x1b[0m ok"), (1764521685.0, "")]


def test_phase_timeline_keeps_the_first_time_of_each_phase_and_sees_the_drain():
    entries = [
        (1.0, "server_args=ServerArgs(model_path='/m')"),
        (2.0, "[TP0] Load weight begin. avail mem=93.00 GB"),
        (3.0, "[TP1] Load weight begin. avail mem=93.00 GB"),
        (4.0, "The server is fired up and ready to roll!"),
        (9.0, "Gracefully exiting... Remaining number of requests 0"),
    ]
    timeline = server_journal.phase_timeline(entries)
    assert timeline == [
        {"phase": "starting", "at": 1.0},
        {"phase": "loading weights", "at": 2.0},
        {"phase": "ready", "at": 4.0},
        {"phase": "draining", "at": 9.0},
    ]


# ---------------------------------------------------------------- HTTP


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"")
        else:
            self._send(401, b'{"error": "Unauthorized"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, json.dumps({"echo": json.loads(body), "auth": self.headers.get("Authorization")}).encode())

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_status_body_and_errors(server):
    assert server_http.http("GET", server + "/health")[:2] == (200, "")
    status, text, _ = server_http.http("GET", server + "/v1/models")
    assert status == 401 and json.loads(text) == {"error": "Unauthorized"}
    status, text, _ = server_http.http("POST", server + "/x", body={"a": 1}, headers={"Authorization": "Bearer k"})
    assert status == 200 and json.loads(text) == {"echo": {"a": 1}, "auth": "Bearer k"}
    status, text, _ = server_http.http("GET", "http://127.0.0.1:9/health", timeout=2)  # nothing listens on port 9
    assert status == 0 and "refused" in text.lower()
