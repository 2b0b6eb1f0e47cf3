"""Liveness between deploys: the simulated engine under systemd on a lab host, with the role's server unit and
launcher, and the role's liveness program, unit and settings (roles/sglang_server: files/gpufleet_sglang_liveness.py,
templates/sglang-liveness.service.j2, vars/main.yml's _sglang_server_liveness_settings with the role's defaults and
the lab inventory's start timeout). No Ansible run: the deploy that installs them is covered by the documented
commands' test; here the faults.

  stopped engine  SIGSTOP of the engine's main process (its HTTP server and tokenizer manager, as in SGLang 0.5.9):
                  the unit stays active and /health no longer answers; liveness keeps an incident bundle with a
                  py-spy stack dump of every process and restarts the unit; it serves again with no person
  stopped rank    SIGSTOP of one TP rank's scheduler: HTTP answers, no token comes; restarted the same way
  crash loop      with sglang_server_liveness_max_restarts: 1, a second hang in the window is left as it is: the
                  metric says it gave up, the journal says why, the hung unit is not restarted; an answer ends it
  paused          while a rollout's lock is on the host nothing is restarted; its removal resumes liveness

The bundle's py-spy is the controller's (the project's dev dependency): SGLang depends on py-spy, so a production
release carries it, while the lab's simulated release does not.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time

import collection_jinja
import pytest
import simfleet
import yaml
from conftest import ROOT, lab, lab_json
from lab_host import health, lab_exec
from test_engine_drain import KEY, LAUNCHER, render_role_unit
from waiting import wait_until

NAME = "t-live"
HOST = f"{NAME}-01"
UNIT = "sglang-server.service"
LIVE_UNIT = "sglang-server-liveness.service"
ROLE = ROOT / "roles/sglang_server"
STATE = "/var/lib/gpufleet/sglang-server/liveness-state.json"
METRICS = "/var/lib/prometheus/node-exporter/gpufleet_liveness.prom"
LOCK = "/var/lib/gpufleet/locks/rollout-host.lock"
# the longest the behaviour needs: failures x (timeout + interval) to decide, the bundle, a restart and the engine's
# start (the lab's sim loads in seconds); generous for a loaded 2-core machine
BOUND_S = 300


def sh(script: str, stdin: bytes | None = None, check: bool = True, timeout: int = 120) -> str:
    return lab_exec(NAME, HOST, script, stdin, check, timeout)[1]


def role_settings(**inventory) -> dict:
    """The liveness settings the role writes: vars/main.yml's mapping rendered with the role's defaults, the lab
    inventory's sglang_server_timeout_start_s and the names the role sets (tasks/names.yml, validate.yml)."""
    env = collection_jinja.environment()
    env.filters["dirname"] = os.path.dirname  # ansible.builtin.dirname
    context = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    context |= yaml.safe_load((ROOT / "inventory/lab/group_vars/gpufleet_lab/sglang_server.yml").read_text())
    context |= {
        "sglang_server_secrets_file": "/etc/sglang-server/secrets.env",
        "sglang_server_base_url": "http://127.0.0.1:8000",
        "sglang_server_served_name": "glm-5",
        "sglang_server_python": "/usr/bin/python3",
    } | inventory
    context["_sglang_server_ready"] = {"job_file": f"{context['sglang_server_state_dir']}/ready-job.json"}
    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())

    def render(value):
        if not (isinstance(value, str) and "{{" in value):
            return value
        while "{{" in value:  # a default that names another (Ansible renders them lazily)
            value = env.from_string(value).render(context)
        return yaml.safe_load(value)

    for name in ("sglang_server_liveness_start_grace_s", "sglang_server_ready_timeout_s"):
        context[name] = render(context[name])
    for name in ("sglang_server_liveness_unit", "sglang_server_liveness_script", "sglang_server_liveness_config"):
        context[name] = render(role_vars[name])
    settings = {key: render(value) for key, value in role_vars["_sglang_server_liveness_settings"].items()}
    return {"settings": settings, "context": context}


def install_liveness(**inventory) -> dict:
    role = role_settings(**inventory)
    ctx, settings = role["context"], role["settings"]
    unit = (
        collection_jinja.environment(trim_blocks=True)
        .from_string((ROLE / "templates/sglang-liveness.service.j2").read_text())
        .render(ctx | {"sglang_server_unit": UNIT})
    )
    sh(f"systemctl stop {LIVE_UNIT} 2>/dev/null; rm -f {STATE}; "
       f"install -D -m 0755 /dev/stdin {ctx['sglang_server_liveness_script']}",
       (ROLE / "files/gpufleet_sglang_liveness.py").read_bytes())  # fmt: skip
    sh(f"install -D -m 0600 /dev/stdin {ctx['sglang_server_liveness_config']}", json.dumps(settings).encode())
    sh(f"cat > /etc/systemd/system/{LIVE_UNIT} && systemctl daemon-reload && systemctl enable --now {LIVE_UNIT}",
       unit.encode())  # fmt: skip
    return settings


def props(unit: str = UNIT) -> dict[str, str]:
    out = sh(f"systemctl show {unit} -p ActiveState -p InvocationID -p MainPID -p ActiveEnterTimestampMonotonic")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def state() -> dict:
    text = sh(f"cat {STATE} 2>/dev/null || true")
    return json.loads(text) if text.strip() else {}


def wait_for(what: str, check, bound: float = BOUND_S):
    def details() -> str:
        journal = sh(f"journalctl -u {LIVE_UNIT} -u {UNIT} --no-pager -n 60", check=False)
        return f"liveness state {state()}\n{journal}"

    return wait_until(what, check, bound, details, poll_s=1)


def generates(address: str) -> bool:
    body = json.dumps({"model": "glm-5", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 4})
    out = subprocess.run(
        ["curl", "-s", "-m", "10", "-H", f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json",
         "-d", body, f"http://{address}:8000/v1/chat/completions"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    try:
        return json.loads(out)["usage"]["completion_tokens"] > 0
    except (ValueError, KeyError, TypeError):
        return False


def engine_main_pid() -> int:
    """The engine's main process (HTTP server and tokenizer manager): the launcher's child."""
    launcher = props()["MainPID"]
    pids = sh(f"pgrep -P {launcher} -f sglang_sim.launch_server || true").split()
    assert len(pids) == 1, (launcher, pids, sh("ps -eo pid,ppid,stat,args"))
    return int(pids[0])


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("inv") / "hosts.yml"
    result = lab_json("--name", NAME, "up", "--hosts", "1", "--profile", "h200x2-vm", "--inventory", str(inventory))
    address = result["hosts"][0]["address"]
    sh("mkdir -p /opt/sglang-sim && tar -x -C /opt/sglang-sim && python3 -m compileall -q /opt/sglang-sim "
       "&& chmod -R a+rX /opt/sglang-sim", simfleet.payload(tokenizer=False))  # fmt: skip
    sh("mkdir -p /usr/local/libexec/gpufleet && cat > /usr/local/libexec/gpufleet/sglang-log-redact "
       "&& chmod 0755 /usr/local/libexec/gpufleet/sglang-log-redact", LAUNCHER.read_bytes())  # fmt: skip
    sh("install -m 0755 /dev/stdin /usr/local/bin/py-spy", (ROOT / ".venv/bin/py-spy").read_bytes(), timeout=300)
    sh(
        "id sglang >/dev/null 2>&1 || useradd --system --home-dir /var/lib/sglang --create-home sglang; "
        "install -d -o sglang -g sglang -m 0750 /var/cache/sglang-server; "
        "install -d -m 0755 /etc/sglang-server; " + simfleet.model_folder("/srv/models/glm-5-sim") + "; "
        f"umask 077; printf 'SGLANG_SERVER_API_KEY=\"%s\"\\n' {KEY} > /etc/sglang-server/secrets.env"
    )
    sh(f"cat > /etc/systemd/system/{UNIT} && systemctl daemon-reload && systemctl enable --now {UNIT}",
       render_role_unit(timeout_stop_s=300).encode())  # fmt: skip
    wait_for("the server answers", lambda: health(address) == 200, 120)
    yield address
    lab("--name", NAME, "down", check=False)


def test_a_stopped_engine_is_restarted_by_liveness_and_serves_again(host):
    assert shutil.which("curl")
    settings = install_liveness()
    assert (settings["interval_s"], settings["timeout_s"], settings["failures"]) == (5, 10, 3)  # the role's defaults
    wait_for("liveness sees a generation", lambda: state().get("phase") == "ok")
    before = props()
    pid = engine_main_pid()
    sh(f"kill -STOP {pid}")
    t0 = time.monotonic()
    assert health(host) != 200  # /health hangs: the unit is still active
    assert props()["ActiveState"] == "active"
    wait_for("a new start of the unit", lambda: props()["InvocationID"] != before["InvocationID"])
    restarted_s = time.monotonic() - t0
    wait_for("a generation again", lambda: generates(host))
    serving_s = time.monotonic() - t0
    print(f"liveness: SIGSTOP -> restart {restarted_s:.1f}s, -> serving {serving_s:.1f}s")
    # the decision: restart after 3 failed probes, with the bundle before the restart
    s = state()
    assert s["restarts_total"] == 1 and s["last_bundle"].startswith("/var/lib/gpufleet/incidents/")
    journal = sh(f"journalctl -u {LIVE_UNIT} --no-pager -o cat")
    assert "probe failed (3/3)" in journal and f"{UNIT}: restarting it: 3 failed probes" in journal, journal
    bundle = s["last_bundle"]
    stacks = sh(f"cat {bundle}/stacks.txt")
    # py-spy read the stopped engine's Python stack (--nonblocking) and every other process of the unit
    assert f"=== pid {pid}: " in stacks and "Thread " in stacks and "sglang_sim" in stacks, stacks[:3000]
    index = json.loads(sh(f"cat {bundle}/index.json"))
    assert index["invocation"] == before["InvocationID"] and index["why"].startswith("no answer in")
    assert sh(f"grep -rl -- {shlex.quote(KEY)} {bundle} || true").strip() == ""  # the key is redacted everywhere
    assert sh(f"stat -c %a {bundle}").strip() == "700"
    metrics = sh(f"cat {METRICS}")
    assert f'gpufleet_liveness_restarts_total{{unit="{UNIT}"}} 1' in metrics
    wait_for("the probe succeeds again", lambda: state().get("phase") == "ok")


def test_a_stopped_scheduler_is_restarted_by_liveness_and_serves_again(host):
    """SIGSTOP of one TP rank's scheduler: the main process answers HTTP, no request gets a token (0.5.9's process
    model, which the simulator follows); liveness restarts the unit as for a stopped main process."""
    install_liveness()
    wait_for("liveness sees a generation", lambda: state().get("phase") == "ok")
    before = props()
    rank1 = sh("pgrep -f 'sglang_sim[.]scheduler --tp-rank 1' || true").split()
    assert len(rank1) == 1, sh("ps -eo pid,ppid,stat,args")
    sh(f"kill -STOP {rank1[0]}")
    t0 = time.monotonic()
    wait_for("a new start of the unit", lambda: props()["InvocationID"] != before["InvocationID"])
    wait_for("a generation again", lambda: generates(host))
    print(f"liveness: SIGSTOP of a scheduler -> serving {time.monotonic() - t0:.1f}s")
    journal = sh(f"journalctl -u {LIVE_UNIT} --no-pager -o cat")
    assert "probe failed (3/3): no answer in" in journal, journal
    stacks = sh(f"cat {state()['last_bundle']}/stacks.txt")
    assert f"=== pid {rank1[0]}: " in stacks, stacks[:3000]  # the stopped rank's stack is in the bundle


def test_a_server_that_keeps_hanging_is_left_after_max_restarts(host):
    install_liveness(sglang_server_liveness_max_restarts=1)  # a user's setting: one try per hour
    wait_for("liveness sees a generation", lambda: state().get("phase") == "ok")
    first = props()["InvocationID"]
    sh(f"kill -STOP {engine_main_pid()}")
    wait_for("the first restart", lambda: props()["InvocationID"] != first)
    wait_for("a generation again", lambda: generates(host))
    second = props()
    stopped = engine_main_pid()
    sh(f"kill -STOP {stopped}")
    wait_for("liveness gives up", lambda: state().get("gave_up"))
    assert props()["InvocationID"] == second["InvocationID"]  # the hung unit is left as it is
    assert state()["restarts_total"] == 1
    metrics = sh(f"cat {METRICS}")
    assert f'gpufleet_liveness_gave_up{{unit="{UNIT}"}} 1' in metrics, metrics
    assert "GAVE UP: 1 restart(s) in the last 3600s" in sh(f"journalctl -u {LIVE_UNIT} --no-pager -o cat")
    # a person looks, and the engine goes on: the next answer ends the give-up
    sh(f"kill -CONT {stopped}")
    wait_for("the give-up ends with an answer", lambda: state().get("phase") == "ok" and not state()["gave_up"])
    assert f'gpufleet_liveness_gave_up{{unit="{UNIT}"}} 0' in sh(f"cat {METRICS}")


def test_a_rollout_lock_on_the_host_pauses_liveness(host):
    install_liveness()
    wait_for("liveness sees a generation", lambda: state().get("phase") == "ok")
    sh(f"install -d /var/lib/gpufleet/locks && echo '{{}}' > {LOCK}")
    before = props()["InvocationID"]
    stopped = engine_main_pid()
    sh(f"kill -STOP {stopped}")
    rounds = state()["rounds"]
    # rounds for longer than its failures and a restart would take unpaused (3 x (10 s + 2 s + 5 s)), all paused
    wait_for("rounds of liveness under the lock", lambda: state()["rounds"] >= rounds + 14)
    s = state()
    assert s["phase"] == "paused" and s["failures"] == 0 and s["restarts_total"] == 0, s
    assert props()["InvocationID"] == before
    sh(f"rm -f {LOCK}")
    wait_for("the restart once the lock is gone", lambda: props()["InvocationID"] != before)
    wait_for("a generation again", lambda: generates(host))
