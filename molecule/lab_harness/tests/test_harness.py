"""The Molecule harness runs roles on lab hosts with a real systemd, reachable from each other."""

import pytest
from gpufleet_testinfra import assert_unit_active

WEB = "harness-web"


@pytest.fixture
def web(host_by_name):
    return host_by_name(WEB)


def test_pid1_is_systemd(host):
    assert host.check_output("ps -p 1 -o comm=") == "systemd"
    assert host.check_output("systemctl is-system-running || true") in ("running", "degraded")


def test_unit_is_enabled_and_active(web):
    assert_unit_active(web, "harness-http.service")
    assert web.service("harness-http.service").is_enabled
    assert web.socket("tcp://0.0.0.0:8080").is_listening


def test_runs_unprivileged(web):
    pid = web.check_output("systemctl show -P MainPID harness-http.service")
    assert web.check_output(f"ps -o user= -p {pid}") != "root"


def test_page_is_served_to_the_other_lab_host(host_by_name):
    client = host_by_name("harness-client")
    body = client.check_output(f"curl -sf --max-time 5 http://{WEB}:8080/")
    assert body == f"served by {WEB} under systemd"
