"""The host firewall's table as the fleet_firewall role renders it (its template through Ansible), checked by nft
(Debian's nftables: `nft --check`, which parses and validates against the kernel without loading): one table of its
own replaced atomically, the host itself accepted, each port's sources accepted (IPv4 and IPv6 sets) and any other
connection reset."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from role_templates import render_role_templates

PORTS = [
    {"name": "SGLang server (API and /metrics)", "port": 8000,
     "sources": ["10.0.0.1/32", "10.0.0.2/32", "192.0.2.0/24", "2001:db8::7/128"]},
    {"name": "node-exporter", "port": 9100, "sources": ["10.0.0.1/32", "10.0.0.2/32"]},
]  # fmt: skip


def render(tmp_path: Path) -> Path:
    return render_role_templates(tmp_path, "fleet_firewall", ["firewall.nft", "firewall.service"],
                                 {"fleet_firewall_ports": PORTS})  # fmt: skip


def test_the_table_is_what_nft_loads(tmp_path):
    out = render(tmp_path)
    nft = shutil.which("nft") or "/usr/sbin/nft"
    check = subprocess.run([nft, "--check", "--file", str(out / "firewall.nft")], capture_output=True, text=True,
                           check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    lines = [line.strip() for line in (out / "firewall.nft").read_text().splitlines()]
    # only its own table, replaced in one transaction: created if absent, deleted, defined again
    assert lines.index("table inet gpufleet") < lines.index("delete table inet gpufleet")
    assert "type filter hook input priority filter; policy accept;" in lines
    assert 'iifname "lo" accept' in lines
    assert "tcp dport 8000 ip saddr { 10.0.0.1/32, 10.0.0.2/32, 192.0.2.0/24 } accept" in lines
    assert "tcp dport 8000 ip6 saddr { 2001:db8::7/128 } accept" in lines
    assert "tcp dport 9100 ip saddr { 10.0.0.1/32, 10.0.0.2/32 } accept" in lines
    assert not any(line.startswith("tcp dport 9100 ip6") for line in lines)
    # each port's reject comes after its accepts
    for port in (8000, 9100):
        accepts = [i for i, line in enumerate(lines) if line.startswith(f"tcp dport {port} ") and "accept" in line]
        assert lines.index(f"tcp dport {port} reject with tcp reset") > max(accepts)
    unit = (out / "firewall.service").read_text()
    assert "ExecStart=/usr/sbin/nft -f /etc/gpufleet/firewall.nft" in unit
    assert "ExecStop=-/usr/sbin/nft delete table inet gpufleet" in unit
    assert "Before=network-pre.target" in unit and "WantedBy=sysinit.target" in unit
