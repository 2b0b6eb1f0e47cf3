"""sglang-sim /metrics held to sglang 0.5.9's collectors and prometheus_client 0.26.0's exposition.

The golden files (fixtures/README.md) were written by 0.5.9's own collector.py through the real prometheus_client;
the in-process tests feed the simulator's collectors the same observations and compare line by line.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import re
import socket
import threading
import time
from pathlib import Path

import pytest
from sglang_sim import metrics as m

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHED = {"model_name": "glm-5", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
SCHED_LABELS = 'engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
PROMETHEUS_2_42_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def families(text: str) -> dict[str, list[str]]:
    """HELP/TYPE-led blocks by family name (the order of families is the multiprocess directory's: ignored)."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            out[name] = []
        if name is not None and line != "# EOF":
            out[name].append(line)
    return out


def golden_state() -> m.SglangMetrics:
    """The observations the fixtures were made with (fixtures/README.md)."""
    sm = m.SglangMetrics(
        tokenizer_labels={"model_name": "glm-5"},
        scheduler_labels=[SCHED],
        scheduler_pid=4242,
        page_size=64,
        max_total_num_tokens=64000,
    )
    sm.log_stats(
        {
            "num_running_reqs": 2,
            "num_used_tokens": 123,
            "token_usage": 0.01,
            "gen_throughput": 55.5,
            "num_queue_reqs": 1,
            "max_total_num_tokens": 64000,
        }
    )
    sm.observe_queue_time(0.03)
    sm.cuda_graph_pass(True)
    sm.realtime_tokens_inc("prefill_compute", 7)
    sm.realtime_tokens_inc("decode", 2)
    sm.observe_ttft(0.15)
    sm.observe_itl(0.05, 2)
    sm.finished(7, 8, 3, 0.5)
    sm.aborted()
    sm.http_requests.inc({"endpoint": "/generate", "method": "POST"})
    sm.http_response("/generate", "POST", 200)
    sm.http_active.inc({"endpoint": "/metrics", "method": "GET"})
    sm.cpu_seconds.inc({"component": "detokenizer"}, 0.25)
    return sm  # cache_config_info: page_size 64, 64000 // 64 = 1000 pages, as in the fixture


@pytest.mark.parametrize(
    ("accept", "fixture", "content_type"),
    [
        (None, "metrics-0.5.9-text.txt", "text/plain; version=0.0.4; charset=utf-8"),
        (
            PROMETHEUS_2_42_ACCEPT,
            "metrics-0.5.9-openmetrics.txt",
            "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores",
        ),
    ],
)
def test_exposition_matches_0_5_9_collectors_through_prometheus_client(accept, fixture, content_type):
    want = families((FIXTURES / fixture).read_text().replace("SCHEDULER_PID", "4242"))
    body, headers = golden_state().render(accept, None, "")
    text = body.decode()
    assert headers == {"Content-Type": content_type}
    got = families(text)
    assert set(got) == set(want)
    for name, lines in want.items():
        assert got[name] == lines, name
    if accept is None:
        assert text.startswith("# sglang-sim: gpufleet lab simulator (not SGLang)\n# HELP ")
    else:  # OpenMetrics allows no other comment, and ends with # EOF
        assert text.startswith("# HELP ") and text.endswith("\n# EOF\n")


def test_openmetrics_for_prometheus_escapes_the_colon_in_sample_names_only():
    body, _ = golden_state().render(PROMETHEUS_2_42_ACCEPT, None, "")
    text = body.decode()
    assert "# TYPE sglang:num_running_reqs gauge" in text
    assert f"sglang_num_running_reqs{{{SCHED_LABELS}}} 2.0" in text
    assert (
        "# TYPE sglang:prompt_tokens counter" in text and 'sglang_prompt_tokens_total{model_name="glm-5"} 7.0' in text
    )
    assert "\nsglang:" not in text  # no sample keeps the colon
    # Prometheus 3 asks for allow-utf-8 escaping: the colon stays
    body, headers = golden_state().render("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8", None, "")
    assert headers["Content-Type"].endswith("escaping=allow-utf-8")
    assert f"\nsglang:num_running_reqs{{{SCHED_LABELS}}} 2.0\n" in body.decode()


@pytest.mark.parametrize(
    ("accept", "fmt", "escaping"),
    [
        ("", "text", "underscores"),
        ("text/plain;version=0.0.4", "text", "underscores"),
        ("application/openmetrics-text;version=0.0.1", "text", "underscores"),
        ("application/openmetrics-text", "openmetrics", "underscores"),
        ("text/plain;version=1.0.0;escaping=allow-utf-8", "text", "allow-utf-8"),
        ("*/*", "text", "underscores"),
    ],
)
def test_choose_format_like_prometheus_client(accept, fmt, escaping):
    assert m.choose_format(accept)[:2] == (fmt, escaping)


def test_float_to_go_string():
    assert [m.float_to_go_string(x) for x in (1, 0.1, 1e-05, 1234567.0, float("inf"), 2400)] == [
        "1.0",
        "0.1",
        "1e-05",
        "1.234567e+06",
        "+Inf",
        "2400.0",
    ]


def test_bucket_boundaries_are_0_5_9s():
    assert m.TTFT_BUCKETS[-1] == 400 and len(m.TTFT_BUCKETS) == 18
    assert m.E2E_BUCKETS[-4:] == [600, 1200, 1800, 2400] and len(m.E2E_BUCKETS) == 22
    assert m.ITL_BUCKETS[0] == 0.002 and m.ITL_BUCKETS[-1] == 8.0 and len(m.ITL_BUCKETS) == 23
    assert m.QUEUE_TIME_BUCKETS[0] == 0.0 and m.QUEUE_TIME_BUCKETS[-1] == 3000
    with pytest.raises(ValueError, match="Buckets not in sorted order"):
        m.check_buckets([1.0, 0.5])
    assert m.generate_buckets(["tse", "1000", "2", "8"], []) == [984, 992, 996, 998, 1000, 1002, 1004, 1008, 1016]


def test_name_filter_and_gzip():
    sm = golden_state()
    body, headers = sm.render(None, "gzip, deflate", "name[]=sglang:num_running_reqs&name[]=sglang:num_requests_total")
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    samples = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert [s.split("{")[0] for s in samples] == ["sglang:num_running_reqs", "sglang:num_requests_total"]


# ---------------------------------------------------------------- a running simulator
def sample(text: str, name: str, labels: str | None = None) -> float | None:
    for line in text.splitlines():
        mm = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        if mm and mm.group(1) == name and (labels is None or mm.group(2) == labels):
            return float(mm.group(3))
    return None


def test_metrics_move_with_traffic_at_0_5_9s_pace(make_sim):
    s = make_sim(
        ["--enable-metrics", "--served-model-name", "glm-5", "--decode-log-interval", "5"],
        env={"SGLANG_SIM_TOKENS_PER_S": "100", "SGLANG_SIM_IDLE_METRICS_INTERVAL": "1"},
    ).wait_ready()
    t0 = s.get("/metrics").text
    assert sample(t0, "sglang:num_requests_total", 'model_name="glm-5"') == 1.0  # the warm-up request
    assert sample(t0, "sglang:http_requests_total", 'endpoint="/generate",method="POST"') == 1.0
    done = threading.Event()

    def slow():
        s.post("/generate", {"text": "long", "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}})
        done.set()

    threading.Thread(target=slow).start()
    time.sleep(0.8)  # about 80 of 120 tokens
    busy = s.get("/metrics").text
    assert sample(busy, "sglang:num_running_reqs", SCHED_LABELS) == 1.0
    assert sample(busy, "sglang:gen_throughput", SCHED_LABELS) > 50
    assert sample(busy, "sglang:http_requests_active", 'endpoint="/generate",method="POST"') == 1.0
    # non-streamed: the tokenizer hears of it at 50 tokens (TTFT), 100 (inter-token) and at the end
    assert sample(busy, "sglang:time_to_first_token_seconds_count", 'model_name="glm-5"') == 2.0
    assert done.wait(10)
    after = s.get("/metrics").text
    assert sample(after, "sglang:num_requests_total", 'model_name="glm-5"') == 2.0
    gen = 'model_name="glm-5"'
    assert (
        sample(after, "sglang:generation_tokens_total", gen) - sample(t0, "sglang:generation_tokens_total", gen) == 120
    )
    assert sample(after, "sglang:inter_token_latency_seconds_count", 'model_name="glm-5"') == 70.0
    assert sample(after, "sglang:e2e_request_latency_seconds_count", 'model_name="glm-5"') == 2.0
    graph = SCHED_LABELS.replace(",model_name", ',mode="decode_cuda_graph",model_name')
    assert sample(after, "sglang:cuda_graph_passes_total", graph) >= 80  # one per decode step
    # gauges keep their last logged value until the idle check (30 s in 0.5.9, 1 s here)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        idle = s.get("/metrics").text
        if sample(idle, "sglang:num_running_reqs", SCHED_LABELS) == 0.0:
            break
        time.sleep(0.2)
    assert sample(idle, "sglang:num_running_reqs", SCHED_LABELS) == 0.0
    assert sample(idle, "sglang:gen_throughput", SCHED_LABELS) == 0.0


def test_streamed_requests_observe_every_token_and_prefix_cache_hits(make_sim):
    # no decode log (which sets cache_hit_rate 0) in between: --decode-log-interval 1000
    s = make_sim(["--enable-metrics", "--served-model-name", "glm-5", "--decode-log-interval", "1000"]).wait_ready()
    body = {"messages": [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "hi"}]}
    r1 = s.post("/v1/chat/completions", {**body, "max_tokens": 30, "stream": True})
    assert r1.status == 200
    t = s.get("/metrics").text
    assert sample(t, "sglang:inter_token_latency_seconds_count", 'model_name="glm-5"') == 29.0
    r2 = s.post("/generate", {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 4}})
    assert r2.json()["meta_info"]["cached_tokens"] == 5  # the warm-up prompt, all but its last token
    t = s.get("/metrics").text
    assert sample(t, "sglang:cached_tokens_total", 'cache_source="total",model_name="glm-5"') == 5.0
    assert sample(t, "sglang:cache_hit_rate", SCHED_LABELS) == pytest.approx(5 / 6)
    cache = SCHED_LABELS.replace(",model_name", ',mode="prefill_cache",model_name')
    assert sample(t, "sglang:realtime_tokens_total", cache) == 5.0


def test_http_counters_abort_and_not_found(make_sim):
    s = make_sim(["--enable-metrics", "--api-key", "k3y"], env={"SGLANG_SIM_TOKENS_PER_S": "50"}).wait_ready()
    assert s.get("/v1/models").status == 401  # refused by the API-key middleware: never counted
    assert s.get("/nope", headers={"Authorization": "Bearer k3y"}).status == 404  # counted under its raw path
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request(
        "POST",
        "/generate",
        body=b'{"text": "x", "stream": true, "sampling_params": {"max_new_tokens": 400, "ignore_eos": true}}',
        headers={"Authorization": "Bearer k3y", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    resp.read(200)
    conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream: abort_request
    resp.close()
    conn.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        t = s.get("/metrics").text
        if sample(t, "sglang:num_aborted_requests_total", f'model_name="{s.model_path}"'):
            break
        time.sleep(0.1)
    assert sample(t, "sglang:num_aborted_requests_total", f'model_name="{s.model_path}"') == 1.0
    assert sample(t, "sglang:http_responses_total", 'endpoint="/nope",method="GET",status_code="404"') == 1.0
    assert sample(t, "sglang:http_requests_total", 'endpoint="/v1/models",method="GET"') is None
    assert sample(t, "sglang:http_responses_total", 'endpoint="/generate",method="POST",status_code="200"') == 2.0


def test_prometheus_gets_openmetrics_and_every_path_under_metrics(make_sim):
    s = make_sim(["--enable-metrics", "--extra-metric-labels", '{"fleet": "lab"}']).wait_ready()
    r = s.get("/metrics/", headers={"Accept": PROMETHEUS_2_42_ACCEPT, "Accept-Encoding": "gzip"})
    assert r.status == 200 and r.headers["content-encoding"] == "gzip"
    text = gzip.decompress(r.body).decode()
    assert text.endswith("# EOF\n") and "sglang-sim" not in text
    assert f'sglang_num_running_reqs{{engine_type="unified",fleet="lab",model_name="{s.model_path}"' in text
    assert f'sglang_prompt_tokens_total{{fleet="lab",model_name="{s.model_path}"}}' in text
    assert s.request("POST", "/metrics", body={}).status == 200  # a Mount: any method


def test_every_scheduler_logs_with_the_flag_and_pp_ranks_each_log(make_sim):
    s = make_sim(
        ["--enable-metrics", "--tp", "2", "--pp-size", "2", "--enable-metrics-for-all-schedulers"], n_gpus=4
    ).wait_ready()
    t = s.get("/metrics").text
    ranks = sorted(
        re.search(r'pp_rank="(\d)",tp_rank="(\d)"', ln).groups()
        for ln in t.splitlines()
        if ln.startswith("sglang:num_running_reqs{")
    )
    assert ranks == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]


def test_a_stuck_scheduler_takes_no_request_in_and_its_gauges_freeze(make_sim, tmp_path):
    """hang-after-ready while a request runs: the running one gets no more tokens, and the requests after it never
    reach the scheduler (0.5.9's event_loop_normal reads new requests only between steps): no queue, no prefill, the
    gauges keep what the last decode log set, no counter moves."""
    f = tmp_path / "runtime-faults"
    s = make_sim(
        ["--enable-metrics", "--served-model-name", "glm-5", "--decode-log-interval", "5"],
        env={"SGLANG_SIM_FAULT_FILE": str(f), "SGLANG_SIM_IDLE_METRICS_INTERVAL": "1"},
    ).wait_ready()
    long = {"text": "long", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}

    def run_long() -> None:
        with contextlib.suppress(OSError):  # the server's end at the test's end
            s.post("/generate", long, timeout=60)

    threading.Thread(target=run_long, daemon=True).start()
    deadline = time.monotonic() + 10
    while sample(s.get("/metrics").text, "sglang:num_running_reqs", SCHED_LABELS) != 1.0:
        assert time.monotonic() < deadline, "the long request's decode log never came"
        time.sleep(0.1)
    f.write_text("hang-after-ready")

    def ask() -> None:
        with contextlib.suppress(OSError):  # the server's end at the test's end
            s.post("/generate", {"text": "hi"}, timeout=60)

    threading.Thread(target=ask, daemon=True).start()  # the hang starts with the next request
    time.sleep(0.5)
    frozen = s.get("/metrics").text
    for _ in range(2):
        threading.Thread(target=ask, daemon=True).start()
    time.sleep(2)  # two idle-check intervals: an idle scheduler would have logged 0 running by now
    after = s.get("/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens"):
        assert sample(after, name, SCHED_LABELS) == sample(frozen, name, SCHED_LABELS), name
    assert sample(after, "sglang:num_running_reqs", SCHED_LABELS) == 1.0
    assert sample(after, "sglang:num_queue_reqs", SCHED_LABELS) == 0.0
    for name in ("sglang:generation_tokens_total", "sglang:inter_token_latency_seconds_count"):
        assert sample(after, name, 'model_name="glm-5"') == sample(frozen, name, 'model_name="glm-5"'), name
    assert sample(after, "sglang:http_requests_active", 'endpoint="/generate",method="POST"') == 4.0


def test_slow_step_at_runtime_lengthens_every_step(make_sim, tmp_path):
    """slow-step=SECONDS: the prefill and each decode step take SECONDS longer (a GPU held at low clocks): time to
    first token and inter-token latency as the histograms see them; an emptied file makes the next request fast."""
    f = tmp_path / "runtime-faults"
    s = make_sim(["--enable-metrics", "--served-model-name", "glm-5"], env={"SGLANG_SIM_FAULT_FILE": str(f)})
    s.wait_ready()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    f.write_text("slow-step=0.5")
    t0 = time.monotonic()
    assert s.post("/v1/chat/completions", body).status == 200
    assert time.monotonic() - t0 >= 1.5  # three steps
    slow = s.get("/metrics").text
    itl = 'le="0.4",model_name="glm-5"'
    assert sample(slow, "sglang:time_to_first_token_seconds_bucket", 'le="0.4",model_name="glm-5"') == 1.0  # warm-up
    assert sample(slow, "sglang:time_to_first_token_seconds_count", 'model_name="glm-5"') == 2.0
    assert sample(slow, "sglang:inter_token_latency_seconds_bucket", itl) == 0.0
    assert sample(slow, "sglang:inter_token_latency_seconds_count", 'model_name="glm-5"') == 2.0
    assert "slow-step=0.5" in s.log()
    f.write_text("")
    t0 = time.monotonic()
    assert s.post("/v1/chat/completions", body).status == 200
    assert time.monotonic() - t0 < 1.0
    fast = s.get("/metrics").text
    assert sample(fast, "sglang:inter_token_latency_seconds_bucket", itl) == 2.0
