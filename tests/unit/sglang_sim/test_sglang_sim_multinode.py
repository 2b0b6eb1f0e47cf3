"""sglang-sim with --nnodes 2 as sglang 0.5.9 runs it: node 0 waits at --dist-init-addr for every node
(model_runner.init_distributed_environment), node 1 serves only the dummy health server
(engine.py _launch_subprocesses, utils/common.py launch_dummy_health_check_server) and has no SIGTERM handler."""

from __future__ import annotations

import signal
import time

from sglang_sim_helpers import free_port


def _pair(make_sim, init_port: int, ranks=(0, 1), extra=None):
    sims = []
    for rank in ranks:
        args = [
            "--tp-size",
            "4",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            f"127.0.0.1:{init_port}",
        ]
        sims.append(make_sim(args + (extra or []), n_gpus=2, subdir=f"node{rank}"))
    return sims


def test_rank0_waits_for_every_node_then_serves_and_rank1_only_answers_health(make_sim):
    init_port = free_port()
    (node0,) = _pair(make_sim, init_port, ranks=(0,))
    node0.wait_log("Init torch distributed begin")
    time.sleep(2.0)
    # a missing node: node 0 never loads, never binds its port
    assert "Load weight begin" not in node0.log()
    assert node0.proc.poll() is None
    try:
        node0.get("/health", timeout=1)
        raise AssertionError("node 0 answered while node 1 was missing")
    except OSError:
        pass
    (node1,) = _pair(make_sim, init_port, ranks=(1,))
    node0.wait_ready(timeout=20)
    gen = node0.post("/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 16}})
    assert gen.status == 200 and "Paris" in gen.json()["text"]
    # node 1: the dummy health server only, no generation, no fired-up line
    deadline = time.monotonic() + 10
    while True:
        try:
            health = node1.get("/health", timeout=1)
            break
        except OSError:
            assert time.monotonic() < deadline, node1.log()
            time.sleep(0.2)
    assert health.status == 200
    assert node1.get("/ping").status == 200
    assert node1.post("/generate", {"text": "hi"}).status == 404
    assert node1.get("/v1/models").status == 404
    assert "fired up" not in node1.log()
    # node 1 has no SIGTERM handler: it ends by the signal at once
    node1.signal(signal.SIGTERM)
    assert node1.wait_exit(timeout=5) == -signal.SIGTERM


def test_rank0_engine_stalls_when_a_node_leaves(make_sim):
    node0, node1 = _pair(make_sim, free_port())
    node0.wait_ready(timeout=20)
    node1.proc.kill()
    node1.wait_exit(timeout=5)
    time.sleep(0.5)
    try:
        res = node0.post("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}}, timeout=3)
        raise AssertionError(f"node 0 answered with node 1 gone: {res.status}")
    except OSError:
        pass  # NCCL hangs: the request never gets a token


def test_node_without_init_addr_never_meets(make_sim):
    args = ["--tp-size", "4", "--nnodes", "2", "--node-rank", "0", "--dist-timeout", "2"]
    node0 = make_sim(args, n_gpus=2)
    text = node0.wait_log("Timed out after 2 seconds waiting for clients", timeout=15)
    assert "1/2 nodes joined" in text
    assert node0.wait_exit(timeout=5) == -signal.SIGKILL
