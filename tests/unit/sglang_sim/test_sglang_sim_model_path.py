"""The model path as sglang reads it before it starts (sglang_sim/hf_config.py): ModelConfig -> get_config ->
transformers' AutoConfig.from_pretrained, which ends the start on a path it cannot load.

The expected messages are transformers' own, each as the version an engine version pins raised it (4.57.1 for 0.5.9,
5.3.0 for 0.5.10.post1, 5.19.0 for 0.5.23; huggingface_hub 0.36.2 / 1.33.0), with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import json

import pytest
from sglang_sim import hf_config
from sglang_sim_helpers import tiny_model

VERSIONS = ("0.5.9", "0.5.10.post1", "0.5.23")
CANT_LOAD = (
    "OSError: Can't load the configuration of '{0}'. If you were trying to load it from "
    "'https://huggingface.co/models', make sure you don't have a local directory with the same name. Otherwise, make "
    "sure '{0}' is the correct path to a directory containing a config.json file"
)  # transformers 4.57.1 configuration_utils.py:742-749
NOT_A_REPO_ID = (
    "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{0}'. Use `repo_type` argument if "
    "needed."
)  # huggingface_hub 1.33.0 validate_repo_id, through transformers 5.x utils/hub.py cached_files
COULD_NOT_CONNECT = (
    "OSError: We couldn't connect to '{0}' to load the files, and couldn't find them in the cached files.\n"
    "Check your internet connection or see how to run the library in offline mode at "
    "'https://huggingface.co/docs/transformers/installation#offline-mode'."
)


def ns(model_path, **kw) -> argparse.Namespace:
    values = {"model_path": str(model_path), "revision": None, "mem_fraction_static": None, "enable_multimodal": None}
    return argparse.Namespace(**{**values, **kw})


def failure(model_path, version="0.5.9", **kw) -> hf_config.ModelConfigError:
    with pytest.raises(hf_config.ModelConfigError) as e:
        hf_config.load(ns(model_path, **kw), version)
    return e.value


# ---------------------------------------------------------------- a missing model path
@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.5.9", CANT_LOAD), ("0.5.10.post1", NOT_A_REPO_ID), ("0.5.23", NOT_A_REPO_ID)],
)
def test_a_missing_absolute_path_is_not_a_repo_id(version, expected):
    assert failure("/does/not/exist", version).exc_line == expected.format("/does/not/exist")


def test_a_missing_path_fails_in_get_config_while_the_server_args_resolve():
    frames = [(path, line, func) for path, line, func, _ in failure("/does/not/exist").frames]
    assert frames[:5] == [
        ("/sglang/launch_server.py", 32, "<module>"),
        ("/sglang/srt/server_args.py", 5592, "prepare_server_args"),
        ("/sglang/srt/server_args.py", 5078, "from_cli_args"),
        ("/sglang/srt/server_args.py", 733, "__post_init__"),  # self._handle_gpu_memory_settings(gpu_mem)
        ("/sglang/srt/server_args.py", 1067, "_handle_gpu_memory_settings"),  # self.get_model_config()
    ]
    assert ("/sglang/srt/utils/hf_transformers_utils.py", 315, "get_config") in frames
    assert frames[-1] == ("/transformers/configuration_utils.py", 744, "_get_config_dict")
    # with --mem-fraction-static the first reader is _handle_model_specific_adjustments (server_args.py:1188)
    frames = [f[:3] for f in failure("/does/not/exist", mem_fraction_static=0.9).frames]
    assert frames[3:5] == [
        ("/sglang/srt/server_args.py", 736, "__post_init__"),
        ("/sglang/srt/server_args.py", 1188, "_handle_model_specific_adjustments"),
    ]


def test_a_repo_id_is_read_from_the_hub_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", "http://10.1.2.3:8080/")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    # transformers 4.57.1 uses HF_ENDPOINT as given (utils/hub.py:130), huggingface_hub 1.33.0 strips the slash
    assert failure("org/tiny").exc_line == COULD_NOT_CONNECT.format("http://10.1.2.3:8080/")
    assert failure("org/tiny", "0.5.23").exc_line == COULD_NOT_CONNECT.format("http://10.1.2.3:8080")
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    (snapshot / "config.json").write_bytes((tiny_model() / "config.json").read_bytes())
    for version in VERSIONS:
        loaded = hf_config.load(ns("org/tiny"), version)
        assert loaded.path == str(snapshot / "config.json") and loaded.data["architectures"] == ["LlamaForCausalLM"]
    assert failure("org/tiny", revision="v1").exc_line.startswith("OSError: We couldn't connect")


def test_other_invalid_repo_ids():
    assert failure("/m").exc_line == CANT_LOAD.format("/m")
    assert failure("/m", "0.5.10.post1").exc_line == (
        "OSError: Repo id must use alphanumeric chars, '-', '_' or '.'. The name cannot start or end with '-' or '.' "
        "and the maximum length is 96: '/m'."
    )
    assert failure("a--b", "0.5.23").exc_line == "OSError: Cannot have -- or .. in repo_id: 'a--b'."
    assert failure("x.git", "0.5.23").exc_line == "OSError: Repo_id cannot end by '.git': 'x.git'."


# ---------------------------------------------------------------- a folder and its config.json
def test_a_folder_without_config_json_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = "weights"  # relative, so that no model type's name is in the path (4.57.1 looks for one)
    (tmp_path / folder).mkdir()
    exc = failure(folder).exc_line
    assert exc.startswith(
        f"ValueError: Unrecognized model in {folder}. Should have a `model_type` key in its config.json, or contain "
        "one of the following strings in its name: aimv2, aimv2_vision_model, albert, "
    )
    # transformers 4.57.1's names, then those sglang 0.5.9 registers (lfm2_moe first, hf_transformers_utils.py:114)
    assert exc.endswith(
        ", zamba, zamba2, zoedepth, lfm2_moe, afmoe, bailing_hybrid, chatglm, exaone, deepseek_vl_v2, multi_modality, "
        "kimi_vl, internvl_chat, step3_vl, kimi_linear, dots_vlm, dots_ocr, NemotronH_Nano_VL_V2, nemotron_h, "
        "deepseek-ocr, qwen3_5, qwen3_5_moe, jet_nemotron, jet_vlm, kimi_k25, step3p5"
    )
    for version in ("0.5.10.post1", "0.5.23"):
        assert failure(folder, version).exc_line == (
            f"ValueError: Unrecognized model in {folder}. Should have a `model_type` key in its config.json."
        )


def test_a_folder_named_after_a_model_type_fails_in_model_config(tmp_path):
    """4.57.1 reads a config dict without model_type with the class whose name the path contains (glm), which has
    no architectures: 0.5.9's ModelConfig indexes them (configs/model_config.py:149)."""
    folder = tmp_path / "glm-5-sim"
    folder.mkdir()
    e = failure(folder)
    assert e.exc_line == "TypeError: 'NoneType' object is not subscriptable"
    assert e.frames[-1][:3] == ("/sglang/srt/configs/model_config.py", 149, "__init__")
    (folder / "config.json").write_text('{"architectures": ["GlmMoeDsaForCausalLM"]}')
    assert hf_config.load(ns(folder), "0.5.9").data == {"architectures": ["GlmMoeDsaForCausalLM"]}
    assert failure(folder, "0.5.23").exc_line.startswith("ValueError: Unrecognized model in ")


def test_a_config_that_is_not_json(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": ')
    for version in VERSIONS:
        assert failure(tmp_path / "m", version).exc_line == (
            f"OSError: It looks like the config file at '{tmp_path / 'm' / 'config.json'}' is not a valid JSON file."
        )


def test_the_tiny_model_folder_loads():
    loaded = hf_config.load(ns(tiny_model()))
    assert loaded.path == str(tiny_model() / "config.json")
    assert loaded.data["model_type"] == "llama" and loaded.data["architectures"] == ["LlamaForCausalLM"]


# ---------------------------------------------------------------- the simulator's start
def test_the_start_ends_before_ready_on_a_missing_model_path(make_sim):
    s = make_sim(["--model-path", "/does/not/exist"])
    assert s.wait_exit(timeout=20) == 1
    log = s.log()
    assert log.rstrip("\n").endswith(CANT_LOAD.format("/does/not/exist"))
    assert 'File "/sglang/srt/utils/hf_transformers_utils.py", line 315, in get_config' in log
    # nothing started: no scheduler, no weights, no GPU memory, no port
    assert "Load weight begin" not in log and "Uvicorn running" not in log and "server_args=" not in log
    assert s.registry() == {} and s.status() is None


def test_the_start_ends_on_a_folder_without_config_json(make_sim, tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    s = make_sim(["--model-path", str(folder)], env={"SGLANG_SIM_ENGINE_VERSION": "0.5.23"})
    assert s.wait_exit(timeout=20) == 1
    assert (
        s.log()
        .rstrip("\n")
        .endswith(f"ValueError: Unrecognized model in {folder}. Should have a `model_type` key in its config.json.")
    )
    assert "Load weight begin" not in s.log()


def test_the_tiny_model_folder_serves(make_sim):
    s = make_sim().wait_ready()
    assert s.model_path == str(tiny_model())
    assert "Load weight end. type=LlamaForCausalLM," in s.log()
    info = s.get("/get_model_info").json()
    assert info["model_path"] == s.model_path and info["model_type"] == "llama"
    assert info["architectures"] == json.loads((tiny_model() / "config.json").read_text())["architectures"]
