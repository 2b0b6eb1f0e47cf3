"""sglang_server on a simulated 8x RTX PRO 6000 VM with the seed's launch: the rendered unit, the
service user, secrets kept out of unit/ps/journal/Ansible output, health by generation, a second run
that changes nothing and does not restart, bad input refused before the running server is touched,
a forced safe restart (playbooks/restart.yml) and an on-demand rollback (playbooks/rollback.yml)."""

import json

import pytest
from gpufleet_testinfra import assert_unit_active
from sglang_molecule import (
    LAB_ENV,
    SEED_ENV,
    SEED_NCCL,
    UNIT,
    UNIT_PATH,
    ask,
    exec_start_argv,
    flag,
    health,
    props,
    report,
    run_playbook,
    serving,
)

SECRET = "mol-SECRET-key-7f3a91"
HOST = "sglang-01"
SEED_ARGS = [
    "--host", "0.0.0.0", "--port", "8000", "--tp-size", "8", "--mem-fraction-static", "0.92",
    "--attention-backend", "flashinfer", "--fp8-gemm-backend", "cutlass", "--nsa-decode-backend", "trtllm",
    "--nsa-prefill-backend", "trtllm", "--moe-runner-backend", "flashinfer_cutlass",
    "--enable-flashinfer-allreduce-fusion", "--model-path", "/srv/models/glm-5-sim", "--served-model-name", "glm-5",
    "--reasoning-parser", "glm45", "--tool-call-parser", "glm47", "--trust-remote-code",
    "--max-running-requests", "64", "--kv-cache-dtype", "auto", "--quantization", "modelopt_fp4",
    "--disable-custom-all-reduce",
]  # fmt: skip
KEYED = {"sglang_server_api_key": SECRET}


@pytest.fixture(scope="module")
def second_run(host):
    """Run the server stage again (verbose, so module results are printed) and capture everything."""
    before = props(host)
    rc, out = run_playbook("playbooks/deploy_server.yml", KEYED, verbosity=1)
    return before, props(host), rc, out


def test_unit_environment_line_by_line(host):
    lines = host.file(UNIT_PATH).content_string.splitlines()
    for key, value in {**SEED_NCCL, **SEED_ENV, "HF_HUB_OFFLINE": "1"}.items():
        assert f'Environment="{key}={value}"' in lines, key
    for key, value in LAB_ENV.items():
        assert f'Environment="{key}={value}"' in lines
    assert "EnvironmentFile=/etc/sglang-server/secrets.env" in lines
    for line in ("KillMode=mixed", "SuccessExitStatus=137 143", "TimeoutStartSec=120", "TimeoutStopSec=30",
                 "Restart=on-failure",
                 "ProtectSystem=strict", "NoNewPrivileges=true", "ProtectHome=true", "PrivateTmp=true"):  # fmt: skip
        assert line in lines
    assert not any(line.startswith("PrivateDevices") for line in lines)


def test_exec_start_is_the_seed_launch(host):
    argv = exec_start_argv(host)
    python = "/opt/ml-env/releases/sim-a/bin/python"
    # The log-redacting launcher runs the engine (a secret is set), then the engine's own command line.
    assert argv[:3] == [python, "/usr/local/libexec/gpufleet/sglang-log-redact", "--"]
    assert argv[3:6] == [python, "-m", "sglang_sim.launch_server"]
    # metrics first (the role's own lowest flag layer, sglang_server_metrics), then the seed's flags in layer order
    assert argv[6:-2] == ["--enable-metrics", *SEED_ARGS]
    assert argv[-2:] == ["--config", "/run/sglang-server/secret-args.yaml"]


def test_runs_as_the_service_user_with_every_process_in_the_unit(host):
    assert_unit_active(host, UNIT)
    assert host.service(UNIT).is_enabled
    main_pid = props(host)["MainPID"]
    assert host.check_output(f"ps -o user= -p {main_pid}") == "sglang"
    users = host.check_output("ps -eo user=,args= | grep -E 'sglang_sim\\.(launch_server|scheduler|detokenizer)' "
                              "| grep -v grep | awk '{print $1}' | sort -u")  # fmt: skip
    assert users == "sglang"
    apps = host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()
    assert len(apps) == 8
    for pid in apps:
        assert f"/system.slice/{UNIT}" in host.file(f"/proc/{pid}/cgroup").content_string


def test_secrets_file_is_root_0600(host):
    f = host.file("/etc/sglang-server/secrets.env")
    assert (f.user, f.group, f.mode) == ("root", "root", 0o600)
    assert f'SGLANG_SERVER_API_KEY="{SECRET}"' in f.content_string
    assert host.file("/var/lib/gpufleet/sglang-server/last-good/secrets.env").mode == 0o600


def test_secret_is_not_in_unit_ps_journal_or_report(host):
    assert SECRET not in host.file(UNIT_PATH).content_string
    assert SECRET not in host.check_output("ps -eo pid,args ww")
    journal = host.run("journalctl --no-pager -o cat").stdout
    assert SECRET not in journal
    # The engine logged its arguments, key included: the launcher masked it.
    assert "api_key='[REDACTED]'" in journal
    assert SECRET not in host.run("journalctl --no-pager -o verbose").stdout
    assert SECRET not in json.dumps(report(HOST))


def test_health_models_and_generation_with_the_api_key(host):
    assert health(host) == "200"
    assert host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/v1/models") == "401"
    models = host.check_output(f"curl -sf -H 'Authorization: Bearer {SECRET}' http://127.0.0.1:8000/v1/models")
    assert [m["id"] for m in json.loads(models)["data"]] == ["glm-5"]
    assert "Paris" in ask(host, "What is the capital of France?", api_key=SECRET)


def test_report_of_the_first_deploy(host):
    r = report(HOST)
    assert r["result"] in ("ok", "unchanged")
    assert r["nccl_env"] == SEED_NCCL
    assert set(r["comm_sources"].values()) == {"facts"}
    assert r["versions"]["ml_env_release_id"] == "sim-a"
    assert "--disable-custom-all-reduce" in r["flags"]


def test_report_nccl_env_is_read_back_from_the_running_engine(host):
    # the report shows the environment the engine really got, not a recomputation
    r = report(HOST)
    pid = props(host)["MainPID"]
    environ = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    running = dict(item.split("=", 1) for item in environ if item.startswith("NCCL_"))
    assert r["engine_env"] == {"source": "process", "main_pid": int(pid)}
    assert r["nccl_env"] == running == SEED_NCCL


def test_second_run_changes_nothing_and_does_not_restart(second_run):
    before, after, rc, out = second_run
    assert rc == 0, out[-3000:]
    assert "changed=0" in out.split("PLAY RECAP")[-1]
    assert after["MainPID"] == before["MainPID"]
    assert after["ExecMainStartTimestamp"] == before["ExecMainStartTimestamp"]
    r = report(HOST)
    assert r["result"] == "unchanged" and r["health"]["ok"]
    assert r["health"]["prompts"][0]["answer"].find("Paris") >= 0


def test_secret_is_not_in_ansible_output(second_run):
    _before, _after, _rc, out = second_run
    assert SECRET not in out
    assert "Health by generation" in out  # the run really checked the server with the key


@pytest.mark.parametrize(
    ("extra", "messages"),
    [
        (
            {"sglang_server_args_host": {"nsa-decode-backen": "trtllm"}},
            ["--nsa-decode-backen is not an option of sglang_sim.launch_server", "did you mean --nsa-decode-backend"],
        ),
        # NCCL variables have one path (gpu_facts_nccl_env_overrides) and one guard
        (
            {"sglang_server_environment": {"NCCL_SHM_DISABLE": "1"}},
            [
                "sglang_server_environment sets NCCL_SHM_DISABLE",
                "move NCCL_SHM_DISABLE from sglang_server_environment to gpu_facts_nccl_env_overrides",
            ],
        ),
    ],
    ids=["flag-typo", "nccl-in-server-environment"],
)
def test_bad_input_is_refused_before_the_server_is_touched(host, second_run, extra, messages):
    # the flag typo: validate (the engine's own --help); NCCL in sglang_server_environment: the flags entry point
    before = props(host)
    rc, out = run_playbook("playbooks/deploy_server.yml", {**KEYED, **extra})
    assert rc != 0
    for message in messages:
        assert message in out
    assert props(host) == before
    assert health(host) == "200"


def test_safe_restart_playbook(host, second_run):
    before = props(host)
    rc, out = run_playbook("playbooks/restart.yml", KEYED)
    assert rc == 0, out[-3000:]
    after = props(host)
    assert after["MainPID"] != before["MainPID"] and after["ActiveState"] == "active"
    r = report(HOST)
    assert r["result"] == "ok"
    assert "forced (sglang_server_force_restart)" in r["restart_reasons"]
    assert r["restart"]["deploy"]["released"] is True
    assert [p["phase"] for p in r["restart"]["deploy"]["phases"]][-1] == "ready"
    assert "ready after" in out  # progress lines


def test_on_demand_rollback_restores_the_previous_good_version(host, second_run):
    """Deploy B (another flag value), then roll back on demand: the process that serves is A again (its
    argv and the engine's own /get_server_info say max-running-requests 64), proven by a generation."""
    rc, out = run_playbook(
        "playbooks/deploy_server.yml", {**KEYED, "sglang_server_args_host": {"max-running-requests": 32}}
    )
    assert rc == 0, out[-3000:]
    b = serving(host, api_key=SECRET)
    assert flag(b["engine"]["argv"], "--max-running-requests") == "32"
    assert b["server_info"]["max_running_requests"] == 32
    rc, out = run_playbook("playbooks/rollback.yml", KEYED)
    assert rc == 0, out[-3000:]
    a = serving(host, api_key=SECRET)
    assert a["engine"] is not None and a["engine"]["pid"] != b["engine"]["pid"]
    assert a["engine"]["argv"][0] == "/opt/ml-env/releases/sim-a/bin/python"
    assert flag(a["engine"]["argv"], "--max-running-requests") == "64"
    assert a["server_info"]["max_running_requests"] == 64
    assert flag(exec_start_argv(host), "--max-running-requests") == "64"
    assert health(host) == "200"
    assert "Paris" in ask(host, "What is the capital of France?", api_key=SECRET)
    r = report(HOST)
    assert r["result"] == "rolled_back" and r["rollback"]["healthy"] is True and r["rollback"]["on_demand"] is True
    assert r["restart"]["rollback"]["main_pid"] == int(props(host)["MainPID"])
    assert r["health"]["ok"] is True
