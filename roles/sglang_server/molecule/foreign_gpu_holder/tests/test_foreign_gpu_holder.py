"""A live process of user `intruder` holds the server's GPUs: deploy.yml refuses in preflight, the server
role refuses in validation, both naming PID, user and command with a remedy, before any stop; the running
server keeps its MainPID and InvocationID and stays healthy. After the holder is gone the deploy goes through."""

import re
import shlex

import pytest
from sglang_molecule import UNIT_PATH, health, props, report, run_playbook

HOST = "sglang-01"
HOLD = ["/usr/local/bin/gpusim-hold", "--gpus", "0,1", "--mib", "2048"]
COMMAND = "/usr/bin/python3 " + " ".join(HOLD)
CHANGED = {"sglang_server_args_host": {"max-running-requests": 32}}
# this machine's disk is not the fleet's: only the GPU check is under test here
SMALL_DISK = {"gpu_facts_disk_requirements": [{"path": "/opt/ml-env", "min_free_gib": 1, "purpose": "ml-env"}]}


def apps(host):
    out = host.check_output("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader")
    return [line.split(", ") for line in out.splitlines()]


@pytest.fixture(scope="module")
def intruder(host):
    host.check_output("id intruder || useradd --create-home --shell /bin/bash intruder")
    # a user's own shell job, detached (every fd away from this ssh session, or the session never ends)
    host.check_output(f"runuser -u intruder -- setsid -f {shlex.join(HOLD)} </dev/null >/tmp/intruder-hold.log 2>&1")
    host.check_output("for i in $(seq 100); do grep -q holding /tmp/intruder-hold.log && break; sleep 0.1; done")
    log = host.file("/tmp/intruder-hold.log").content_string
    pid = int(re.search(r"as pid (\d+)", log).group(1))
    yield pid
    host.run(f"kill {pid}")


@pytest.fixture(scope="module")
def server_before(host):
    before = props(host)
    assert before["ActiveState"] == "active" and health(host) == "200"
    return before


@pytest.fixture(scope="module")
def deploy_refused(host, server_before, intruder):
    rc, out = run_playbook("deploy.yml", {**CHANGED, **SMALL_DISK})
    return rc, " ".join(out.split())


@pytest.fixture(scope="module")
def server_refused(host, deploy_refused, intruder):
    rc, out = run_playbook("playbooks/deploy_server.yml", CHANGED)
    return rc, " ".join(out.split())


def test_the_intruder_holds_the_servers_gpus(host, intruder, server_before):
    rows = [r for r in apps(host) if r[0] == str(intruder)]
    assert [(r[1], r[2]) for r in rows] == [("/usr/bin/python3", "2048 MiB")] * 2
    assert host.check_output(f"ps -o user= -p {intruder}") == "intruder"


def test_deploy_is_refused_in_preflight_naming_pid_user_and_command(deploy_refused, intruder):
    rc, out = deploy_refused
    assert rc != 0
    assert "PREFLIGHT FAILED on sglang-01" in out
    assert (
        f"GPUs are held by processes that are not the SGLang service: pid {intruder} /usr/bin/python3, "
        f"user intruder, command `{COMMAND}`, on GPU0,GPU1 using 4096 MiB" in out
    )
    assert f"pid {intruder}: ask user intruder to end it or, as root, kill {intruder};" in out
    assert "systemctl stop ssh" not in out  # the job runs in ssh.service here (no logind): never advise stopping it
    # the first stage stopped the run: no later play started (preflight itself reads the server role's flag
    # layers, a read-only include, so "TASK [sglang_server :" alone would not say a later stage ran)
    for play in ("Validate the inputs", "CUDA toolkit", "ML environment", "Model weights", "SGLang server"):
        assert f"PLAY [{play}" not in out
    for stage in ("cuda_toolkit :", "ml_env :", "model_weights :"):
        assert f"TASK [{stage}" not in out


def test_the_server_role_refuses_in_validation_before_the_stop(host, server_refused, intruder):
    rc, out = server_refused
    assert rc != 0
    assert "SGLANG SERVER DEPLOY FAILED on sglang-01 in phase validate" in out
    assert "Refuse GPUs held by another program and a port another program listens on (before any stop)" in out
    assert (
        f"GPUs 0,1,2,3,4,5,6,7 of the server are held by processes outside sglang-server.service: pid {intruder} "
        f"(/usr/bin/python3, user intruder, command `{COMMAND}`, GPUs 0,1, 4096 MiB, unit " in out
    )
    assert "The running server was not stopped." in out
    assert f"Remedy: pid {intruder}: ask user intruder to end it or, as root, kill {intruder}" in out
    assert "TASK [sglang_server : Stop" not in out
    r = report(HOST)
    assert r["result"] == "failed" and r["failure"]["phase"] == "validate"


def test_the_running_server_is_untouched(host, server_before, deploy_refused, server_refused):
    assert props(host) == server_before
    assert health(host) == "200"
    assert "--max-running-requests 64" in host.file(UNIT_PATH).content_string


def test_once_the_holder_is_gone_the_deploy_goes_through(host, server_before, server_refused, intruder):
    host.check_output(f"kill {intruder}")
    host.check_output(
        f"for i in $(seq 100); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qx {intruder} "
        "|| break; sleep 0.1; done"
    )
    assert str(intruder) not in [r[0] for r in apps(host)]
    rc, out = run_playbook("playbooks/deploy_server.yml", CHANGED)
    assert rc == 0, out[-3000:]
    after = props(host)
    assert after["ActiveState"] == "active" and after["MainPID"] != server_before["MainPID"]
    assert "--max-running-requests 32" in host.file(UNIT_PATH).content_string
    assert health(host) == "200"
    assert report(HOST)["result"] == "ok"


CUSTOM = {"sglang_server_service_name": "sglang-a", **SMALL_DISK}


def custom_props(host) -> dict:
    out = host.check_output("systemctl show sglang-a.service --property=MainPID,ActiveState,InvocationID")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_a_custom_service_name_is_ours_and_any_other_units_gpu_processes_are_not(host, server_refused, intruder):
    """gpu_facts' preflight takes the service's own unit from sglang_server_service_name (playbooks/vars/fleet.yml):
    with sglang-a, the engine still running as sglang-server.service is another program, refused in deploy.yml's
    first stage before any stage changes the host; once it is stopped the fleet deploys as sglang-a, passes preflight
    with sglang-a running (its processes are ours; a deploy under the default name now calls them foreign), deploys
    a changed flag and rolls back to the version before. (This scenario has no lab mirror, hub or wheelhouse for the
    CUDA, ml-env and weights stages: the server stage runs alone after preflight.)"""
    rc, out = run_playbook("deploy.yml", {**CUSTOM, **CHANGED})
    out = " ".join(out.split())
    assert rc != 0 and "PREFLIGHT FAILED on sglang-01" in out, out[-3000:]
    assert "GPUs are held by processes that are not the SGLang service" in out and "(unit sglang-server.service)" in out
    assert "gpu_facts_own_service_units=['sglang-a.service']" in out
    for stage in ("cuda_toolkit :", "ml_env :", "model_weights :"):
        assert f"TASK [{stage}" not in out
    assert not host.file("/etc/systemd/system/sglang-a.service").exists

    host.check_output("systemctl disable --now sglang-server.service")
    rc, out = run_playbook("playbooks/deploy_server.yml", {**CUSTOM, **CHANGED})
    assert rc == 0, out[-3000:]
    first = custom_props(host)
    assert first["ActiveState"] == "active" and health(host) == "200"
    assert "--max-running-requests 32" in host.file("/etc/systemd/system/sglang-a.service").content_string

    # preflight with sglang-a running: its processes are the server's own; under the default name they are not
    rc, out = run_playbook("playbooks/preflight.yml", CUSTOM)
    assert rc == 0 and "Refuse the host when a preflight check fails" in out, out[-3000:]
    rc, out = run_playbook("playbooks/preflight.yml", SMALL_DISK)
    assert rc != 0 and "(unit sglang-a.service)" in " ".join(out.split()), out[-3000:]

    sixteen = {"sglang_server_args_host": {"max-running-requests": 16}}
    rc, out = run_playbook("playbooks/deploy_server.yml", {**CUSTOM, **sixteen})
    assert rc == 0, out[-3000:]
    second = custom_props(host)
    assert second["MainPID"] != first["MainPID"] and health(host) == "200"
    assert "--max-running-requests 16" in host.file("/etc/systemd/system/sglang-a.service").content_string

    rc, out = run_playbook("playbooks/rollback.yml", CUSTOM)
    assert rc == 0, out[-3000:]
    assert custom_props(host)["ActiveState"] == "active" and health(host) == "200"
    assert "--max-running-requests 32" in host.file("/etc/systemd/system/sglang-a.service").content_string
    r = report(HOST)
    assert r["result"] == "rolled_back" and r["rollback"]["healthy"] is True, r
    assert r["server"]["unit"] == "sglang-a.service"
