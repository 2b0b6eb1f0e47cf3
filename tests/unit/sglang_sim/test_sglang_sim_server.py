"""sglang-sim end to end: a real simulator process on loopback with tmp GPU profile/registry dirs."""

from __future__ import annotations

import ast
import json
import signal
import socket
import struct
import threading
import time

import pytest
from sglang_sim_helpers import GPU_RESERVED_MIB, GPU_TOTAL_MIB, Sim, pid_alive

SIM_HEADER = "x-gpufleet-simulator"


def budget(fraction: float) -> int:
    return int(fraction * (GPU_TOTAL_MIB - GPU_RESERVED_MIB))


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = Sim(
        tmp_path_factory.mktemp("shared-sim"),
        ["--tp", "2", "--served-model-name", "glm-5", "--enable-metrics", "--mem-fraction-static", "0.9"],
    )
    s.start()
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


# ---------------------------------------------------------------- start-up
def test_startup_health_state_machine_and_log(make_sim):
    s = make_sim(env={"SGLANG_SIM_LOAD_SECONDS": "0.6", "SGLANG_SIM_GRAPH_SECONDS": "0.3"})
    s.wait_log("Load weight begin.")
    assert s.status("/health") is None  # uvicorn binds only after the model is loaded (0.5.9)
    s.wait_ready()
    log = s.wait_log("The server is fired up and ready to roll!")
    assert s.get("/v1/models").json()["data"][0]["id"] == s.model_path
    assert log.splitlines()[0].endswith(
        "sglang-sim 0.1.0: gpufleet lab simulator (not SGLang), emulating `python -m sglang.launch_server` "
        "of sglang 0.5.9"
    )
    order = [
        "Load weight begin. avail mem=",
        "Load weight end. type=",
        "KV Cache is allocated. #tokens: ",
        "Capture cuda graph begin. This can take up to several minutes. avail mem=",
        # 16 GiB GPUs: cuda_graph_max_bs 8 (0.5.9 server_args.py:936-942), bs from _generate_cuda_graph_batch_sizes
        "Capture cuda graph bs [1, 2, 4, 8]",
        "Capture cuda graph end. Time elapsed: ",
        "INFO:     Started server process",
        "Uvicorn running on http://127.0.0.1:",
        "The server is fired up and ready to roll!",
    ]
    positions = [log.index(line) for line in order]
    assert positions == sorted(positions)
    assert s.get("/health_generate").status == 200


def test_disable_cuda_graph_skips_capture(make_sim):
    s = make_sim(["--disable-cuda-graph"]).wait_ready()
    log = s.wait_log("fired up")
    assert "KV Cache is allocated" in log and "Capture cuda graph" not in log


def test_simulator_identifies_itself(sim):
    for path in ("/health", "/v1/models", "/get_server_info", "/nope"):
        assert sim.get(path).headers[SIM_HEADER] == "sglang-sim 0.1.0"
    info = sim.get("/get_server_info").json()
    assert info["simulator"] is True and info["version"] == "0.5.9-sim"
    assert info["tp_size"] == 2 and info["served_model_name"] == "glm-5"  # the ServerArgs field, not argparse's
    assert info["model_path"] == sim.model_path
    model_info = sim.get("/get_model_info").json()
    assert model_info["model_path"] == sim.model_path
    assert model_info["tokenizer_path"] == sim.model_path and model_info["is_generation"] is True
    assert sim.get("/v1/models").json()["data"][0]["id"] == "glm-5"


def test_children_per_tp_rank_and_registry(sim):
    kids = sim.children()
    reg = sim.registry()
    assert sorted(e["process_name"] for e in reg.values()) == [
        "sglang::scheduler_TP0",
        "sglang::scheduler_TP1",
    ]
    gpus_used = {}
    for pid, entry in reg.items():
        assert pid in kids and pid_alive(pid)
        assert entry["leak"] is False and isinstance(entry["starttime"], int)
        gpus_used.update(entry["gpus"])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"sglang_sim.scheduler" in f.read()
    assert gpus_used == {"0": budget(0.9), "1": budget(0.9)}
    assert len(kids) == 3  # two schedulers + detokenizer
    assert all(not p.name.startswith(".tmp") for p in sim.state_dir.iterdir())


# ---------------------------------------------------------------- generation
def test_chat_completion_paris(sim):
    r = sim.post(
        "/v1/chat/completions",
        {
            "model": "glm-5",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
            "temperature": 0,
            "some_router_field": {"x": 1},
        },
    )
    assert r.status == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "glm-5"
    choice = body["choices"][0]
    # no --reasoning-parser: the thinking model's <think> block stays in content, as in SGLang
    content = choice["message"]["content"]
    assert content.startswith("<think>") and content.endswith("</think>\n\nThe capital of France is Paris.")
    assert choice["message"]["reasoning_content"] is None and choice["finish_reason"] == "stop"
    u = body["usage"]
    n = u["completion_tokens"]
    assert n > 30 and u["total_tokens"] == u["prompt_tokens"] + n and u["prompt_tokens"] > 5


def test_chat_is_prime_answer_parses(sim):
    r = sim.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Write a Python is_prime function with docstring and type hints"}]},
    )
    content = r.json()["choices"][0]["message"]["content"]
    code = content.split("```python\n", 1)[1].split("```", 1)[0]
    tree = ast.parse(code)
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef) and fn.name == "is_prime"
    assert ast.get_docstring(fn) and fn.returns is not None and fn.args.args[0].annotation is not None


def test_max_tokens_and_alias(sim):
    q = {"messages": [{"role": "user", "content": "capital of France?"}]}
    r = sim.post("/v1/chat/completions", {**q, "max_tokens": 3}).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"
    r = sim.post("/v1/chat/completions", {**q, "max_completion_tokens": 2}).json()
    assert r["usage"]["completion_tokens"] == 2


def test_completions_and_generate(sim):
    r = sim.post("/v1/completions", {"model": "glm-5", "prompt": "The capital of France is", "max_tokens": 64})
    body = r.json()
    assert r.status == 200 and body["object"] == "text_completion" and "Paris" in body["choices"][0]["text"]
    assert body["usage"]["prompt_tokens"] == 5
    r = sim.post("/v1/completions", {"prompt": "Some random prompt about boats"})
    assert r.json()["usage"]["completion_tokens"] == 16  # OpenAI default max_tokens
    r = sim.post("/generate", {"text": "capital of France?", "sampling_params": {"max_new_tokens": 32}})
    body = r.json()
    assert "Paris" in body["text"]
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 7
    assert meta["finish_reason"]["type"] == "stop" and meta["e2e_latency"] > 0
    r = sim.post("/generate", {"text": "benchmark", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}})
    assert r.json()["meta_info"]["completion_tokens"] == 40
    assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert sim.post("/v1/chat/completions", {"messages": []}).status == 400
    assert sim.request("POST", "/generate", body=None).status == 400
    assert sim.get("/generate").status == 405


def test_streaming(sim):
    r = sim.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "capital of France?"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = r.sse()
    assert events[-1] == "[DONE]"
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    assert content.startswith("<think>") and content.endswith("</think>\n\nThe capital of France is Paris.")
    assert [e for e in events[:-1] if e["choices"]][-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == len([e for e in events[1:-2] if e["choices"][0]["delta"]])

    r = sim.post("/v1/completions", {"prompt": "capital of France", "max_tokens": 4, "stream": True})
    events = r.sse()
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "The capital of France"
    assert events[-2]["choices"][0]["finish_reason"] == "length"

    r = sim.post("/generate", {"text": "capital of France", "stream": True})
    events = r.sse()
    assert events[-1] == "[DONE]" and events[-2]["text"] == "The capital of France is Paris."
    assert events[-2]["meta_info"]["completion_tokens"] == 7


def test_metrics(sim):
    sim.post("/generate", {"text": "metrics please", "sampling_params": {"max_new_tokens": 4}})
    r = sim.get("/metrics")
    assert r.status == 200 and r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = r.text
    sched = 'engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    for name in ("num_running_reqs", "num_queue_reqs", "gen_throughput", "token_usage", "num_used_tokens"):
        assert f"sglang:{name}{{{sched}}} " in text, name
    assert 'sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="glm-5"}' in text
    gen = [ln for ln in text.splitlines() if ln.startswith('sglang:generation_tokens_total{model_name="glm-5"} ')]
    assert float(gen[0].rsplit(" ", 1)[1]) >= 4
    assert 'sglang:prompt_tokens_total{model_name="glm-5"} ' in text


def test_api_key_and_no_metrics(make_sim):
    s = make_sim(["--api-key", "s3cret"]).wait_ready()
    assert s.get("/health").status == 200 and s.get("/health_generate").status == 200
    assert s.get("/v1/models").status == 401
    assert s.post("/v1/completions", {"prompt": "x"}).status == 401
    assert s.get("/get_server_info", headers={"Authorization": "Bearer wrong"}).status == 401
    auth = {"Authorization": "Bearer s3cret"}
    assert s.get("/v1/models", headers=auth).status == 200
    assert s.post("/v1/completions", {"prompt": "x", "max_tokens": 2}, headers=auth).status == 200
    assert s.get("/metrics", headers=auth).status == 404  # no --enable-metrics


# ---------------------------------------------------------------- throughput model
def _aggregate_tps(s: Sim, concurrency: int, tokens: int) -> float:
    results: list[int] = []

    def one():
        r = s.post("/generate", {"text": "bench", "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}})
        results.append(r.json()["meta_info"]["completion_tokens"])

    threads = [threading.Thread(target=one) for _ in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    assert results == [tokens] * concurrency
    return sum(results) / elapsed


def test_throughput_rises_with_concurrency(make_sim):
    s = make_sim(env={"SGLANG_SIM_TOKENS_PER_S": "150", "SGLANG_SIM_SATURATION": "8"}).wait_ready()
    tps1 = _aggregate_tps(s, 1, 30)
    tps8 = _aggregate_tps(s, 8, 30)
    assert 50 < tps1 < 160  # one request alone: about SGLANG_SIM_TOKENS_PER_S
    # model: 8 * 150 / (1 + 7/8) = 640 tok/s
    assert tps8 > 2.5 * tps1


# (shutdown: test_sglang_sim_shutdown.py)


# ---------------------------------------------------------------- faults
def test_fault_crash_on_start(make_sim):
    s = make_sim(env={"SGLANG_SIM_FAULT": "crash-on-start"})
    assert s.wait_exit() == 1
    log = s.log()
    assert "Traceback (most recent call last):" in log and "crash-on-start" in log
    assert "Uvicorn running" not in log


def test_fault_nan_output(make_sim):
    s = make_sim(env={"SGLANG_SIM_FAULT": "nan-output"}).wait_ready()
    r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "capital of France?"}]})
    text = r.json()["choices"][0]["message"]["content"]
    assert text == "!" * 128 and r.json()["choices"][0]["finish_reason"] == "length"
    # the NaN warning needs --enable-nan-detection (off by default in 0.5.9)
    assert "NaN" not in s.log()
    assert s.status("/health") == 200  # health stays green: that's the trap


def test_fault_wrong_answer(make_sim):
    s = make_sim(env={"SGLANG_SIM_FAULT": "wrong-answer"}).wait_ready()
    r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "capital of France?"}]})
    assert r.json()["choices"][0]["message"]["content"].endswith("</think>\n\nThe capital of France is Berlin.")


def test_fault_slow_start(make_sim):
    s = make_sim(env={"SGLANG_SIM_FAULT": "slow-start=1.0"})
    t = s.wait_status(200, timeout=15)
    assert t >= 1.0


def test_fault_port_taken(make_sim):
    s = make_sim(["--host", "0.0.0.0"], env={"SGLANG_SIM_FAULT": "port-taken", "SGLANG_SIM_WARMUP_TRIES": "2"})
    s.wait_log("Capture cuda graph end.")
    kids = s.children()
    # the bind fails only after the load, with the GPU memory taken; then the warm-up thread gives up and
    # kill_process_tree SIGKILLs the children and the main process
    assert s.wait_exit() == -signal.SIGKILL
    log = s.log()
    bind = log.index(f"error while attempting to bind on address ('0.0.0.0', {s.port}): address already in use")
    assert log.index("Capture cuda graph end.") < bind < log.index("Initialization failed. warmup error")
    time.sleep(0.2)
    assert not any(pid_alive(p) for p in kids)


def test_real_port_conflict(make_sim, sim):
    s = make_sim(start=False)
    s.args[s.args.index("--port") + 1] = str(sim.port)
    s.port = sim.port
    s.env["SGLANG_SIM_WARMUP_TRIES"] = "3"
    s.start()
    # 0.5.9's warm-up thread polls the URL, finds the other server, warms it up, and uvicorn exits 1
    assert s.wait_exit() == 1
    log = s.log()
    assert f"('127.0.0.1', {sim.port}): address already in use" in log
    assert log.index("address already in use") < log.index("The server is fired up and ready to roll!")


def test_fault_unknown(make_sim):
    s = make_sim(env={"SGLANG_SIM_FAULT": "melt-down"})
    assert s.wait_exit() == 2
    assert "unknown fault 'melt-down'" in s.log()


def test_registry_file_is_json_contract(sim):
    for path in sim.state_dir.glob("alloc-*.json"):
        entry = json.loads(path.read_text())
        assert set(entry) == {"pid", "process_name", "gpus", "leak", "starttime"}
        assert path.name == f"alloc-{entry['pid']}.json"


def test_a_client_that_resets_its_connection_leaves_no_traceback_in_the_log(sim):
    """uvicorn notes a lost connection at debug level only; a traceback in the engine's journal fails the deploy's
    health check (sglang_server_journal_error_patterns), so a client that timed out must not leave one."""
    before = sim.log()
    for partial in (
        b"",
        b"GET /health HTTP/1.1\r\nHost: sim\r\n",
        b"POST /generate HTTP/1.1\r\nContent-Length: 99\r\n\r\n{",
    ):
        client = socket.create_connection(("127.0.0.1", sim.port))
        if partial:
            client.sendall(partial)
        time.sleep(0.1)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        client.close()
    assert sim.get("/health").status == 200
    new = sim.log()[len(before) :]
    assert "Traceback" not in new and "ConnectionResetError" not in new, new
