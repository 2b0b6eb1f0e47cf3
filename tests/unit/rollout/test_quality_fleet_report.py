"""The fleet report (roles/serving_bench/files/fleet_report.py, templates/fleet-report.html.j2) shows the rollout's
quality gate per host from reports/<fleet>/quality/<host>.json: a refused canary with its score, baseline, worst item
and the rollback, a passed one, and a baseline run (docs/quality-gate.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

REFUSED = {
    "host": "t-01",
    "run_id": "20261205T060000Z-1",
    "ok": False,
    "reason": "score 0.316 (12/38 exact) against the baseline 1.000 (38/38, 2026-12-05T05:50:00Z, host t-01); floor "
    "0.950 (allowed drop 0.050); worst items: [arith-01] 'What is 26 + 755? Reply with the number only.': expected "
    "781, got '782'",
    "score": 0.316,
    "baseline_score": 1.0,
    "gpu_class": "NVIDIA RTX PRO 6000 Blackwell Server Edition x8",
    "model": "glm-5",
    "lane": "lab-sim",
    "rolled_back": True,
    "rolled_back_to": "sim-a",
}
PASSED = {
    **REFUSED,
    "host": "t-02",
    "ok": True,
    "reason": "score 1.000 (38/38 exact) against ...",
    "rolled_back": False,
}
BASELINE_RUN = {
    "host": "t-03",
    "baseline_run": True,
    "written_at": "2026-12-05T05:50:00Z",
    "reason": "score 1.000 measured",
}


def test_the_fleet_report_shows_each_hosts_quality_gate(tmp_path, bench_python):
    (tmp_path / "quality").mkdir()
    for record in (REFUSED, PASSED, BASELINE_RUN):
        (tmp_path / "quality" / f"{record['host']}.json").write_text(json.dumps(record))
    proc = subprocess.run(
        [bench_python, str(REPO / "roles/serving_bench/files/fleet_report.py"), str(tmp_path),
         str(REPO / "templates/fleet-report.html.j2"), "--fleet", "lab"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (tmp_path / "fleet-report.html").read_text()
    refused = (
        '<tr><th>quality gate</th><td class="bad quality">REFUSED (NVIDIA RTX PRO 6000 Blackwell Server Edition x8, '
        "glm-5, lab-sim; run 20261205T060000Z-1): score 0.316 (12/38 exact) against the baseline 1.000"
    )
    assert refused in html
    assert "expected 781, got &#39;782&#39; ==&gt; ROLLED BACK to release sim-a</td></tr>" in html
    assert '<td class="ok quality">PASSED (NVIDIA RTX PRO 6000' in html
    assert '<td class="ok quality">baseline run 2026-12-05T05:50:00Z: score 1.000 measured</td>' in html
    md = (tmp_path / "fleet-report.md").read_text()
    assert "| quality gate | REFUSED (NVIDIA RTX PRO 6000 Blackwell Server Edition x8, glm-5, lab-sim;" in md
    assert "==> ROLLED BACK to release sim-a |" in md
