"""The server arguments as sglang 0.5.9 resolves them (``ServerArgs.__post_init__``) and ``/server_info``.

Line numbers are those of sglang 0.5.9's ``python/sglang/srt/server_args.py`` (the README's "Server info" section
lists them). The simulator resolves the values a deploy policy reads; every other field is reported as parsed.

* ``_handle_missing_default_values`` (846): tokenizer_path, served_model_name, device "cuda", random_seed,
  mm_process_config, mamba_scheduler_strategy, speculative_draft_model_quantization.
* ``_handle_gpu_memory_settings`` (911), from ``gpu_mem`` = the smallest ``memory.total`` (MiB) nvidia-smi lists
  (``utils/common.py:1724 get_nvgpu_memory_capacity``): chunked_prefill_size, cuda_graph_max_bs, cuda_graph_bs
  (``_generate_cuda_graph_batch_sizes``, 1079), piecewise_cuda_graph_max_tokens/tokens, mem_fraction_static.
* ``_handle_model_specific_adjustments`` (1182), DeepSeek sparse attention (NSA/DSA) models only
  (``configs/model_config.py:54 is_deepseek_nsa``: architectures[0] in the DSA list and ``index_topk`` set):
  attention_backend "nsa", page_size 64, ``_set_default_nsa_kv_cache_dtype`` (1129: ``auto`` -> ``fp8_e4m3`` on
  compute capability major >= 10, else ``bfloat16``), ``_set_default_nsa_backends`` (1154).
* ``_handle_sampling_backend`` (1766), ``_handle_attention_backend_compatibility`` (1772: the default backend
  and its page-size rules), ``_handle_page_size`` (2055), ``_handle_grammar_backend`` (2063).

The compute capability is the one of CUDA device 0 (``torch.cuda.get_device_capability()`` in the main process):
the simulated nvidia-smi profile's first GPU. The model is read from ``<model-path>/config.json`` (hf_config.py).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from . import EMULATED_SGLANG_VERSION, engines, gpus, hf_config

FIELDS_DATA = engines.fields_data(EMULATED_SGLANG_VERSION)  # the emulated version's /server_info fields

# configs/model_config.py:54 is_deepseek_nsa
DSA_ARCHS = (
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
)
# server_args.py:1197 (the DeepSeek branch of _handle_model_specific_adjustments)
DEEPSEEK_BRANCH_ARCHS = (
    "DeepseekV3ForCausalLM",
    "KimiK25ForConditionalGeneration",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
)
# configs/model_config.py:418-433: AttentionArch.MLA
MLA_ARCHS = (
    "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "DotsVLMForCausalLM",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "MistralLarge3ForCausalLMEagle",
    "KimiK25ForConditionalGeneration",
)
# ServerArgs.from_cli_args (server_args.py:5069): argparse dest -> dataclass field
RENAMED = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "attention_context_parallel_size": "attn_cp_size",
    "moe_data_parallel_size": "moe_dp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
}


class ResolveError(Exception):
    """An assertion/ValueError of ServerArgs.__post_init__ (the start fails with a traceback, exit 1)."""

    def __init__(self, exc_line: str, line: int):
        super().__init__(exc_line)
        self.exc_line = exc_line
        self.line = line


@dataclass
class ModelConfig:
    path: str | None = None  # the config.json read, None when there is none
    data: dict = field(default_factory=dict)

    @property
    def architectures(self) -> list[str]:
        archs = self.data.get("architectures")
        return [str(a) for a in archs] if isinstance(archs, list) else []

    @property
    def arch(self) -> str | None:
        return self.architectures[0] if self.architectures else None

    @property
    def is_deepseek_nsa(self) -> bool:
        return self.arch in DSA_ARCHS and self.data.get("index_topk") is not None

    @property
    def is_mla(self) -> bool:
        return any(a in MLA_ARCHS for a in self.architectures)

    @property
    def model_type(self) -> str | None:
        mt = self.data.get("model_type")
        return str(mt) if mt is not None else None


def load_model_config(args: argparse.Namespace) -> ModelConfig:
    """The model's config as sglang reads it (hf_config.py: ``<model-path>/config.json``, or a hub repository's from
    the hub cache); raises hf_config.ModelConfigError where the real start fails."""
    loaded = hf_config.load(args)
    return ModelConfig(loaded.path, loaded.data)


def compute_capability(profile: gpus.Profile) -> tuple[int, int]:
    """``torch.cuda.get_device_capability()`` of device 0: the profile's first GPU (e.g. "12.0" -> (12, 0))."""
    first = min(profile.gpus, key=lambda g: g.index)
    major, _, minor = first.compute_cap.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return 0, 0


def gpu_memory_capacity(profile: gpus.Profile) -> float | None:
    """``get_nvgpu_memory_capacity``: min of ``nvidia-smi --query-gpu=memory.total`` (MiB) over the GPUs."""
    values = [float(g.memory_total_mib) for g in profile.gpus if g.memory_total_mib > 0]
    return min(values) if values else None


def _generate_cuda_graph_batch_sizes(a: argparse.Namespace) -> list[int]:
    """server_args.py:1079."""
    max_bs = int(a.cuda_graph_max_bs)
    if a.disable_cuda_graph_padding:
        bs = list(range(1, max_bs + 1))
    elif a.speculative_algorithm is None:
        bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    else:
        bs = (
            list(range(1, 9, 1))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max_bs + 1, 16))
        )
    return [b for b in bs if b <= max_bs]


def _generate_piecewise_cuda_graph_tokens(max_tokens: int) -> list[int]:
    """server_args.py:1109."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1024 + 1, 64))
        + list(range(1280, 4096 + 1, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


def _gpu_memory_settings(a: argparse.Namespace, gpu_mem: float | None, model: ModelConfig) -> None:
    """server_args.py:911 _handle_gpu_memory_settings."""
    tp = int(a.tensor_parallel_size or 1)
    if gpu_mem is not None:
        if gpu_mem < 20 * 1024:
            chunk, graph = 2048, 8
        elif gpu_mem < 35 * 1024:
            chunk, graph = 2048, (24 if tp < 4 else 80)
        elif gpu_mem < 60 * 1024:
            chunk, graph = 4096, (32 if tp < 4 else 160)
        elif gpu_mem < 160 * 1024:  # H100/A100 (< 90 GB) and H20/H200 (< 160 GB) alike
            chunk, graph = 8192, (256 if tp < 4 else 512)
        else:
            chunk, graph = 16384, 512
    else:
        chunk, graph = 4096, 160
    if a.chunked_prefill_size is None:
        a.chunked_prefill_size = chunk
    if a.cuda_graph_max_bs is None:
        a.cuda_graph_max_bs = graph
    if a.cuda_graph_bs is None:
        a.cuda_graph_bs = _generate_cuda_graph_batch_sizes(a)
    else:
        a.cuda_graph_max_bs = max(a.cuda_graph_bs)
    if a.piecewise_cuda_graph_max_tokens is None:
        a.piecewise_cuda_graph_max_tokens = a.chunked_prefill_size if not model.is_mla else 2048
    if a.piecewise_cuda_graph_tokens is None:
        a.piecewise_cuda_graph_tokens = _generate_piecewise_cuda_graph_tokens(int(a.piecewise_cuda_graph_max_tokens))
    if a.mem_fraction_static is None:
        reserved = 512.0
        if a.chunked_prefill_size > 0:
            reserved += max(a.chunked_prefill_size, 2048) * 1.5
        else:
            reserved += max(int(a.max_prefill_tokens or 16384), 2048) * 1.5
        reserved += a.cuda_graph_max_bs * 2
        reserved += tp * int(a.pipeline_parallel_size or 1) / 8 * 1024
        dp = int(a.data_parallel_size or 1)
        if a.enable_dp_attention:
            reserved += a.cuda_graph_max_bs * dp * 3
            if a.cuda_graph_max_bs > 300:
                reserved += a.cuda_graph_max_bs * dp * 1.5
        if a.enable_piecewise_cuda_graph:
            reserved += len(a.piecewise_cuda_graph_tokens) * 8
        if gpu_mem is not None and gpu_mem > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        if a.speculative_algorithm is not None:
            reserved += (
                6 * 1024
                if a.speculative_algorithm == "STANDALONE"
                else (2 * 1024 if a.speculative_algorithm != "NGRAM" else 0)
            )
        a.mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3) if gpu_mem is not None else 0.88


def _attention_backend_not_set(a: argparse.Namespace) -> bool:
    """server_args.py:5114."""
    return a.attention_backend is None and a.prefill_attention_backend is None and a.decode_attention_backend is None


def _nsa(a: argparse.Namespace, model: ModelConfig, major: int, warn) -> None:
    """server_args.py:1205-1265 (CUDA GPU, no NSA context parallel)."""
    if model.arch == "GlmMoeDsaForCausalLM" and major in (10, 11, 12):  # is_blackwell_supported (CUDA 12.8 build)
        warn("Force NSA prefill to use MLA (i.e. disable MHA_ONE_SHOT) for GlmMoeDsaForCausalLM on Blackwell.")
    if _attention_backend_not_set(a):
        # 0.5.23 calls it "dsa" (arg_groups/model_overrides/deepseek_v2.py:103)
        a.attention_backend = engines.DSA_BACKEND.get(EMULATED_SGLANG_VERSION, "nsa")
        warn(f"Use {a.attention_backend} attention backend for DeepSeek with DSA.")
    tp, dp = int(a.tensor_parallel_size or 1), int(a.data_parallel_size or 1)
    if dp < tp:
        warn(
            f"DSA with TP mode is active, dp_size={dp}, tp_size={tp}, "
            f"attn_tp_size={tp}, attention weights will be sharded across {tp} ranks."
        )
    a.page_size = 64
    warn("Setting page size to 64 for DeepSeek DSA.")
    # _set_default_nsa_kv_cache_dtype (1129)
    user_prefill, user_decode = a.nsa_prefill_backend is not None, a.nsa_decode_backend is not None
    if (user_prefill or user_decode) and a.kv_cache_dtype == "auto":
        warn(
            "When specifying --nsa-prefill-backend or --nsa-decode-backend, "
            "you should also explicitly set --kv-cache-dtype (e.g., 'fp8_e4m3' or 'bfloat16'). "
            "DeepSeek V3.2 defaults to FP8 KV cache which may not be compatible with all backends."
        )
    if a.kv_cache_dtype == "auto":
        a.kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"
        warn(f"Setting KV cache dtype to {a.kv_cache_dtype} for DeepSeek DSA on SM{major} device.")
    if a.kv_cache_dtype == "bf16":
        a.kv_cache_dtype = "bfloat16"
    if a.kv_cache_dtype not in ("bfloat16", "fp8_e4m3"):
        raise ResolveError("AssertionError: DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype", 1149)
    # _set_default_nsa_backends (1154)
    if a.kv_cache_dtype == "fp8_e4m3":
        if not user_prefill:
            a.nsa_prefill_backend = "flashmla_auto"
        if not user_decode:
            a.nsa_decode_backend = "flashmla_kv"
    elif major >= 10:
        if not user_prefill:
            a.nsa_prefill_backend = "flashmla_sparse"
        if not user_decode:
            a.nsa_decode_backend = "trtllm"
    else:
        if not user_prefill:
            a.nsa_prefill_backend = "flashmla_sparse"
        if not user_decode:
            a.nsa_decode_backend = "fa3"
    warn(
        f"Set NSA backends for {a.kv_cache_dtype} KV Cache: prefill={a.nsa_prefill_backend}, "
        f"decode={a.nsa_decode_backend}."
    )


def _attention_backend_compatibility(a: argparse.Namespace, model: ModelConfig, major: int, warn) -> None:
    """server_args.py:1772 (the CUDA part)."""
    if a.prefill_attention_backend is not None and a.prefill_attention_backend == a.decode_attention_backend:
        a.attention_backend = a.prefill_attention_backend
    no_spec_or_topk_one = a.speculative_algorithm is None or a.speculative_eagle_topk in (None, 1)
    if a.attention_backend is None:
        if not model.is_mla:
            if major == 9 and no_spec_or_topk_one:  # is_hopper_with_cuda_12_3
                a.attention_backend = "fa3"
            elif (
                major == 10
                and no_spec_or_topk_one
                and (a.speculative_algorithm is None or a.speculative_eagle_topk is not None)
            ):
                a.attention_backend = "trtllm_mha"
            else:
                a.attention_backend = "flashinfer"  # is_flashinfer_available(): the CUDA build ships it
        else:
            a.attention_backend = "fa3" if major == 9 else "flashinfer" if major == 10 else "triton"
        warn(f"Attention backend not specified. Use {a.attention_backend} backend by default.", info=True)
    if a.attention_backend == "torch_native":
        warn("Cuda graph is disabled because of using torch native attention backend")
        a.disable_cuda_graph = True
    if a.attention_backend == "flex_attention":
        warn("Cuda graph is disabled because of using torch Flex Attention backend")
        a.disable_cuda_graph = True
    if "flashmla" in (a.attention_backend, a.decode_attention_backend):
        warn("FlashMLA only supports a page_size of 64, change page_size to 64.")
        a.page_size = 64
    if "cutlass_mla" in (a.attention_backend, a.decode_attention_backend):
        warn("Cutlass MLA only supports a page_size of 128, change page_size to 128.")
        a.page_size = 128
    if "trtllm_mla" in (a.attention_backend, a.decode_attention_backend):
        if major not in (10, 11, 12):
            raise ResolveError(
                "ValueError: TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). "
                "Please use a different backend.",
                1879,
            )
        if a.page_size not in (32, 64):
            warn(f"TensorRT-LLM MLA only supports page_size of 32 or 64, changing page_size from {a.page_size} to 64.")
            a.page_size = 64
        if a.kv_cache_dtype not in ("fp8_e4m3", "fp4_e2m1", "bf16", "auto"):
            raise ResolveError(
                "ValueError: TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, fp4_e2m1, bf16, "
                "or auto.",
                1890,
            )
    if "trtllm_mha" in (a.attention_backend, a.decode_attention_backend, a.prefill_attention_backend):
        if major != 10:
            raise ResolveError(
                "ValueError: TRTLLM MHA backend is only supported on Blackwell GPUs (SM100). "
                "Please use a different backend.",
                1900,
            )
        if a.page_size not in (16, 32, 64):
            warn(
                "TensorRT-LLM MHA only supports page_size of 16, 32 or 64, changing page_size from "
                f"{a.page_size} to 64."
            )
            a.page_size = 64
    if a.attention_backend == "fa3" and a.kv_cache_dtype == "fp8_e5m2":
        warn("FlashAttention3 only supports fp8_e4m3 if using FP8; Setting attention backend to triton.")
        a.attention_backend = "triton"


@dataclass
class Resolved:
    model: ModelConfig
    compute_capability: tuple[int, int]
    gpu_mem: float | None
    logs: list[str] = field(default_factory=list)


def resolve(args: argparse.Namespace, profile: gpus.Profile, model: ModelConfig | None = None) -> Resolved:
    """Resolve ``args`` in place like 0.5.9's ``ServerArgs.__post_init__`` (the modelled steps, in order), for
    ``model`` (else the model ``--model-path`` names: ``load_model_config``, which may raise ModelConfigError)."""
    if model is None:
        model = load_model_config(args)
    cc = compute_capability(profile)
    gpu_mem = gpu_memory_capacity(profile)
    out = Resolved(model, cc, gpu_mem)

    def warn(msg: str, info: bool = False) -> None:
        out.logs.append(msg)

    a = args
    # _handle_missing_default_values (846)
    if a.tokenizer_path is None:
        a.tokenizer_path = a.model_path
    if a.served_model_name is None:
        a.served_model_name = a.model_path
    if a.device is None:
        a.device = "cuda"
    if a.random_seed is None:
        a.random_seed = random.randint(0, 1 << 30)
    if a.mm_process_config is None:
        a.mm_process_config = {}
    if a.mamba_scheduler_strategy == "auto":
        a.mamba_scheduler_strategy = "no_buffer"
    if a.speculative_draft_model_quantization is None:
        a.speculative_draft_model_quantization = a.quantization
    elif a.speculative_draft_model_quantization == "unquant":
        a.speculative_draft_model_quantization = None
    # _handle_gpu_memory_settings (911)
    _gpu_memory_settings(a, gpu_mem, model)
    # _handle_model_specific_adjustments (1182)
    if model.arch in DEEPSEEK_BRANCH_ARCHS and model.is_deepseek_nsa:
        _nsa(a, model, cc[0], warn)
    # _handle_sampling_backend (1766): is_flashinfer_available() on a CUDA build
    if a.sampling_backend is None:
        a.sampling_backend = "flashinfer"
    _attention_backend_compatibility(a, model, cc[0], warn)
    # _handle_page_size (2055), _handle_grammar_backend (2063)
    if a.page_size is None:
        a.page_size = 1
    if a.grammar_backend is None:
        a.grammar_backend = "xgrammar"
    return out


def server_args_fields() -> list[str]:
    text = resources.files("sglang_sim").joinpath(FIELDS_DATA).read_text(encoding="utf-8")
    return list(json.loads(text)["fields"])


def server_args_dict(args: argparse.Namespace) -> dict[str, Any]:
    """``dataclasses.asdict(server_args)``: the 0.5.9 dataclass fields, in order (``tp_size`` for
    ``--tensor-parallel-size``, and so on: ``ServerArgs.from_cli_args``)."""
    values = engines.from_sim(dict(vars(args)), EMULATED_SGLANG_VERSION)
    for dest, name in RENAMED.items():
        if dest in values:
            values[name] = values[dest]
    return {name: values.get(name) for name in server_args_fields()}
