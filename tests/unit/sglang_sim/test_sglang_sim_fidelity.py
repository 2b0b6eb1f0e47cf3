"""sglang-sim held to sglang 0.5.9: health by generation, reasoning parser, NaN garbage, --config and API keys.

Each test names the 0.5.9 function it mirrors (read from the 0.5.9 wheel; see lab/sglang-sim/README.md).
"""

from __future__ import annotations

import http.client
import time

import pytest
from sglang_sim import textgen

PARIS_Q = {"messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}]}


# ---------------------------------------------------------------- http_server.health_generate
def test_health_runs_a_generation_that_takes_about_a_second(make_sim):
    s = make_sim(["--enable-metrics"]).wait_ready()
    before = s.get("/metrics").text
    t0 = time.monotonic()
    assert s.get("/health").status == 200
    took = time.monotonic() - t0
    assert 0.9 < took < 3.0  # submits one token, then polls every second
    t0 = time.monotonic()
    assert s.get("/health_generate").status == 200 and time.monotonic() - t0 > 0.9
    # the health request is not counted (log_metrics=False)
    assert _metric(s.get("/metrics").text, "num_requests_total") == _metric(before, "num_requests_total")


def _metric(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"sglang:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def test_health_generation_can_be_turned_off_for_health_only(make_sim):
    s = make_sim(env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}).wait_ready()
    t0 = time.monotonic()
    assert s.get("/health").status == 200 and time.monotonic() - t0 < 0.5
    t0 = time.monotonic()
    assert s.get("/health_generate").status == 200 and time.monotonic() - t0 > 0.9


def test_health_fails_when_the_engine_is_stuck(make_sim):
    s = make_sim(env={"SGLANG_SIM_FAULT": "hang-after-ready", "SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    s.wait_log("The server is fired up and ready to roll!")
    t0 = time.monotonic()
    assert s.get("/health", timeout=10).status == 503
    assert time.monotonic() - t0 >= 2.0
    assert "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds." in s.log()
    with pytest.raises(TimeoutError):  # the request itself never gets a token
        s.post("/v1/chat/completions", PARIS_Q, timeout=1.5)


def test_health_is_503_during_shutdown(make_sim):
    s = make_sim(env={"SGLANG_SIM_TOKENS_PER_S": "20"}).wait_ready()
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    conn.request("POST", "/generate", body=b'{"text": "x", "sampling_params": {"max_new_tokens": 60}}')
    time.sleep(0.3)
    s.signal(15)
    s.wait_log("Draining requests and shutting down")
    assert s.get("/health").status == 503
    assert "Health check request received during shutdown. Returning 503." in s.log()
    assert conn.getresponse().status == 200
    conn.close()


# ---------------------------------------------------------------- serving_chat + reasoning_parser
def test_reasoning_parser_fills_reasoning_content(make_sim):
    s = make_sim(["--reasoning-parser", "glm45"]).wait_ready()
    msg = s.post("/v1/chat/completions", PARIS_Q).json()["choices"][0]["message"]
    assert msg["content"] == "The capital of France is Paris."
    assert msg["reasoning_content"].startswith("The user asks") and "<think>" not in msg["reasoning_content"]


def test_small_max_tokens_is_spent_on_thinking(make_sim):
    s = make_sim(["--reasoning-parser", "glm45"]).wait_ready()
    body = s.post("/v1/chat/completions", {**PARIS_Q, "max_tokens": 20}).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "length"
    assert choice["message"]["reasoning_content"] and body["usage"]["completion_tokens"] == 20


def test_thinking_off_by_chat_template_kwargs(make_sim):
    s = make_sim(["--reasoning-parser", "glm45"]).wait_ready()
    req = {**PARIS_Q, "max_tokens": 20, "chat_template_kwargs": {"enable_thinking": False}}
    msg = s.post("/v1/chat/completions", req).json()["choices"][0]["message"]
    assert msg == {**msg, "content": "The capital of France is Paris.", "reasoning_content": None}


def test_reasoning_parser_streams_reasoning_then_content(make_sim):
    s = make_sim(["--reasoning-parser", "glm45"]).wait_ready()
    events = s.post("/v1/chat/completions", {**PARIS_Q, "stream": True}).sse()
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning.startswith("The user asks") and content.strip() == "The capital of France is Paris."
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_content:])


# ---------------------------------------------------------------- NaN: sampler.py _preprocess_logits
def test_nan_garbage_under_a_reasoning_parser_is_all_reasoning(make_sim):
    s = make_sim(["--reasoning-parser", "glm45"], env={"SGLANG_SIM_FAULT": "nan-output"}).wait_ready()
    body = s.post("/v1/chat/completions", {**PARIS_Q, "max_tokens": 50}).json()
    msg = body["choices"][0]["message"]
    assert msg["content"] is None and msg["reasoning_content"] == "!" * 50
    assert body["choices"][0]["finish_reason"] == "length"


def test_nan_is_logged_only_with_nan_detection(make_sim):
    s = make_sim(["--enable-nan-detection"], env={"SGLANG_SIM_FAULT": "nan-output"}).wait_ready()
    r = s.post("/generate", {"text": "capital of France?", "sampling_params": {"max_new_tokens": 8}}).json()
    assert r["text"] == "!!!!!!!!"
    assert s.log().count("Detected errors during sampling! NaN in the logits.") >= 8


# ---------------------------------------------------------------- utils/auth.py decide_request_auth
@pytest.mark.parametrize("key", ["00017", "yes", "a: b", "x #y", "*k", "it's", 'say "hi"', "back\\slash", "$HOME"])
def test_hostile_keys_from_config_authenticate_unchanged(make_sim, tmp_path, key):
    cfg = tmp_path / "secret-args.yaml"
    cfg.write_text("api-key: " + textgen_yaml_quote(key) + "\n")
    s = make_sim(["--config", str(cfg)]).wait_ready()
    assert s.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status == 200
    assert s.get("/v1/models", headers={"Authorization": "Bearer " + key[:-1]}).status == 401
    assert s.get("/v1/models", headers={"Authorization": f"bearer {key}"}).status == 200  # scheme: any case


def textgen_yaml_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def test_unquoted_key_reaches_the_engine_typed(make_sim, tmp_path):
    cfg = tmp_path / "secret-args.yaml"
    cfg.write_text("api-key: 00017\n")
    s = make_sim(["--config", str(cfg)]).wait_ready()
    assert s.get("/v1/models", headers={"Authorization": "Bearer 00017"}).status == 401
    assert s.get("/v1/models", headers={"Authorization": "Bearer 15"}).status == 200


def test_non_ascii_key_breaks_every_authorized_request_like_0_5_9(make_sim):
    s = make_sim(["--api-key", "clé-🔑"]).wait_ready()
    assert s.get("/v1/models").status == 401  # no header: refused before the comparison
    r = s.get("/v1/models", headers={"Authorization": "Bearer abc"})
    assert r.status == 500  # secrets.compare_digest raises TypeError for non-ASCII str
    assert "TypeError: comparing strings with non-ASCII characters is not supported" in s.log()


def test_metrics_and_health_need_no_key(make_sim):
    s = make_sim(["--api-key", "k3y-value", "--enable-metrics"]).wait_ready()
    assert s.get("/metrics").status == 200 and s.get("/health").status == 200
    assert s.get("/get_server_info").status == 401


def test_thinking_text_is_deterministic():
    a = textgen.thinking_text("What is 2+2?", "4.")
    assert a == textgen.thinking_text("What is 2+2?", "4.") and a.endswith("So the answer starts with: 4.")
