"""The collection's rulebook under the real ansible-rulebook (PyPI, Debian's Java 17): Alertmanager's webhook posted
to the collection's event source runs playbooks/remediate.yml (gpufleet.fleet.remediate) for the alert's host, once
per host in the throttle's window, not for a resolved alert nor another alert. The hosts are the controller itself
(local connection) with fleet_remediation_dry_run set in the inventory, as an operator tries the rulebook first; the
role's refusals and switches run through ansible-playbook. The real restart is the lab's to show."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from role_flags import REPO, local_ansible_env
from waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inventory(tmp_path: Path, **group_vars) -> Path:
    hosts = {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
             for h in ("gpufleet-01", "gpufleet-02")}  # fmt: skip
    group_vars = {"fleet_remediation_report_dir": str(tmp_path / "reports"), **group_vars}
    path = tmp_path / "hosts.yml"
    path.write_text(json.dumps({"all": {"children": {"sglang_servers": {"hosts": hosts, "vars": group_vars}}}}))
    return path


def alert(name: str, host: str, status: str = "firing", summary: str = "", role: str = "server") -> bytes:
    labels = {"alertname": name, "instance": f"{host}:9100", "job": "node", "severity": "critical", "role": role}
    annotations = {"summary": summary} if summary else {}
    body = {"version": "4", "receiver": "gpufleet", "status": status, "groupKey": "{}", "externalURL": "http://mon-01:9093",
            "groupLabels": {}, "commonLabels": labels, "commonAnnotations": {}, "truncatedAlerts": 0,
            "alerts": [{"status": status, "labels": labels, "annotations": annotations,
                        "startsAt": "2026-12-07T05:00:00Z", "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
                        "fingerprint": host}]}  # fmt: skip
    return json.dumps(body).encode()


def post(port: int, body: bytes) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/alerts", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status


def reports(tmp_path: Path, host: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "reports").glob(f"*-{host}-*.json"))]


def wait_for(what: str, check, bound: float, log: Path | None = None):
    return wait_until(what, check, bound, lambda: log.read_text(errors="replace")[-4000:] if log else "")


@pytest.fixture
def rulebook(tmp_path):
    assert shutil.which("java"), "ansible-rulebook needs Java 17 (make setup installs openjdk-17-jre-headless)"
    port = free_port()
    (tmp_path / "vars.yml").write_text(json.dumps({"remediation_listen_port": port}))
    log = tmp_path / "rulebook.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(REPO / ".venv/bin/ansible-rulebook"), "-r", "gpufleet.fleet.remediation", "-v",
             "-i", str(inventory(tmp_path, fleet_remediation_dry_run=True)), "--vars", str(tmp_path / "vars.yml")],
            cwd=tmp_path, env=local_ansible_env(PATH=f"{REPO / '.venv/bin'}:{os.environ['PATH']}"), stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def answering():
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
            except urllib.error.HTTPError as err:
                return err.code == 404  # the event source answers (nothing is served at /)
            except OSError:
                return False
            return False

        wait_for("the rulebook's event source answers", answering, 180, log)  # the JVM and the rules engine first
        yield port, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_an_alert_runs_the_remediation_for_its_host_once_in_the_window(rulebook, tmp_path):
    port, log = rulebook
    assert post(port, alert("GpufleetLivenessGaveUp", "gpufleet-02")) == 202
    (first,) = wait_for("gpufleet-02's report", lambda: reports(tmp_path, "gpufleet-02"), 180, log)
    assert first | {"started": ""} == {"host": "gpufleet-02", "action": "restart", "alert": "GpufleetLivenessGaveUp",
                                       "reason": "", "dry_run": True, "result": "dry-run", "started": ""}  # fmt: skip
    # the same alert again within the throttle's 30 minutes, a resolved one, another alert: no run; then another host
    assert post(port, alert("GpufleetLivenessGaveUp", "gpufleet-02")) == 202
    assert post(port, alert("GpufleetLivenessGaveUp", "gpufleet-01", status="resolved")) == 202
    assert post(port, alert("GpufleetGpuHot", "gpufleet-01")) == 202
    assert post(port, alert("GpufleetLivenessGaveUp", "gpufleet-01")) == 202
    said = "REMEDIATION (dry run) on gpufleet-01 for GpufleetLivenessGaveUp"
    wait_for("gpufleet-01's run", lambda: said in log.read_text(errors="replace"), 180, log)
    # the rulebook's actions run in order (its sequential strategy): a second gpufleet-02 run would have come first
    assert [r["alert"] for r in reports(tmp_path, "gpufleet-01")] == ["GpufleetLivenessGaveUp"]
    assert len(reports(tmp_path, "gpufleet-02")) == 1


def test_a_gpu_fault_quarantines_its_host_with_the_alert_and_its_summary(rulebook, tmp_path):
    port, log = rulebook
    for name in ("GpufleetGpuRowRemapFailed", "GpufleetGpuFatalXid"):  # the second within the window: no second run
        assert post(port, alert(name, "gpufleet-01", summary=f"{name} on GPU 3 of gpufleet-01:9100")) == 202
    assert post(port, alert("GpufleetGpuRowRemapPending", "gpufleet-02")) == 202  # not a fault a person must fix
    assert post(port, alert("GpufleetGpuPcieDegraded", "gpufleet-02", summary="PCIe link of GPU 4")) == 202
    said = "REMEDIATION (dry run) on gpufleet-02 for GpufleetGpuPcieDegraded: would quarantine it."
    wait_for("gpufleet-02's run", lambda: said in " ".join(log.read_text(errors="replace").split()), 240, log)
    (first,) = reports(tmp_path, "gpufleet-01")
    assert first | {"started": ""} == {
        "host": "gpufleet-01", "action": "quarantine", "alert": "GpufleetGpuRowRemapFailed", "dry_run": True,
        "reason": "GpufleetGpuRowRemapFailed on GPU 3 of gpufleet-01:9100", "result": "dry-run", "started": "",
    }  # fmt: skip
    assert [(r["action"], r["alert"]) for r in reports(tmp_path, "gpufleet-02")] == [
        ("quarantine", "GpufleetGpuPcieDegraded")
    ]


def test_a_full_disk_on_a_server_host_prunes_it_and_not_on_another_host(rulebook, tmp_path):
    port, log = rulebook
    assert post(port, alert("GpufleetDiskAlmostFull", "gpufleet-01", role="router")) == 202  # a gateway: no run
    assert post(port, alert("GpufleetDiskAlmostFull", "gpufleet-02", summary="/srv/models is almost full")) == 202
    said = "REMEDIATION (dry run) on gpufleet-02 for GpufleetDiskAlmostFull: would prune it."
    wait_for("gpufleet-02's run", lambda: said in " ".join(log.read_text(errors="replace").split()), 240, log)
    (only,) = reports(tmp_path, "gpufleet-02")
    assert (only["action"], only["reason"], only["result"]) == ("prune", "/srv/models is almost full", "dry-run")
    assert reports(tmp_path, "gpufleet-01") == []


def remediate(tmp_path: Path, *extra: str, **group_vars) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory(tmp_path, **group_vars)),
         str(REPO / "playbooks/remediate.yml"), "-l", "gpufleet-02", *extra],
        cwd=REPO, env=local_ansible_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("action", ["restart", "prune"])
def test_an_action_turned_off_changes_nothing_and_says_so(tmp_path, action):
    turned_off = {f"fleet_remediation_{action}_enabled": False}
    proc = remediate(tmp_path, "-e", f"fleet_remediation_action={action}", **turned_off)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"fleet_remediation_{action}_enabled is false; nothing changed." in " ".join(proc.stdout.split())
    assert [r["result"] for r in reports(tmp_path, "gpufleet-02")] == ["turned-off"]


def test_the_quarantine_turned_off_changes_nothing_and_says_so(tmp_path):
    action = ("-e", "fleet_remediation_action=quarantine", "-e", "fleet_remediation_alert=GpufleetGpuFatalXid")
    proc = remediate(tmp_path, *action, fleet_remediation_quarantine_enabled=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "REMEDIATION TURNED OFF on gpufleet-02 (GpufleetGpuFatalXid)" in " ".join(proc.stdout.split())
    assert [r["result"] for r in reports(tmp_path, "gpufleet-02")] == ["turned-off"]


def test_a_release_of_a_host_that_is_not_quarantined_changes_nothing(tmp_path):
    (tmp_path / "reports").mkdir()  # the controller's reports folder of earlier runs
    proc = remediate(tmp_path, "-e", "fleet_remediation_action=release", fleet_remediation_max_per_hour=1,
                     fleet_remediation_quarantine_file=str(tmp_path / "quarantine.json"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "gpufleet-02 is not quarantined" in " ".join(proc.stdout.split()) and "changed=0" in proc.stdout
    assert reports(tmp_path, "gpufleet-02") == []


def test_a_quarantined_host_gets_no_restart_and_says_how_to_release_it(tmp_path):
    record = {"since": "2026-12-07T09:00:00Z", "alert": "GpufleetGpuFatalXid", "reason": "Xid 79 on GPU 0",
              "remedy": "power the VM off and on", "report": ""}  # fmt: skip
    (tmp_path / "quarantine.json").write_text(json.dumps(record))
    (tmp_path / "reports").mkdir()  # the controller's reports folder of earlier runs
    proc = remediate(tmp_path, "-e", "fleet_remediation_action=restart",
                     fleet_remediation_quarantine_file=str(tmp_path / "quarantine.json"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = " ".join(proc.stdout.split())
    said = "gpufleet-02 is quarantined since 2026-12-07T09:00:00Z (Xid 79 on GPU 0): no restart; nothing changed."
    assert said in out
    assert "-l gpufleet-02 -e fleet_remediation_action=release" in out and "changed=0" in out


def test_the_prune_removes_what_nothing_uses_and_keeps_the_serving_and_rollback_versions(tmp_path):
    """The real role on this machine (local connection), its folders in tmp_path: ml_env's releases r1..r4 (current
    r4, previous r3), two revisions of a model, the server's last-known-good manifest naming r2 and the old
    revision; a target of a fully free disk (fleet_remediation_prune_free_ratio: 1, the range's top: this machine's
    disk is not full) removes every folder nothing uses."""
    opt, models, state = tmp_path / "opt/ml-env", tmp_path / "models/glm-5", tmp_path / "state"
    for name in ("r1", "r2", "r3", "r4"):
        (opt / "releases" / name).mkdir(parents=True)
    for rev in ("aaaa", "bbbb", "cccc"):
        (models / rev).mkdir(parents=True)
    old = time.time() - 86400
    for folder in [*(opt / "releases").iterdir(), *models.iterdir()]:
        os.utime(folder, (old, old))
    (opt / "current").symlink_to(opt / "releases/r4")
    (opt / "previous").symlink_to(opt / "releases/r3")
    (state / "last-good").mkdir(parents=True)
    (state / "last-good/manifest.json").write_text(
        json.dumps({"release": str(opt / "releases/r2"), "argv": ["--model-path", str(models / "bbbb")]})
    )
    paths = {
        "ml_env_root": str(opt),
        "model_weights_root": str(tmp_path / "models"),
        "sglang_server_state_dir": str(state),
    }
    proc = remediate(tmp_path, "-e", "fleet_remediation_action=prune", fleet_remediation_prune_free_ratio=1, **paths)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = " ".join(proc.stdout.split())
    removed = [f"{models}/aaaa", f"{models}/cccc", f"{opt}/releases/r1"]  # oldest first (same age: by path)
    assert f"PRUNED gpufleet-02: 3 folder(s), 0.0 GiB ({', '.join(removed)})" in out, out[-3000:]
    assert sorted(p.name for p in (opt / "releases").iterdir()) == ["r2", "r3", "r4"]
    assert [p.name for p in models.iterdir()] == ["bbbb"]
    (report,) = reports(tmp_path, "gpufleet-02")
    assert report["result"] == "pruned" and [r["path"] for r in report["prune"]["removed"]] == removed


def test_over_the_rate_limit_it_is_refused_before_any_change(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(2):  # two remediations of the last hour (of any host); a dry run does not count
        (folder / f"20261207T0500{i}0Z-gpufleet-01-restart.json").write_text("{}")
    (folder / "20261207T050100Z-gpufleet-01-restart-dry-run.json").write_text("{}")
    proc = remediate(tmp_path, "-e", "fleet_remediation_action=restart", fleet_remediation_max_per_hour=2)
    assert proc.returncode != 0
    assert "REMEDIATION REFUSED before any change on gpufleet-02 (by hand): 2 remediation(s) in the last hour" in (
        " ".join(proc.stdout.split())
    ), proc.stdout[-3000:]
    assert reports(tmp_path, "gpufleet-02") == []


def test_an_unknown_action_is_refused_naming_the_variable(tmp_path):
    proc = remediate(tmp_path, "-e", "fleet_remediation_action=reboot")
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "fleet_remediation_action" in out and "reboot" in out and "restart" in out, out[-3000:]


def test_a_run_that_names_no_action_is_refused_naming_the_variable(tmp_path):
    proc = remediate(tmp_path)
    assert proc.returncode != 0
    assert "fleet_remediation_action is not set; the action to take: restart, quarantine, release or prune" in " ".join(
        proc.stdout.split()
    )
