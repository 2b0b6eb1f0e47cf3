"""The progress lines of the job_wait action (the one pattern for long waits): what a user reads while a
model downloads, an ml-env step runs or the server starts."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.action import job_wait
from module_runner import run_module  # tests/support


def test_a_phase_record_prints_the_phase_and_its_message():
    line = job_wait.progress_line(
        "sglang_server",
        "gpu-01",
        "sglang-server.service",
        {"phase": "capturing CUDA graphs", "message": "after 41.2 s (/health 503)"},
    )
    assert line == "sglang_server [gpu-01] sglang-server.service: capturing CUDA graphs after 41.2 s (/health 503)"


def test_a_log_step_prints_the_last_non_empty_line_of_its_log():
    tail = "Resolved 212 packages\n Downloading torch (845.2MiB)\n\n"
    line = job_wait.log_line("ml_env", "gpu-01", "uv pip sync production", 65, tail)
    assert line == "ml_env [gpu-01] uv pip sync production: running 1m05s: Downloading torch (845.2MiB)"
    assert job_wait.log_line("ml_env", "gpu-01", "build", 3, "").endswith("running 3s: (no output yet)")


def test_durations_read_as_a_person_would():
    assert [job_wait.duration(s) for s in (None, 9, 61, 3725)] == ["?", "9s", "1m01s", "1h02m05s"]


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "async-job"


def test_a_poll_reads_the_job_file_as_async_status_does():
    """job_wait polls with `cat` of the job file (no module on the host) and only calls async_status once the
    file says the job ended: the files are ansible-core 2.19's own (fixtures/async-job/README.md)."""
    assert job_wait.job_file_ended((FIXTURES / "running.json").read_text()) is False
    assert job_wait.job_file_ended((FIXTURES / "finished-ok.json").read_text()) is True
    assert job_wait.job_file_ended((FIXTURES / "finished-failed.json").read_text()) is True
    # a file still being written (empty or cut) is a running job, as async_status reads it
    assert job_wait.job_file_ended("") is False
    assert job_wait.job_file_ended((FIXTURES / "finished-ok.json").read_text()[:40]) is False
    # async_wrapper's own failure record carries finished
    assert job_wait.job_file_ended('{"started": 1, "finished": 1, "failed": 1, "msg": "x"}') is True


def test_a_short_job_is_seen_soon_and_a_long_one_is_checked_every_poll():
    """The first look comes after 0.25 s and the wait doubles up to `poll`: a no-op staging that ends in half a
    second is not waited on for a whole poll, and a long job is not looked at more often than every `poll` s."""
    delays = [job_wait.poll_delay(n, 2.0) for n in range(6)]
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    # a job that ends after 0.6 s is seen at the third look, 0.75 s after the start
    assert sum(delays[:2]) == 0.75
    assert [job_wait.poll_delay(n, 0.1) for n in range(3)] == [0.1, 0.1, 0.1]
    assert job_wait.poll_delay(10_000, 2.0) == 2.0


def test_the_host_waits_until_the_next_progress_line_is_due_and_the_doubling_goes_on_across_waits():
    """One ssh command waits on the host for the time to the next progress line (5 s first, then `interval`): its
    sleeps are poll_delay's, cut to the window, and the next wait goes on where this one stopped."""
    assert job_wait.host_sleeps(0, 2.0, 5.0) == [0.25, 0.5, 1.0, 2.0, 1.25]
    assert job_wait.host_sleeps(5, 2.0, 30.0) == [2.0] * 15
    assert job_wait.host_sleeps(0, 0.25, 5.0) == [0.25] * 20  # the server's readiness: a look every 0.25 s
    assert job_wait.host_sleeps(3, 2.0, 0.0) == [0.05]  # always one look, however little time is left


def host_wait(record: Path, *sleeps: float) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    proc = subprocess.run(
        ["sh", "-c", job_wait.HOST_WAIT, "job_wait", str(record), *map(str, sleeps)],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    return time.monotonic() - started, proc


def test_the_host_waits_while_the_record_says_running_and_prints_an_ended_one_at_once(tmp_path):
    """The shell loop on the host (POSIX sh) against ansible-core 2.19's own records and the readiness job's."""
    took, proc = host_wait(FIXTURES / "running.json", 0.2, 0.2)
    assert took >= 0.4 and proc.returncode == 0
    assert job_wait.job_file_ended(proc.stdout) is False  # still running after its sleeps: printed as it is
    for name in ("finished-ok.json", "finished-failed.json"):
        took, proc = host_wait(FIXTURES / name, 5, 5)
        assert took < 2 and proc.stdout == (FIXTURES / name).read_text(), name
    # the record sglang_server_swap's readiness job writes while it runs (indented, "finished": 0)
    record = tmp_path / "ready-job.json"
    record.write_text(json.dumps({"started": 1, "finished": 0, "ansible_job_id": "j1.2"}, indent=2) + "\n")
    took, _proc = host_wait(record, 0.2, 0.2)
    assert took >= 0.4


def test_a_job_that_ends_during_the_wait_is_answered_at_its_next_look(tmp_path):
    record = tmp_path / "job"
    record.write_text((FIXTURES / "running.json").read_text())
    ended = (FIXTURES / "finished-ok.json").read_text()
    timer = threading.Timer(0.3, lambda: record.write_text(ended))
    timer.start()
    took, proc = host_wait(record, 0.1, 0.1, 0.1, 0.1, 0.1, 5, 5)
    timer.join()
    assert 0.3 <= took < 2 and proc.stdout == ended


def test_a_missing_record_fails_the_command_so_async_status_is_asked_why(tmp_path):
    took, proc = host_wait(tmp_path / "no-such-job", 5)
    assert proc.returncode != 0 and took < 2


def test_an_ended_job_reads_as_ansible_cores_async_status_module_returns_it(tmp_path, capsys):
    """The ended job's result is taken from the `cat` of its file, without another module run on the host: it must
    be what ansible-core's own async_status module prints for the same file (run here in-process on ansible-core
    2.19's captured job files), for a finished, a failed and a still-running job."""
    for name in ("finished-ok.json", "finished-failed.json", "running.json"):
        jid = f"j{len(name)}.{name[:4]}"
        (tmp_path / jid).write_text((FIXTURES / name).read_text())
        real, _failed = run_module(
            "ansible.modules.async_status", {"jid": jid, "mode": "status", "_async_dir": str(tmp_path)}, capsys
        )
        ours = job_wait.async_result((FIXTURES / name).read_text(), jid)
        assert ours == real, name
        assert job_wait.job_file_ended((FIXTURES / name).read_text()) is (ours["finished"] in (True, 1))
