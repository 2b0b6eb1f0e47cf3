"""Fault port-taken: the host fails clearly, the previous version serves again, the report records the rollback."""

import pytest
from fault_common import (  # noqa: F401  (fixtures and tests)
    bad_deploy,
    test_host_failed_with_a_clear_message,
    test_previous_version_serves_and_is_healthy,
    test_report_records_the_rollback,
)


@pytest.mark.usefixtures("bad_deploy")
def test_a_port_held_by_another_program_is_refused_before_the_stop(host):
    """A real conflict: another program listens on the new port; the deploy is refused, nothing stopped."""
    from sglang_molecule import health, props, report, run_playbook

    host.run("systemd-run --unit foreign-listener -p Type=simple python3 -m http.server 8001 --bind 0.0.0.0")
    host.run("for i in $(seq 50); do ss -ltn 'sport = :8001' | grep -q LISTEN && break; sleep 0.1; done")
    before = props(host)
    rc, out = run_playbook("playbooks/deploy_server.yml", {"sglang_server_args_host": {"port": 8001}})
    host.run("systemctl stop foreign-listener")
    assert rc != 0
    assert "port 8001 is taken by another program" in out and "foreign-listener.service" in out
    assert props(host) == before
    assert health(host) == "200"
    r = report("sglang-01")
    assert r["result"] == "failed" and r["failure"]["phase"] == "validate"
