"""The simulator emulates the engine version SGLANG_SIM_ENGINE_VERSION names (default 0.5.9; engines.py): its parser
(options, defaults), /get_server_info's shape, /metrics' names and the version it reports. Each version runs as its
own process (the version is chosen at start, as a lab host's unit environment sets it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sglang_sim_helpers import SIM_SRC, Sim

DATA = SIM_SRC / "sglang_sim" / "data"
GLM5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "index_topk": 2048}


def sim(tmp_path, version: str | None, *args: str) -> Sim:
    model = tmp_path / "glm5"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(GLM5))
    env = {"SGLANG_SIM_ENGINE_VERSION": version} if version else {}
    s = Sim(tmp_path, ["--enable-metrics", "--tp-size", "2", *args], env=env)
    s.args[1] = str(model)
    return s


def metric_names(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def run_cli(version: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(SIM_SRC), "SGLANG_SIM_ENGINE_VERSION": version, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "sglang_sim.launch_server", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("version", "backend", "gone", "new"),
    [(None, "nsa", set(), set()), ("0.5.10.post1", "nsa", set(), set()),
     ("0.5.23", "dsa", {"sglang:num_retractions", "sglang:cache_config_info", "sglang:engine_startup_time"},
      {"sglang:page_size", "sglang:num_pages"})],
)  # fmt: skip
def test_each_version_reports_itself_its_fields_and_its_metrics(tmp_path, version, backend, gone, new):
    shown = version or "0.5.9"
    s = sim(tmp_path, version).start()
    try:
        s.wait_ready(timeout=30)
        info = s.get("/get_server_info").json()
        assert info["version"] == f"{shown}-sim"
        assert f"emulating `python -m sglang.launch_server` of sglang {shown}" in s.log()
        assert info["attention_backend"] == backend  # the DSA model's default backend of that version
        fields = json.loads((DATA / f"server-args-fields-{shown}.json").read_text())["fields"]
        assert list(info)[: len(fields)] == fields
        assert info["tp_size"] == 2
        if shown == "0.5.23":
            assert info["frontend"] == "python"
            assert info["launch_command"].startswith("python -m sglang.launch_server --model-path ")
            assert "dsa_decode_backend" in info and "nsa_decode_backend" not in info
            assert info["cuda_graph_max_bs_decode"] == info["internal_states"][0]["cuda_graph_max_bs_decode"]
            assert "mamba_radix_cache_strategy" in info and "mamba_scheduler_strategy" not in info
        else:
            assert "frontend" not in info and "nsa_decode_backend" in info
        s.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
        names = metric_names(s.get("/metrics").text)
        assert "sglang:num_running_reqs" in names and "sglang:time_to_first_token_seconds" in names
        assert not names & gone, names & gone
        assert new <= names
        if shown != "0.5.23":
            assert "sglang:num_retractions" in names and "sglang:cache_config_info" in names
            assert not names & {"sglang:page_size", "sglang:num_pages"}
    finally:
        s.stop()


def test_the_parser_is_the_versions_own(tmp_path):
    """0.5.23 takes --dsa-decode-backend and --attention-backend dsa, which 0.5.9 refuses as argparse does."""
    for version in ("0.5.9", "0.5.23"):
        proc = run_cli(version, "--help")
        assert proc.returncode == 0
        assert ("--dsa-decode-backend" in proc.stdout) == (version == "0.5.23")
        assert f"of sglang {version}" in proc.stdout
    proc = run_cli("0.5.9", "--model-path", "/m", "--attention-backend", "dsa")
    assert proc.returncode == 2
    assert "argument --attention-backend: invalid choice: 'dsa'" in proc.stderr
    proc = run_cli("0.5.23", "--model-path", "/m", "--nsa-decode-backend", "trtllm")
    assert proc.returncode == 2 and "unrecognized arguments: --nsa-decode-backend" in proc.stderr


def test_an_unknown_version_is_refused_naming_the_variable_and_the_versions():
    proc = run_cli("0.6.0", "--model-path", "/m")
    assert proc.returncode == 2
    assert (
        "SGLANG_SIM_ENGINE_VERSION='0.6.0' is not an engine version sglang-sim emulates: set SGLANG_SIM_ENGINE_VERSION "
        "to one of 0.5.9, 0.5.10.post1, 0.5.23" in proc.stderr
    )


def test_a_deprecated_flag_only_warns_as_in_sglang(tmp_path):
    """0.5.9 server_args.py:5729-5738: DeprecatedAction logs a warning; the server starts."""
    s = Sim(tmp_path, ["--hybrid-kvcache-ratio"]).start()
    try:
        s.wait_ready(timeout=30)
        assert "The command line argument '--hybrid-kvcache-ratio' is deprecated" in s.log()
    finally:
        s.stop()


# NaN logits (fault nan-output) as each version treats them (engines.nan_mode): 0.5.23 has no --enable-nan-detection
# but two environment variables (environ.py:516, :1511; utils/async_probe.py)
@pytest.fixture
def nan_sim(tmp_path):
    started = []

    def start(env: dict) -> Sim:
        s = sim(tmp_path, "0.5.23")
        s.env.update({"SGLANG_SIM_FAULT": "nan-output", **env})
        started.append(s)
        return s.start()

    yield start
    for s in started:
        s.stop()


def generate(s: Sim) -> str:
    return s.post("/generate", {"text": "capital of France?", "sampling_params": {"max_new_tokens": 8}}).json()["text"]


def test_0_5_23_sanitizes_nan_logits_with_one_warning(nan_sim):
    s = nan_sim({"SGLANG_SANITIZE_NAN_LOGITS": "1"}).wait_ready()
    assert generate(s) == "!!!!!!!!" and generate(s) == "!!!!!!!!"  # serving goes on (sanitized to -1e30: token 0)
    assert s.log().count("NaN detected in sampler: next_token_logits; values were sanitized before sampling.") == 1
    assert "NaN in the logits" not in s.log()  # 0.5.9's line is not 0.5.23's


def test_0_5_23_nan_check_ends_the_server(nan_sim):
    """The device-side assert of the first NaN logits (here the start's own warm-up generation) ends the server."""
    s = nan_sim({"SGLANG_ENABLE_NAN_LOGITS_CHECK": "true"})
    assert s.wait_exit(30) != 0
    log = s.log()
    assert "Scheduler hit an exception" in log and "NaN detected! sampler: next_token_logits" in log


def test_0_5_23_without_either_variable_says_nothing_of_nan(nan_sim):
    s = nan_sim({}).wait_ready()
    assert generate(s) == "!!!!!!!!"
    assert "NaN" not in s.log()
