"""A real conflict: another program listens on the new port; the deploy is refused, nothing is stopped."""

from sglang_molecule import health, props, report, run_playbook


def test_a_port_held_by_another_program_is_refused_before_the_stop(host):
    assert health(host) == "200"
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
