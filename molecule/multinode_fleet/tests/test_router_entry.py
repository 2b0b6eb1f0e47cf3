"""The router in front of the two-node server (issue 15, multi-node): SGLang serves HTTP on node 0 only, so the
router (the real Shepherd Model Gateway on mn-gw, roles/fleet_router) holds exactly one worker, node 0's URL,
and a request sent to the router is answered by the server."""

import json
import shlex

import pytest
from gpufleet_testinfra import journal

testinfra_hosts = ["ansible://mn-gw"]
KEY = "gpufleet-lab-router-key-not-a-secret"  # the lab's router key (inventory/lab/group_vars/gpufleet_lab)
ROUTER = "http://127.0.0.1:30000"


def _address(host_by_name, name):
    return host_by_name(name).check_output("hostname -I").split()[0]


def _get(host, path, key=KEY):
    auth = f"-H 'Authorization: Bearer {key}' " if key else ""
    res = host.run(f"curl -s --max-time 30 -w '\\n%{{http_code}}' {auth}{ROUTER}{path}")
    body, _, code = res.stdout.rpartition("\n")
    return code, body


def test_the_router_lists_node_0_only(host, host_by_name):
    code, body = _get(host, "/workers")
    if code != "200":
        pytest.fail(f"GET /workers answered {code}: {body[:500]}\n{journal(host, 'smg-router')}")
    workers = json.loads(body)["workers"]
    assert [w["url"] for w in workers] == [f"http://{_address(host_by_name, 'mn-0')}:8000"], workers
    assert workers[0]["is_healthy"] is True


def test_the_worker_list_refuses_a_caller_without_the_key(host):
    code, _ = _get(host, "/workers", key=None)
    assert code == "401"


def test_a_generation_through_the_router_is_answered_by_the_server(host):
    body = json.dumps(
        {"model": "glm-5", "max_tokens": 1024,
         "messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}]}
    )  # fmt: skip
    res = host.run(
        f"curl -s --max-time 60 -w '\\n%{{http_code}}' -H 'Content-Type: application/json' "
        f"-d {shlex.quote(body)} {ROUTER}/v1/chat/completions"
    )
    answer, _, code = res.stdout.rpartition("\n")
    assert code == "200", f"{answer[:500]}\n{journal(host, 'smg-router')}"
    assert "Paris" in json.dumps(json.loads(answer)["choices"][0]["message"])
