"""The seed's GLM-5 launch as gpufleet renders it: exact flag names (the seed's --tp written as --tp-size), the comm
flags included. Checked against the real 0.5.9 help (tests/unit/sglang_server/test_real_help.py) and carried from
lane to lane by the migration table (tests/unit/sglang_server/test_flag_migration.py)."""

from __future__ import annotations

SEED_GLM5_FLAGS = {
    "host": "0.0.0.0", "port": 8000, "tp-size": 8, "mem-fraction-static": 0.92, "attention-backend": "flashinfer",
    "fp8-gemm-backend": "cutlass", "nsa-decode-backend": "trtllm", "nsa-prefill-backend": "trtllm",
    "moe-runner-backend": "flashinfer_cutlass", "enable-flashinfer-allreduce-fusion": True,
    "model": "lukealonso/GLM-5-NVFP4", "served-model-name": "glm-5", "reasoning-parser": "glm45",
    "tool-call-parser": "glm47", "trust-remote-code": True, "max-running-requests": 64, "kv-cache-dtype": "auto",
    "quantization": "modelopt_fp4", "disable-custom-all-reduce": True,
}  # fmt: skip
