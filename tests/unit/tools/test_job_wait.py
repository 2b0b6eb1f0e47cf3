"""The progress lines of the job_wait action (the one pattern for long waits): what a user reads while a
model downloads, an ml-env step runs or the server starts."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.action import job_wait


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
