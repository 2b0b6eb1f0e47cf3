"""One server over two lab hosts: ranks and init address derived from inventory order into each unit, rank 0
the only node that serves (sglang 0.5.9: node rank >= 1 runs only a dummy health server), one report each."""

import json

from sglang_molecule import ask, exec_start_argv, flag, health, report

RANK = {"mn-0": 0, "mn-1": 1}
testinfra_hosts = [f"ansible://{name}" for name in RANK]  # the server's nodes (mn-gw is the router's host)


def _name(host):
    return host.backend.get_hostname()


def _rank0_ip(host_by_name):
    return host_by_name("mn-0").check_output("hostname -I").split()[0]


def test_units_carry_rank_nnodes_and_rank0_init_address(host, host_by_name):
    argv = exec_start_argv(host)
    assert flag(argv, "--nnodes") == "2"
    assert flag(argv, "--node-rank") == str(RANK[_name(host)])
    assert flag(argv, "--dist-init-addr") == f"{_rank0_ip(host_by_name)}:20000"
    assert flag(argv, "--tp-size") == "16"


def test_rank0_answers_a_generation_and_rank1_serves_no_generation(host):
    if RANK[_name(host)] == 0:
        assert health(host) == "200"
        assert "Paris" in ask(host, "What is the capital of France?")
    else:
        code = host.check_output(
            "curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H 'Content-Type: application/json' "
            '-d \'{"text": "hi"}\' http://127.0.0.1:8000/generate'
        )
        assert code == "404"
        assert health(host) == "200"  # the engine's dummy health server: proves only that its ranks joined


def test_both_nodes_hold_their_eight_gpus(host):
    apps = host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader").splitlines()
    assert len(apps) == 8


def test_reports_take_the_health_from_rank0(host):
    r = report(_name(host))
    assert r["result"] in ("ok", "unchanged"), json.dumps(r)[:2000]
    assert r["health"]["ok"] is True
    assert flag(r["flags"], "--nnodes") == "2" and flag(r["flags"], "--node-rank") == str(RANK[_name(host)])
    assert r["health"]["checked_on"] == "mn-0"


def test_both_nodes_run_with_infiniband_kept(host):
    # issue 12 row 6: nnodes reaches gpu_facts through sglang_server_parallel, so the derivation takes the
    # multi-node branch (no NCCL_IB_DISABLE); the report's nccl_env is read back from the running engine
    r = report(_name(host))
    assert r["engine_env"]["source"] == "process"
    assert r["nccl_env"] and "NCCL_IB_DISABLE" not in r["nccl_env"]
    assert "NCCL_IB_DISABLE" not in r["nccl_env_derived"]
