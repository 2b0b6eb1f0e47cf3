"""sglang-sim runtime faults (lab equipment): SGLANG_SIM_FAULT_FILE turns a healthy running server bad."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from sglang_sim import faults

PARIS_Q = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 400}


def answer(s) -> str:
    r = s.post("/v1/chat/completions", PARIS_Q)
    assert r.status == 200
    return r.json()["choices"][0]["message"]["content"]


def write(path, text: str) -> None:
    """Write and move the mtime on (a rewrite within the same clock tick keeps the old mtime)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_fault_source_merges_rereads_on_change_and_refuses_start_faults(tmp_path, capfd):
    f = tmp_path / "faults"
    src = faults.FaultSource(faults.Faults(wrong_answer=True), path=str(f))
    assert src.current() == faults.Faults(wrong_answer=True)  # no file: the start-time faults
    write(f, "nan-output, crash-on-start, bogus\nhang-after-ready")
    cur = src.current()
    assert cur.wrong_answer and cur.nan_output and cur.hang_after_ready and not cur.crash_on_start
    err = capfd.readouterr().err
    assert "refused 'crash-on-start' (not a runtime fault" in err and "refused 'bogus' (unknown fault" in err
    assert "runtime fault injection (SGLANG_SIM_FAULT_FILE=" in err and "nan-output, hang-after-ready" in err
    # an unchanged stamp (mtime, size, inode) is not read again, even if the bytes changed
    st = f.stat()
    f.write_text("".ljust(st.st_size))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and src.current().nan_output
    write(f, "")
    assert src.current() == faults.Faults(wrong_answer=True)
    f.unlink()
    assert src.current() == faults.Faults(wrong_answer=True)


def test_fault_source_reads_only_on_change(tmp_path, monkeypatch):
    f = tmp_path / "faults"
    f.write_text("wrong-answer")
    src = faults.FaultSource(faults.Faults(), path=str(f))
    reads = []
    real_open = open

    def counting_open(*a, **kw):
        reads.append(a[0])
        return real_open(*a, **kw)

    monkeypatch.setattr("builtins.open", counting_open)
    for _ in range(50):
        assert src.current().wrong_answer
    assert reads == [str(f)]  # one read, then one stat per call


def test_a_healthy_server_starts_answering_wrong_then_recovers(make_sim, tmp_path):
    f = tmp_path / "runtime-faults"
    s = make_sim(env={"SGLANG_SIM_FAULT_FILE": str(f)}).wait_ready()
    assert answer(s).endswith("The capital of France is Paris.")
    write(f, "wrong-answer")
    assert answer(s).endswith("The capital of France is Berlin.")
    assert s.status("/health") == 200  # health stays green: that's the point
    write(f, "nan-output")
    r = s.post("/v1/chat/completions", {**PARIS_Q, "max_tokens": 32})
    assert r.json()["choices"][0]["message"]["content"] == "!" * 32
    f.unlink()
    assert answer(s).endswith("The capital of France is Paris.")
    log = s.log()
    assert "runtime fault injection (SGLANG_SIM_FAULT_FILE=" in log and ": wrong-answer" in log


def test_start_faults_in_the_file_are_refused_and_start_faults_stay(make_sim, tmp_path):
    f = tmp_path / "runtime-faults"
    f.write_text("crash-after-load, leak-gpu-memory")
    s = make_sim(env={"SGLANG_SIM_FAULT_FILE": str(f), "SGLANG_SIM_FAULT": "wrong-answer"}).wait_ready()
    assert answer(s).endswith("Berlin.")  # the start-time fault
    log = s.log()
    assert "refused 'crash-after-load' (not a runtime fault" in log
    assert "refused 'leak-gpu-memory' (not a runtime fault" in log
    assert s.get("/server_info").json()["simulator_faults"] == ["wrong-answer"]


def test_hang_after_ready_at_runtime(make_sim, tmp_path):
    f = tmp_path / "runtime-faults"
    s = make_sim(env={"SGLANG_SIM_FAULT_FILE": str(f), "SGLANG_HEALTH_CHECK_TIMEOUT": "2"}).wait_ready()
    assert answer(s).endswith("Paris.")
    write(f, "hang-after-ready")
    t0 = time.monotonic()
    assert s.get("/health", timeout=10).status == 503  # the health generation never gets its token
    assert time.monotonic() - t0 >= 2.0
    with pytest.raises(TimeoutError):
        s.post("/v1/chat/completions", PARIS_Q, timeout=1.5)
    f.unlink()  # a stuck scheduler does not come back
    with pytest.raises(TimeoutError):
        s.post("/v1/chat/completions", PARIS_Q, timeout=1.5)
    assert "hang-after-ready (runtime fault): the scheduler stops producing tokens" in s.log()


def test_a_stopped_scheduler_stops_every_token_until_it_goes_on(make_sim):
    """SGLang 0.5.9 makes every token in its scheduler processes, the TP ranks in lockstep: SIGSTOP of one rank's
    scheduler leaves the main process answering HTTP while no request gets a token; SIGCONT lets them go on."""
    s = make_sim().wait_ready()
    assert answer(s).endswith("The capital of France is Paris.")
    cmdlines = {pid: Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ") for pid in s.children()}
    rank0 = [pid for pid, cmd in cmdlines.items() if "sglang_sim.scheduler --tp-rank 0" in cmd]
    assert len(rank0) == 1, cmdlines
    os.kill(rank0[0], signal.SIGSTOP)
    done = {}

    def ask() -> None:
        r = s.post("/v1/chat/completions", PARIS_Q, timeout=120)
        done["text"] = r.json()["choices"][0]["message"]["content"]

    try:
        t = threading.Thread(target=ask, daemon=True)
        t.start()
        t.join(8)  # the answer takes well under a second on a server whose ranks all run
        assert "text" not in done
        assert f"TP rank 0's scheduler (pid {rank0[0]}) is stopped: no token for any request" in s.log()
        assert s.get("/get_model_info", timeout=5).status == 200  # the main process itself answers
    finally:
        os.kill(rank0[0], signal.SIGCONT)
    t.join(60)
    assert done["text"].endswith("The capital of France is Paris.")
    assert f"TP rank 0's scheduler (pid {rank0[0]}) runs again" in s.log()
