"""Hostile API keys reach the engine unchanged under systemd, through the role's own unit and secrets.env.

The role's templates (sglang-server.service.j2, secrets.env.j2) are rendered with its filters, installed on a
lab host with the simulated engine (which reads --config with PyYAML's safe_load like sglang 0.5.9's
ConfigArgumentMerger and compares keys like 0.5.9's decide_request_auth) and the role's log redactor. For each
key: systemd parses secrets.env, the ExecStartPre writes the --config YAML, the engine starts; the key
authenticates, a near miss does not, and the key is in no argv and not in the journal.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import collection_jinja
import pytest
import simfleet
from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as filters  # noqa: E402
from conftest import ROOT, lab, lab_json
from lab_host import on

sys.path.insert(0, str(ROOT / "locks"))
import update_locks  # noqa: E402 - the simulator's wheel and its dependency's (PyYAML)

NAME = "fidelity-keys"
ROLE = ROOT / "roles" / "sglang_server"
RELEASE = "/opt/ml-env/releases/sim-a"
KEYS = [
    "00017",
    "yes",
    "a: b",
    "x #y",
    "*k",
    "it's",
    "say \"hi\" 'twice'",
    "back\\slash\\",
    "$HOME ${USER} `id` $(id)",
    "100% %n %%",
]
VARS = {
    "sglang_server_argv": ["--model-path", "/srv/models/glm-5-sim", "--served-model-name", "glm-5", "--tp-size", "1"]
    + ["--host", "0.0.0.0", "--port", "8000"],
    "sglang_server_cache_dir": "/var/cache/sglang-server",
    "sglang_server_group": "sglang",
    "sglang_server_module": "sglang_sim.launch_server",
    "sglang_server_python": f"{RELEASE}/bin/python",
    "sglang_server_read_write_paths": [],
    "sglang_server_redactor_path": "/usr/local/libexec/gpufleet/sglang-log-redact",
    "sglang_server_redactor_sha256": "0" * 64,
    "sglang_server_release_id": "sim-a",
    "sglang_server_restart_policy": "no",
    "sglang_server_restart_sec": 5,
    "sglang_server_runtime_dir_name": "sglang-server",
    "sglang_server_secrets_file": "/etc/sglang-server/secrets.env",
    "sglang_server_served_name": "glm-5",
    "sglang_server_start_limit_burst": 100,
    "sglang_server_start_limit_interval_s": 10,
    "sglang_server_supplementary_groups": [],
    "sglang_server_timeout_start_s": 60,
    "sglang_server_timeout_stop_s": 20,
    "sglang_server_unit_environment": {
        "SGLANG_SIM_LOAD_SECONDS": "0.2",
        "SGLANG_SIM_GRAPH_SECONDS": "0.2",
        "SGLANG_SIM_ACCESS_LOG": "0",
        "HOME": "/var/lib/sglang",
    },
    "sglang_server_use_redactor": True,
    "sglang_server_user": "sglang",
    "sglang_server_user_home": "/var/lib/sglang",
    "sglang_server_hf_token": "",
}


def render(template: str, **extra) -> str:
    env = collection_jinja.environment()
    return env.from_string((ROLE / "templates" / template).read_text()).render({**VARS, **extra})


def request(address: str, path: str, key: str | None) -> int:
    req = urllib.request.Request(f"http://{address}:8000{path}")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    result = lab_json("--name", NAME, "up", "--hosts", "1")
    h = result["hosts"][0]
    try:
        wheels = update_locks.sim_wheels(tmp_path_factory.mktemp("wheels"))  # sglang-sim and PyYAML
        state = json.loads((Path("/var/lib/gpufleet-lab") / NAME / "state.json").read_text())
        root = Path(state["hosts"][h["name"]]["root"])
        (root / "root/sim-wheels").mkdir()
        for wheel in wheels:
            shutil.copyfile(wheel, root / "root/sim-wheels" / wheel.name)
        (root / "usr/local/libexec/gpufleet").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROLE / "files/sglang-log-redact.py", root / "usr/local/libexec/gpufleet/sglang-log-redact")
        on(
            h,
            f"set -e; python3 -m venv --without-pip {RELEASE}; "
            "for w in /root/sim-wheels/*.whl; do "
            f"{RELEASE}/bin/python -m zipfile -e $w {RELEASE}/lib/python3.11/site-packages; done; "
            f"{RELEASE}/bin/python -m compileall -q {RELEASE}/lib/python3.11/site-packages; "
            f"chmod -R a+rX {RELEASE} /usr/local/libexec/gpufleet; "
            "id sglang >/dev/null 2>&1 || "
            "useradd --system --home-dir /var/lib/sglang --shell /usr/sbin/nologin sglang; "
            "install -d -o sglang -g sglang /var/lib/sglang /var/cache/sglang-server; "
            "install -d -m 0755 /etc/sglang-server; " + simfleet.model_folder("/srv/models/glm-5-sim"),
        )
        yield h
    finally:
        lab("--name", NAME, "down", check=False)


def deploy(host: dict, key: str) -> None:
    on(host, "systemctl stop sglang-server.service || true", check=False)
    secrets = render("secrets.env.j2", sglang_server_api_key=key)
    on(host, "install -m 0600 /dev/stdin /etc/sglang-server/secrets.env", stdin=secrets)
    unit = render("sglang-server.service.j2", sglang_server_api_key=key)
    assert key not in unit
    on(host, "cat > /etc/systemd/system/sglang-server.service && systemctl daemon-reload", stdin=unit)
    on(host, "systemctl reset-failed sglang-server.service 2>/dev/null; systemctl start sglang-server.service")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if request(host["address"], "/health", None) == 200:
            return
        time.sleep(0.3)
    pytest.fail(f"not healthy:\n{on(host, 'journalctl -u sglang-server.service --no-pager | tail -40')}")


@pytest.mark.parametrize("key", KEYS)
def test_hostile_key_authenticates_unchanged(host, key):
    assert filters.sglang_api_key_problem(key) == ""
    deploy(host, key)
    address = host["address"]
    assert request(address, "/v1/models", key) == 200
    assert request(address, "/v1/models", key + "x") == 401
    assert request(address, "/v1/models", None) == 401
    # where YAML would have typed the unquoted key, the typed form is refused
    typed = {"00017": "15", "yes": "true", "x #y": "x"}.get(key)
    if typed is not None:
        assert request(address, "/v1/models", typed) == 401
    journal = on(host, "journalctl -u sglang-server.service --no-pager -o cat")
    assert "api_key='[REDACTED]'" in journal and repr(key) not in journal
    if len(key) >= 4:
        assert key not in journal
        assert key not in on(host, "ps -eo args")
    config = on(host, "cat /run/sglang-server/secret-args.yaml")
    assert config == "api-key: '" + key.replace("'", "''") + "'\n"
    mode = on(host, "stat -c '%a %U' /run/sglang-server/secret-args.yaml").split()
    assert mode == ["600", "sglang"]


def test_non_ascii_key_fails_every_authorized_request_like_0_5_9(host):
    """Why the role refuses non-ASCII keys: 0.5.9's secrets.compare_digest raises TypeError (HTTP 500)."""
    key = "clé-🔑-secret"
    assert "non-ASCII" in filters.sglang_api_key_problem(key)
    deploy(host, key)
    assert request(host["address"], "/v1/models", "any-ascii-key") == 500
    journal = on(host, "journalctl -u sglang-server.service --no-pager -o cat")
    assert "TypeError: comparing strings with non-ASCII characters is not supported" in journal
    assert key not in journal
