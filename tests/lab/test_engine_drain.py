"""A planned stop drains: the simulated engine (sglang 0.5.9 shutdown) under systemd on a lab host, with the
unit rendered from roles/sglang_server's own template and the role's launcher.

A 240-token streaming request started before `systemctl stop` completes in full with the role's unit
(KillMode=mixed); with the unit as it was (KillMode=control-group) the same request is cut, because the
schedulers get SIGTERM too and die at once (the simulator reproduces the defect). The lab host's systemd
kills whole control groups (the lab gives each host its own cgroup subtree).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import shlex
import subprocess
import threading
import time

import collection_jinja
import jinja2
import pytest
import simfleet
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_drain as server_drain  # noqa: E402
from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_journal as server_journal  # noqa: E402
from conftest import LAB_ENV, ROOT, lab, lab_json
from lab_host import health, lab_exec

NAME = "t-drain"
UNIT = "sglang-server.service"
KEY = "drain-test-key-7c1e"
LAUNCHER = ROOT / "roles/sglang_server/files/sglang-log-redact.py"
TEMPLATE = ROOT / "roles/sglang_server/templates/sglang-server.service.j2"
STOP_TIMEOUT_S = 20
TOKENS = 240


def render_role_unit(timeout_stop_s: int = STOP_TIMEOUT_S) -> str:
    """The role's template with the role's filters (Ansible's template settings: trim_blocks)."""
    env = collection_jinja.environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    argv = ["--model-path", "/srv/models/glm-5-sim", "--served-model-name", "glm-5", "--tp", "2",
            "--host", "0.0.0.0", "--port", "8000"]  # fmt: skip
    return env.from_string(TEMPLATE.read_text()).render(
        sglang_server_served_name="glm-5",
        sglang_server_release_id="sim-a",
        sglang_server_start_limit_interval_s=3600,
        sglang_server_start_limit_burst=3,
        sglang_server_user="sglang",
        sglang_server_group="sglang",
        sglang_server_supplementary_groups=[],
        sglang_server_cache_dir="/var/cache/sglang-server",
        sglang_server_runtime_dir_name="sglang-server",
        sglang_server_secrets_file="/etc/sglang-server/secrets.env",
        sglang_server_unit_environment={
            "PYTHONPATH": "/opt/sglang-sim",
            "SGLANG_SIM_LOAD_SECONDS": "1",
            "SGLANG_SIM_GRAPH_SECONDS": "1",
            # 240 tokens in 8 s: longer than the 5 s watchdog period, so the drain logs the open request
            "SGLANG_SIM_TOKENS_PER_S": "30",
        },
        sglang_server_api_key=KEY,
        sglang_server_hf_token="",
        sglang_server_use_redactor=True,
        sglang_server_redactor_sha256=hashlib.sha256(LAUNCHER.read_bytes()).hexdigest(),
        sglang_server_python="/usr/bin/python3",
        sglang_server_redactor_path="/usr/local/libexec/gpufleet/sglang-log-redact",
        sglang_server_module="sglang_sim.launch_server",
        sglang_server_argv=argv,
        sglang_server_timeout_start_s=120,
        sglang_server_timeout_stop_s=timeout_stop_s,
        sglang_server_restart_policy="on-failure",
        sglang_server_restart_sec=30,
        sglang_server_user_home="/var/lib/sglang",
        sglang_server_read_write_paths=[],
    )


def old_unit(role_unit: str) -> str:
    """The unit before this fix: KillMode=control-group and no SuccessExitStatus."""
    lines = []
    for line in role_unit.splitlines():
        if line == "KillMode=mixed":
            line = "KillMode=control-group"
        if not line.startswith("SuccessExitStatus="):
            lines.append(line)
    return "\n".join(lines) + "\n"


def sh(script: str, stdin: bytes | None = None, check: bool = True, timeout: int = 120):
    return lab_exec(NAME, HOST, script, stdin, check, timeout)


HOST = f"{NAME}-01"


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    return tmp_path_factory.mktemp("inv") / "hosts.yml"


@pytest.fixture(scope="module")
def host(inventory):
    result = lab_json("--name", NAME, "up", "--hosts", "1", "--profile", "h200x2-vm", "--inventory", str(inventory))
    address = result["hosts"][0]["address"]
    sh("mkdir -p /opt/sglang-sim && tar -x -C /opt/sglang-sim && python3 -m compileall -q /opt/sglang-sim "
       "&& chmod -R a+rX /opt/sglang-sim",
       simfleet.payload(tokenizer=False))  # fmt: skip
    sh("mkdir -p /usr/local/libexec/gpufleet && cat > /usr/local/libexec/gpufleet/sglang-log-redact "
       "&& chmod 0755 /usr/local/libexec/gpufleet/sglang-log-redact", LAUNCHER.read_bytes())  # fmt: skip
    sh(
        "id sglang >/dev/null 2>&1 || useradd --system --home-dir /var/lib/sglang --create-home sglang; "
        "install -d -o sglang -g sglang -m 0750 /var/cache/sglang-server; "
        "install -d -m 0755 /etc/sglang-server; " + simfleet.model_folder("/srv/models/glm-5-sim") + "; "
        f"umask 077; printf 'SGLANG_SERVER_API_KEY=\"%s\"\\n' {KEY} > /etc/sglang-server/secrets.env"
    )
    yield address
    lab("--name", NAME, "down", check=False)


def wait_healthy(address: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if health(address) == 200:
            return
        time.sleep(0.3)
    _, journal = sh(f"journalctl -u {UNIT} --no-pager -n 50", check=False)
    pytest.fail(f"{UNIT} never became healthy:\n{journal}")


class Stream:
    """POST /v1/completions stream=true, read event by event: tokens, finish_reason, [DONE], or how it broke."""

    def __init__(self, address: str, max_tokens: int):
        self.tokens = 0
        self.finish_reason = None
        self.done = False
        self.error = None
        body = {"model": "glm-5", "prompt": "Tell a long story.", "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True}  # fmt: skip
        self.conn = http.client.HTTPConnection(address, 8000, timeout=120)
        self.conn.request("POST", "/v1/completions", json.dumps(body),
                          {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})  # fmt: skip
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            resp = self.conn.getresponse()
            if resp.status != 200:
                self.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
                return
            while True:
                line = resp.readline()
                if not line:
                    self.error = "connection closed before data: [DONE]"
                    return
                if not line.startswith(b"data: "):
                    continue
                payload = line[len(b"data: ") :].strip()
                if payload == b"[DONE]":
                    self.done = True
                    return
                choice = json.loads(payload)["choices"][0]
                if choice.get("text"):
                    self.tokens += 1
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        except (OSError, http.client.HTTPException) as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def install_unit(text: str) -> None:
    sh(f"cat > /etc/systemd/system/{UNIT} && systemctl daemon-reload && systemctl reset-failed {UNIT} || true",
       text.encode())  # fmt: skip


def unit_props() -> dict[str, str]:
    _, out = sh(f"systemctl show {UNIT} -p ActiveState -p SubState -p Result -p ExecMainCode -p ExecMainStatus "
                "-p InvocationID -p MainPID")  # fmt: skip
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize(
    ("unit_kind", "drains"),
    [("role unit (KillMode=mixed)", True), ("old unit (KillMode=control-group)", False)],
)
def test_stop_during_a_streaming_request(host, unit_kind, drains):
    role_unit = render_role_unit()
    assert "KillMode=mixed" in role_unit and "SuccessExitStatus=137 143" in role_unit
    text = role_unit if drains else old_unit(role_unit)
    install_unit(text)
    sh(f"systemctl enable {UNIT} && systemctl start {UNIT}")  # enabled, as the role leaves it
    wait_healthy(host)
    invocation = unit_props()["InvocationID"]

    stream = Stream(host, TOKENS)
    deadline = time.monotonic() + 15
    while stream.tokens < 10 and time.monotonic() < deadline and stream.error is None:
        time.sleep(0.05)
    assert stream.tokens >= 10, stream.error
    t0 = time.monotonic()
    rc, out = sh(f"systemctl stop {UNIT}", check=False, timeout=STOP_TIMEOUT_S + 60)  # a plain operator stop
    stop_s = time.monotonic() - t0
    stream.thread.join(timeout=30)
    props = unit_props()
    _, journal = sh(f"journalctl -u {UNIT} --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    _, manager = sh(f"journalctl -u {UNIT} --no-pager -o cat -n 30")
    # the role's own journal reader and accounting (sglang_server_swap), run against this host's journal
    entries = server_journal.journal_lines(
        UNIT, invocation, runner=lambda argv, timeout=60: (*sh(shlex.join(argv)), "")
    )
    stop_state = {"result": props["Result"], "exec_main_code": props["ExecMainCode"],
                  "exec_main_status": props["ExecMainStatus"]}  # fmt: skip
    account = server_drain.drain_account(1, entries, stop_state)
    _, left = sh(f"systemd-cgls --no-pager -u {UNIT} 2>/dev/null | grep -c sglang_sim || true", check=False)
    _, used = sh("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
    context = f"{unit_kind}: stop rc {rc} in {stop_s:.1f} s, {props}\n{out}\n{journal[-3000:]}\n{manager[-1500:]}"

    assert "Draining requests and shutting down..." in journal, context
    assert "Gracefully exiting... Remaining number of requests 1." in journal, context
    assert left.strip() == "0" and used.split() == ["0", "0"], context  # nothing left, GPUs free
    if drains:
        # the request is served in full while the server drains, and systemd calls the stop clean
        assert (stream.tokens, stream.finish_reason, stream.done, stream.error) == (TOKENS, "length", True, None)
        assert "Gracefully exiting... Remaining number of requests 0." in journal, context
        assert rc == 0 and props["ActiveState"] == "inactive" and props["Result"] == "success", context
        assert props["ExecMainStatus"] == "137", context  # the engine SIGKILLed itself; the launcher said so
        assert stop_s < STOP_TIMEOUT_S, context
        assert account["cut"] == 0 and account["drain_remaining"][-1] == 0, account
    else:
        # the schedulers died at once: no more tokens, the drain never ends, systemd kills at TimeoutStopSec
        assert not stream.done and stream.finish_reason is None and stream.tokens < TOKENS, context
        assert stream.error, context
        assert "Gracefully exiting... Remaining number of requests 0." not in journal, context
        assert props["Result"] == "timeout" and stop_s >= STOP_TIMEOUT_S - 1, context
        assert "State 'stop-sigterm' timed out. Killing." in manager, context
        assert account["cut"] == 1, account

    # the server comes back with a plain start
    sh(f"systemctl reset-failed {UNIT} || true; systemctl start {UNIT}")
    wait_healthy(host)
    again = Stream(host, 5)
    again.thread.join(timeout=30)
    assert (again.tokens, again.done) == (5, True), again.error
    sh(f"systemctl stop {UNIT}")


def test_the_roles_stop_reports_the_request_in_flight_and_none_cut(host, inventory, tmp_path):
    """sglang_server_swap (the role's stop) on the lab host while a 240-token stream runs."""
    install_unit(render_role_unit(timeout_stop_s=90))
    sh(f"systemctl enable {UNIT} && systemctl start {UNIT}")
    wait_healthy(host)
    # 900 tokens, 30 s: ansible's own start-up (ssh, several seconds on a busy machine) comes before the stop
    stream = Stream(host, 900)
    deadline = time.monotonic() + 15
    while stream.tokens < 10 and time.monotonic() < deadline and stream.error is None:
        time.sleep(0.05)
    args = {"unit": UNIT, "action": "stop", "gpus": [0, 1], "timeout": 30, "base_url": "http://127.0.0.1:8000",
            "secrets_file": "/etc/sglang-server/secrets.env"}  # fmt: skip
    env = dict(
        LAB_ENV,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
    )
    cmd = [str(ROOT / ".venv/bin/ansible"), "-i", str(inventory), HOST, "-m", "gpufleet.fleet.sglang_server_swap"]
    proc = subprocess.run(
        [*cmd, "-a", json.dumps(args)],
        capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=240,
    )  # fmt: skip
    stream.thread.join(timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = proc.stdout[proc.stdout.index("\n{") + 1 : proc.stdout.rindex("\n}") + 2]  # profile_tasks lines around it
    result = json.loads(doc)["plays"][0]["tasks"][0]["hosts"][HOST]
    drain = result["drain"]
    assert (stream.tokens, stream.finish_reason, stream.done) == (900, "length", True), stream.error
    assert drain["in_flight_at_stop"] == 1 and drain["load"]["source"] == "/v1/loads", drain
    assert drain["drain_remaining"][0] == 1 and drain["drain_remaining"][-1] == 0, drain
    assert (drain["cut"], drain["stop_result"], drain["exit"]["status"]) == (0, "success", "137"), drain
    assert result["released"] is True, result
