"""roles/sglang_server/files/sglang-log-redact.py: the unit's main process. Redaction, SIGTERM to the engine's
main process only, and the exit status systemd sees (137 after a drain, a SIGKILL of its own after a crash)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LAUNCHER = ROOT / "roles/sglang_server/files/sglang-log-redact.py"
sys.path.insert(0, str(ROOT / "tests/unit/sglang_sim"))

from sglang_sim_helpers import SIM_SRC, Sim, pid_alive  # noqa: E402

# An engine like SGLang 0.5.9: a child without a SIGTERM handler (it notes the signal in a file), a main process
# that drains on SIGTERM and then SIGKILLs its child and itself (kill_process_tree(include_parent=True)).
FAKE_ENGINE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    marks = sys.argv[1]
    child = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\\n"
        "def note(s, f):\\n"
        f"    open({marks!r} + '/child-got-sigterm', 'w').close(); sys.exit(0)\\n"
        "signal.signal(signal.SIGTERM, note)\\n"
        "time.sleep(60)\\n")])
    def drain(signum, frame):
        open(marks + "/main-got-sigterm", "w").close()
        print("Gracefully exiting... Remaining number of requests 0.", flush=True)
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    signal.signal(signal.SIGTERM, drain)
    print("engine up, api_key='" + os.environ.get("KEY_SEEN", "") + "' " + sys.argv[2], flush=True)
    time.sleep(60)
    """
)


def launch(tmp_path: Path, *engine: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(LAUNCHER), "--", *engine],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        text=True,
    )


def wait_line(proc: subprocess.Popen, needle: str) -> str:
    for line in proc.stdout:
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} never printed")


def test_sigterm_reaches_the_engine_main_only_and_the_drain_exits_137(tmp_path):
    engine = tmp_path / "engine.py"
    engine.write_text(FAKE_ENGINE)
    proc = launch(tmp_path, sys.executable, str(engine), str(tmp_path), "sk-s3cret-value")
    assert "sk-s3cret-value" in wait_line(proc, "engine up")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 137
    assert (tmp_path / "main-got-sigterm").exists()
    assert not (tmp_path / "child-got-sigterm").exists()  # SGLang's schedulers would have died mid-request


def test_secret_values_are_masked(tmp_path):
    engine = tmp_path / "engine.py"
    engine.write_text(FAKE_ENGINE)
    proc = launch(
        tmp_path,
        sys.executable,
        str(engine),
        str(tmp_path),
        "token hf_abcdef123 and key sk-s3cret-value",
        env={"SGLANG_SERVER_API_KEY": "sk-s3cret-value", "HF_TOKEN": "hf_abcdef123"},
    )
    line = wait_line(proc, "engine up")
    assert "sk-s3cret-value" not in line and "hf_abcdef123" not in line and line.count("[REDACTED]") == 2
    assert "api_key=''" in line  # the key is not in the engine's environment
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 137


def test_engine_killed_without_a_stop_request_is_a_failure(tmp_path):
    engine = tmp_path / "engine.py"
    engine.write_text("import os, signal; print('up', flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = launch(tmp_path, sys.executable, str(engine))
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL  # systemd: "killed by signal KILL", not the clean 137
    assert "the engine was killed by SIGKILL without a stop request" in out


def test_exit_status_of_the_engine_is_kept(tmp_path):
    proc = launch(tmp_path, sys.executable, "-c", "import sys; sys.exit(3)")
    assert proc.wait(timeout=10) == 3


def test_launcher_exits_with_the_engine_even_when_leftovers_hold_the_pipe(tmp_path):
    # a leftover (an orphan child) keeps the output pipe open: the launcher must not wait for it, so that
    # systemd's final SIGKILL (KillMode=mixed) reaches it
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print('x')"
    proc = launch(tmp_path, sys.executable, "-c", code)
    t0 = time.monotonic()
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 5


def test_simulated_engine_drains_a_request_under_the_launcher(tmp_path):
    """The whole chain without systemd: launcher -> sglang-sim (0.5.9 shutdown); SIGTERM to the launcher."""
    sim = Sim(tmp_path, ["--tp", "2"], env={"SGLANG_SIM_TOKENS_PER_S": "40"})
    sim.env["PYTHONPATH"] = str(SIM_SRC)
    log = open(sim.log_path, "wb")  # noqa: SIM115
    sim.proc = subprocess.Popen(
        [sys.executable, str(LAUNCHER), "--", sys.executable, "-m", "sglang_sim.launch_server", *sim.args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=sim.env,
    )
    sim._log = log
    try:
        sim.wait_ready()
        engine_pids = [p for p in (int(x) for x in os.listdir("/proc") if x.isdigit()) if _ppid(p) == sim.pid]
        assert len(engine_pids) == 1
        kids = [p for p in (int(x) for x in os.listdir("/proc") if x.isdigit()) if _ppid(p) == engine_pids[0]]
        assert len(kids) == 3
        out = {}

        def request():
            r = sim.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}})
            out["tokens"] = r.json()["meta_info"]["completion_tokens"]
            out["finish"] = r.json()["meta_info"]["finish_reason"]["type"]

        t = threading.Thread(target=request)
        t.start()
        time.sleep(0.3)
        sim.proc.send_signal(signal.SIGTERM)
        t.join(timeout=15)
        assert out == {"tokens": 60, "finish": "length"}
        assert sim.proc.wait(timeout=10) == 137
        assert "Gracefully exiting... Remaining number of requests 1." in sim.log()
        assert not any(pid_alive(p) for p in [*engine_pids, *kids])
    finally:
        sim.stop()


def _ppid(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(text[text.rfind(")") + 2 :].split()[1])
