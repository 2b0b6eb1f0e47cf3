"""roles/fleet_router/files/gpufleet_router_record_metrics.py, run as systemd runs it on the gateway host: the
worker record as node-exporter textfile metrics, rewritten only when it changes (the role's task is idempotent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "roles/fleet_router/files/gpufleet_router_record_metrics.py"


def run(record: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(record), str(out)], capture_output=True, text=True)


def test_the_record_becomes_one_series_per_worker_and_a_count(tmp_path):
    record, out = tmp_path / "workers.json", tmp_path / "textfile/gpufleet_router_record.prom"
    record.write_text(json.dumps({"workers": ["http://10.0.0.12:8000/", "http://10.0.0.11:8000"]}))
    proc = run(record, out)
    assert (proc.returncode, proc.stdout) == (0, "written\n"), proc.stderr
    lines = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert lines == [
        "gpufleet_router_record_readable 1",
        "gpufleet_router_recorded_workers 2",
        'gpufleet_router_recorded_worker{worker="http://10.0.0.11:8000"} 1',
        'gpufleet_router_recorded_worker{worker="http://10.0.0.12:8000"} 1',
    ]
    assert oct(out.stat().st_mode & 0o777) == "0o644"  # node-exporter reads it as its own user
    assert run(record, out).stdout == "unchanged\n"  # the same record: the file is not rewritten
    record.write_text(json.dumps({"workers": ["http://10.0.0.11:8000"]}))
    assert run(record, out).stdout == "written\n" and "10.0.0.12" not in out.read_text()


def test_no_record_is_no_worker_and_a_broken_one_says_so(tmp_path):
    record, out = tmp_path / "workers.json", tmp_path / "record.prom"
    assert run(record, out).returncode == 0
    assert "gpufleet_router_recorded_workers 0" in out.read_text()
    record.write_text('["http://10.0.0.11:8000"]')  # not a worker record
    proc = run(record, out)
    assert proc.returncode == 1 and "is not a worker record" in proc.stderr
    assert "gpufleet_router_record_readable 0" in out.read_text() and "recorded_worker" not in out.read_text()
