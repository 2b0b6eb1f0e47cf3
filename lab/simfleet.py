"""Lab equipment: the simulated engine installed as a host's "ml-env release", for tests and benchmarks of the
stages after ml_env (sglang_server, serving_bench) without the CUDA mirror, test hub and wheelhouse.

On a lab host: ``sglang_sim`` (lab/sglang-sim) and PyYAML, its dependency (the files of the PyYAML wheel pinned
in locks/update_locks.py: CPython 3.11, Debian 12's python3), in the system Python's dist-packages,
``/opt/ml-env/releases/sim`` whose ``bin/python`` is /usr/bin/python3 (``current`` points at it), and the test
hub model's tokenizer files in ``/srv/models/glm-5-sim`` (the model directory bench_serving's tokenizer comes
from). ``GROUP_VARS`` is an inventory for playbooks/deploy_server.yml that serves the seed's served name with it.
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = "/srv/models/glm-5-sim"

GROUP_VARS = {
    "sglang_server_module": "sglang_sim.launch_server",
    "sglang_server_ml_env_release": "/opt/ml-env/releases/sim",
    "sglang_server_args_common": {"host": "0.0.0.0", "port": 8000},
    "sglang_server_args_gpu_class": {"tp-size": 2, "mem-fraction-static": 0.88},
    "sglang_server_args_model": {"model-path": MODEL_DIR, "served-model-name": "glm-5", "max-running-requests": 64},
    "sglang_server_environment": {"SGLANG_SIM_LOAD_SECONDS": "0.5", "SGLANG_SIM_GRAPH_SECONDS": "0.5",
                                  "SGLANG_SIM_ACCESS_LOG": "0"},
    "sglang_server_timeout_start_s": 120,
    "sglang_server_timeout_stop_s": 20,
    "sglang_server_restart_sec": 5,
    "sglang_server_progress_interval_s": 5,
    "sglang_server_release_timeout_s": 10,
    "sglang_server_smoke_timeout_s": 30,
}  # fmt: skip


# The model's config.json: GLM-5's architecture with its sparse attention (index_topk), so the simulated engine
# resolves its `auto` settings as SGLang 0.5.9 does for GLM-5 (kv_cache_dtype auto -> fp8_e4m3 on compute capability
# >= 10; lab/sglang-sim README, "Server info").
MODEL_CONFIG = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "index_topk": 2048,
                "simulated": True}  # fmt: skip


def model_folder(path: str = MODEL_DIR) -> str:
    """A shell command that makes ``path`` a model folder the simulated engine loads: its config.json (what
    model_weights stages on a GPU VM). The engine reads it before it starts, as sglang does, and refuses a path that
    holds none (lab/sglang-sim README, "The model path, as sglang 0.5.9")."""
    config = shlex.quote(json.dumps(MODEL_CONFIG))
    return f"install -d -m 0755 {path} && printf '%s' {config} > {path}/config.json"


def tokenizer_files() -> dict[str, bytes]:
    """The model folder's files: the tokenizer's and config.json."""
    sys.path.insert(0, str(ROOT / "lab"))
    from testhub import model

    files = model.files_for(1)
    out = {n: files[n] for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")}
    return out | {"config.json": json.dumps(MODEL_CONFIG).encode()}


def pyyaml_wheel() -> Path:
    """The simulator's dependency: the pinned PyYAML wheel (sha256 checked), cached in the lab wheelhouse."""
    sys.path.insert(0, str(ROOT / "locks"))
    import update_locks

    return update_locks.fetch_pyyaml_wheel(update_locks.DEFAULT_WHEELHOUSE)


def _add_wheel(tf: tarfile.TarFile, wheel: Path) -> None:
    """A wheel's files, as ``python -m zipfile -e`` would unpack it into site-packages."""
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.infolist():
            if member.is_dir():
                continue
            info = tarfile.TarInfo(member.filename)
            info.size, info.mode, info.mtime = member.file_size, 0o644, int(time.mktime((*member.date_time, 0, 0, -1)))
            tf.addfile(info, io.BytesIO(zf.read(member)))


def payload(tokenizer: bool = True) -> bytes:
    """A tar of the simulated engine's package (``sglang_sim/``), PyYAML's files (``yaml/``, ``_yaml/``, its
    dist-info) and, with ``tokenizer``, the model's tokenizer files (``tokenizer/``)."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        tf.add(
            ROOT / "lab/sglang-sim/src/sglang_sim",
            "sglang_sim",
            filter=lambda t: None if "__pycache__" in t.name else t,
        )
        _add_wheel(tf, pyyaml_wheel())
        for name, data in (tokenizer_files() if tokenizer else {}).items():
            info = tarfile.TarInfo(f"tokenizer/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return tar.getvalue()


INSTALL = (
    "set -e; d=/usr/lib/python3/dist-packages; mkdir -p " + MODEL_DIR + " /opt/ml-env/releases/sim/bin; "
    "tar -x -C $d; mv $d/tokenizer/* " + MODEL_DIR + "/; rmdir $d/tokenizer; "
    "ln -sf /usr/bin/python3 /opt/ml-env/releases/sim/bin/python; "
    "ln -sfn /opt/ml-env/releases/sim /opt/ml-env/current; python3 -m compileall -q $d/sglang_sim $d/yaml; "
    "chmod -R a+rX $d/sglang_sim $d/yaml $d/_yaml $d/pyyaml-*.dist-info " + MODEL_DIR
)


def install(lab_name: str, host: str, env: dict | None = None) -> None:
    """Install the simulated engine release and the tokenizer on one lab host (through `gpufleet_lab exec`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", "--name", lab_name, "exec", host, "--", "bash", "-c", INSTALL],
        input=payload(), capture_output=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"installing the simulated release on {host} failed: {proc.stderr.decode(errors='replace')}")
