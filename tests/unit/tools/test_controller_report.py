"""The controller_report action: the deploy and rollout reports are written on the controller by the Ansible
process itself (no module run), both files of a rollout report with the same content, never half written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.action import controller_report

REPO = Path(__file__).resolve().parents[3]


def test_a_report_is_written_to_every_path_and_reads_as_to_nice_json(tmp_path):
    run, last = tmp_path / "reports/rollout/r1.json", tmp_path / "reports/rollout/last.json"
    text = controller_report.render({"b": 1, "a": {"hosts": ["s1"]}})
    assert text == '{\n    "a": {\n        "hosts": [\n            "s1"\n        ]\n    },\n    "b": 1\n}\n'
    assert controller_report.write_files([run, last], text, 0o644) is True
    assert run.read_text() == last.read_text() == text
    assert oct(run.stat().st_mode & 0o777) == "0o644"
    # the same content again changes nothing; no temporary file is left behind
    assert controller_report.write_files([run, last], text, 0o644) is False
    assert sorted(p.name for p in run.parent.iterdir()) == ["last.json", "r1.json"]


def test_a_playbook_task_writes_the_report_on_the_controller_without_a_module_run(tmp_path):
    """A real ansible-playbook run (connection local): the task reports changed once, then not; the files hold the
    templated data; with -vvv no module is transferred or executed for the task (an action plugin only)."""
    out = tmp_path / "reports"
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - gpufleet.fleet.controller_report:\n"
        f"        path: {out}/run-7.json\n"
        f"        also: ['{out}/last.json']\n"
        "        data: {run_id: run-7, hosts: \"{{ {'s1': 'updated'} }}\", result: ok}\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}

    def play() -> subprocess.CompletedProcess:
        argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-vvv"]
        return subprocess.run([*argv, str(playbook)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    first = play()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "changed=1" in first.stdout
    assert "AnsiballZ" not in first.stdout  # no module was built for the task
    report = json.loads((out / "run-7.json").read_text())
    assert report == {"run_id": "run-7", "hosts": {"s1": "updated"}, "result": "ok"}
    assert (out / "last.json").read_text() == (out / "run-7.json").read_text()
    again = play()
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
