"""sglang-sim /server_info and the server arguments as sglang 0.5.9's ServerArgs.__post_init__ resolves them.

Line numbers: sglang 0.5.9 python/sglang/srt/server_args.py (see lab/sglang-sim/README.md, "Server info").
"""

from __future__ import annotations

import json

import pytest
from sglang_sim import cli, gpus, resolve
from sglang_sim_helpers import tiny_model

# the lab's GLM-5 (GlmMoeDsaForCausalLM with DeepSeek sparse attention: index_topk set)
GLM5_CONFIG = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "index_topk": 2048}


def tiny_config() -> dict:
    """The lab test hub's tiny model's config (LlamaForCausalLM: an MHA model, no model-specific step)."""
    return json.loads((tiny_model() / "config.json").read_text())


def profile(cc: str = "12.0", mib: int = 97887, n: int = 8) -> gpus.Profile:
    return gpus.Profile(
        "test",
        "580.95.05",
        tuple(gpus.Gpu(i, "GPU", f"GPU-{i}", f"0000:{i:02x}:00.0", mib, 0, cc) for i in range(n)),
    )


def resolved(tmp_path, argv: list[str], config: dict | None = GLM5_CONFIG, **prof):
    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(tiny_config() if config is None else config))
    args = cli.finalize(cli.parse(["--model-path", str(model), *argv]))
    out = resolve.resolve(args, profile(**prof))
    return args, out


def test_kv_cache_dtype_auto_is_fp8_e4m3_for_glm5_on_cc_12(tmp_path):
    args, out = resolved(tmp_path, ["--tp", "8", "--kv-cache-dtype", "auto"])
    assert args.kv_cache_dtype == "fp8_e4m3"  # server_args.py:1142-1143, major >= 10
    assert (args.nsa_prefill_backend, args.nsa_decode_backend) == ("flashmla_auto", "flashmla_kv")  # 1158-1163
    assert args.attention_backend == "nsa" and args.page_size == 64  # 1211-1212, 1258
    assert "Setting KV cache dtype to fp8_e4m3 for DeepSeek DSA on SM12 device." in out.logs
    assert "Force NSA prefill to use MLA (i.e. disable MHA_ONE_SHOT) for GlmMoeDsaForCausalLM on Blackwell." in out.logs


def test_explicit_kv_cache_dtype_stays_and_picks_the_bf16_backends(tmp_path):
    args, _ = resolved(tmp_path, ["--kv-cache-dtype", "bfloat16"])
    assert args.kv_cache_dtype == "bfloat16"
    assert (args.nsa_prefill_backend, args.nsa_decode_backend) == ("flashmla_sparse", "trtllm")  # 1166-1170
    args, _ = resolved(tmp_path, ["--kv-cache-dtype", "fp8_e4m3"])
    assert args.kv_cache_dtype == "fp8_e4m3"
    args, _ = resolved(tmp_path, ["--kv-cache-dtype", "bf16"])
    assert args.kv_cache_dtype == "bfloat16"  # 1147-1148


def test_hopper_resolves_auto_to_bfloat16(tmp_path):
    args, _ = resolved(tmp_path, [], cc="9.0", mib=143771)
    assert args.kv_cache_dtype == "bfloat16"
    assert (args.nsa_prefill_backend, args.nsa_decode_backend) == ("flashmla_sparse", "fa3")  # 1171-1176


def test_the_seed_launch_keeps_its_backends_and_warns(tmp_path):
    argv = [
        "--tp", "8", "--kv-cache-dtype", "auto", "--attention-backend", "flashinfer",
        "--nsa-decode-backend", "trtllm", "--nsa-prefill-backend", "trtllm",
    ]  # fmt: skip
    args, out = resolved(tmp_path, argv)
    assert args.kv_cache_dtype == "fp8_e4m3"
    assert (args.nsa_prefill_backend, args.nsa_decode_backend, args.attention_backend) == (
        "trtllm",
        "trtllm",
        "flashinfer",
    )
    assert any(line.startswith("When specifying --nsa-prefill-backend or --nsa-decode-backend") for line in out.logs)
    assert "Set NSA backends for fp8_e4m3 KV Cache: prefill=trtllm, decode=trtllm." in out.logs


def test_dsa_refuses_other_kv_dtypes(tmp_path):
    with pytest.raises(resolve.ResolveError, match="DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3"):
        resolved(tmp_path, ["--kv-cache-dtype", "fp8_e5m2"])


def test_not_dsa_without_index_topk_or_for_an_mha_model(tmp_path):
    # configs/model_config.py:54 is_deepseek_nsa needs index_topk: without it kv_cache_dtype stays "auto"
    args, _ = resolved(tmp_path, [], config={"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"})
    assert args.kv_cache_dtype == "auto" and args.nsa_prefill_backend is None and args.page_size == 1
    assert args.attention_backend == "triton"  # an MLA model neither on SM90 nor SM100 (1820-1833)
    args, _ = resolved(tmp_path / "llama", [], config=None)
    assert args.kv_cache_dtype == "auto" and args.attention_backend == "flashinfer"  # MHA on SM12 (1815-1818)


@pytest.mark.parametrize(
    ("mib", "tp", "max_bs", "chunk", "frac"),
    [
        (16384, 2, 8, 2048, 0.765),  # < 20 GB
        (97887, 8, 512, 8192, 0.848),  # RTX PRO 6000 (96 GB) tp 8
        (143771, 2, 256, 8192, 0.906),  # H200 tp 2
        (143771, 8, 512, 8192, 0.897),  # H200 tp 8
        (183359, 8, 512, 16384, 0.852),  # B200
    ],
)
def test_gpu_memory_settings(tmp_path, mib, tp, max_bs, chunk, frac):
    """server_args.py:911-1063 from nvidia-smi's smallest memory.total."""
    args, _ = resolved(tmp_path, ["--tp", str(tp)], config=None, mib=mib, cc="9.0")
    assert (args.cuda_graph_max_bs, args.chunked_prefill_size) == (max_bs, chunk)
    assert args.mem_fraction_static == pytest.approx(frac)
    assert (
        args.cuda_graph_bs[-1] == max_bs and args.cuda_graph_bs[:6] == [1, 2, 4, 8, 12, 16][: len(args.cuda_graph_bs)]
    )


def test_explicit_values_stay(tmp_path):
    args, _ = resolved(
        tmp_path, ["--mem-fraction-static", "0.92", "--cuda-graph-bs", "1", "2", "48", "--page-size", "16"], config=None
    )
    assert args.mem_fraction_static == 0.92 and args.cuda_graph_max_bs == 48 and args.page_size == 16


def test_server_args_dict_has_the_dataclass_fields():
    args = cli.finalize(cli.parse(["--model-path", "/m", "--tp", "4", "--dp-size", "2"]))
    d = resolve.server_args_dict(args)
    assert len(d) == 328 and list(d)[:3] == ["model_path", "tokenizer_path", "tokenizer_mode"]
    assert d["tp_size"] == 4 and d["dp_size"] == 2 and d["pp_size"] == 1 and d["ep_size"] == 1
    assert "tensor_parallel_size" not in d and "config" not in d and "version" not in d


# ---------------------------------------------------------------- a running simulator
def test_server_info_of_a_running_glm5(make_sim, tmp_path):
    model = tmp_path / "glm-5"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GLM5_CONFIG))
    s = make_sim(["--model-path", str(model), "--tp", "2", "--served-model-name", "glm-5"]).wait_ready()
    info = s.get("/server_info").json()
    assert info["kv_cache_dtype"] == "fp8_e4m3" and info["page_size"] == 64 and info["attention_backend"] == "nsa"
    assert info["tp_size"] == 2 and info["cuda_graph_max_bs"] == 8 and info["mem_fraction_static"] == 0.765
    assert info["status"] == "ready" and info["max_total_num_tokens"] > 0
    assert info["max_req_input_len"] == min(131072, info["max_total_num_tokens"]) - 1 - 5
    state = info["internal_states"][0]
    assert state["kv_cache_dtype"] == "fp8_e4m3" and set(state["memory_usage"]) == {
        "weight",
        "kvcache",
        "token_capacity",
        "graph",
    }
    assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert "effective_max_running_requests_per_dp" in state and "last_gen_throughput" in state
    assert info["version"] == "0.5.9-sim" and info["simulator"] is True
    assert s.get("/get_server_info").json()["kv_cache_dtype"] == "fp8_e4m3"
    log = s.log()
    assert "Endpoint '/get_server_info' is deprecated and will be removed in a future version." in log
    assert "Setting KV cache dtype to fp8_e4m3 for DeepSeek DSA on SM12 device." in log
    assert "kv_cache_dtype='fp8_e4m3'" in log  # the server_args= line shows the resolved value
    mi = s.get("/model_info").json()
    assert mi["architectures"] == ["GlmMoeDsaForCausalLM"] and mi["model_type"] == "glm_moe_dsa"
    assert "Load weight end. type=GlmMoeDsaForCausalLM" in log


def test_a_dsa_model_with_an_unsupported_kv_dtype_fails_to_start(make_sim, tmp_path):
    model = tmp_path / "glm-5"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GLM5_CONFIG))
    s = make_sim(["--model-path", str(model), "--kv-cache-dtype", "fp8_e5m2"])
    assert s.wait_exit() == 1
    assert "AssertionError: DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype" in s.log()
