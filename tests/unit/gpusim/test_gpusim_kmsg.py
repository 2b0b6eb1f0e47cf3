"""gpusim-kmsg (lab/gpusim/gpusim_kmsg.py): the lab's kernel log lines (an NVRM: Xid of a simulated GPU).

Its Xid line is read back by the GPU metrics collector's own parser (roles/node_exporter/files/
gpufleet_gpu_metrics.py) against the simulated nvidia-smi's bus ids; what it hands to systemd-journal-remote is
checked here with a stand-in that keeps its input (the controller has no systemd-journal-remote: the real
one writes the lab hosts' journals in tests/lab/test_monitoring.py, read back there by `journalctl -k -b`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
KMSG = REPO / "lab" / "gpusim" / "gpusim_kmsg.py"
SIM = REPO / "lab" / "gpusim" / "nvidia_smi.py"
PROFILES = REPO / "lab" / "gpusim" / "profiles"
COLLECTOR = REPO / "roles" / "node_exporter" / "files" / "gpufleet_gpu_metrics.py"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gk = load("gpusim_kmsg", KMSG)
gm = load("gpufleet_gpu_metrics_for_kmsg", COLLECTOR)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A lab host's tools: the simulated nvidia-smi on PATH (an 8-GPU profile) and a journal-remote stand-in that
    appends what it is given to ``<output>.export``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {SIM} "$@"\n')
    smi.chmod(0o755)
    remote = bindir / "systemd-journal-remote"
    remote.write_text('#!/bin/sh\nout="${1#--output=}"\n[ "$2" = --split-mode=none ] && [ "$3" = - ] || exit 2\n'
                      'cat >> "$out.export"\n')  # fmt: skip
    remote.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUSIM_PROFILE_DIR", str(PROFILES / "rtx-pro-6000x8-vm"))
    monkeypatch.setenv("GPUSIM_STATE_DIR", str(tmp_path / "state"))
    journal = tmp_path / "run/log/journal/mid/gpusim-kernel.journal"
    monkeypatch.setattr(gk, "JOURNAL_REMOTE", str(remote))
    monkeypatch.setattr(gk, "journal_file", lambda: str(journal))
    return journal


def entries(journal: Path) -> list[dict]:
    text = Path(f"{journal}.export").read_text()
    return [dict(line.split("=", 1) for line in block.splitlines()) for block in text.split("\n\n") if block.strip()]


def test_the_xid_line_is_what_the_collector_reads_for_that_gpu():
    bus_ids = [g["pci_bus_id"] for g in json.loads((PROFILES / "rtx-pro-6000x8-vm/profile.json").read_text())["gpus"]]
    line = gk.xid_line(79, bus_ids[5])
    assert line == "NVRM: Xid (PCI:0000:06:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert gm.xid_codes(line) == {(gm.pci_address(bus_ids[5]), 79): 1}
    assert gm.count_xid(line) == 1
    # a code the lab has no text for: the pid/name part only, still one Xid of that code
    assert gm.xid_codes(gk.xid_line(48, "00000000:3B:00.0")) == {("0000:3b:00", 48): 1}


def test_the_first_xid_comes_after_the_kernels_first_line_as_kernel_messages_of_this_boot(host, capsys):
    assert gk.main(["--xid", "79", "--gpu", "5"]) == 0
    first = entries(host)
    assert [e["MESSAGE"] for e in first][1] == (
        "NVRM: Xid (PCI:0000:06:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    assert first[0]["MESSAGE"].startswith("Linux version ") and "gpufleet lab simulator" in first[0]["MESSAGE"]
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    for entry in first:
        assert (entry["_TRANSPORT"], entry["SYSLOG_IDENTIFIER"], entry["_BOOT_ID"]) == ("kernel", "kernel", boot)
    assert "gpusim-kmsg: kernel: NVRM: Xid (PCI:0000:06:00): 79," in capsys.readouterr().out


def test_later_lines_come_alone_and_clear_removes_this_boots_lines(host):
    assert gk.main(["--boot"]) == 0
    host.touch()  # the journal file systemd-journal-remote made
    assert [e["MESSAGE"] for e in entries(host)][0].startswith("Linux version ")
    assert gk.main(["--boot"]) == 0 and len(entries(host)) == 1  # the log has its first line already
    assert gk.main(["--xid", "94", "--gpu", "0"]) == 0
    assert [e["MESSAGE"][:31] for e in entries(host)][1:] == ["NVRM: Xid (PCI:0000:01:00): 94,"]
    assert gk.main(["--clear"]) == 0 and not host.exists()


def test_a_gpu_the_host_does_not_have_is_refused(host):
    with pytest.raises(SystemExit, match="gpusim-kmsg: no GPU 8"):
        gk.main(["--xid", "79", "--gpu", "8"])
    assert not Path(f"{host}.export").exists()


def test_a_failed_write_says_so(host, monkeypatch):
    monkeypatch.setattr(gk, "JOURNAL_REMOTE", "/bin/false")
    with pytest.raises(SystemExit, match="exited 1"):
        gk.main(["--boot"])


def test_it_says_it_is_a_simulator():
    done = subprocess.run([sys.executable, str(KMSG), "--help"], capture_output=True, text=True, check=True)
    assert "gpufleet lab simulator" in done.stdout
