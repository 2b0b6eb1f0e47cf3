"""The model's config, read from ``--model-path`` as the emulated sglang reads it before it starts anything.

sglang builds its ``ModelConfig`` while it resolves the server arguments, before any child process, port or GPU
memory: ``ModelConfig.__init__`` -> ``get_config`` (``srt/utils/hf_transformers_utils.py``) -> transformers'
``AutoConfig.from_pretrained(model_path, trust_remote_code=..., revision=...)``. A model path that is not a local
folder is taken for a hub repository id: looked up in the hub cache (offline, ``HF_HUB_OFFLINE=1``, the lab hosts'
case), never downloaded by the simulator. When that fails the start ends there with transformers' exception (an
uncaught traceback, exit 1). The versions, checked against transformers' own code (the version each sglang pins:
0.5.9 -> transformers 4.57.1 and huggingface_hub 0.36.2, 0.5.10.post1 -> 5.3.0 and 1.33.0, 0.5.23 -> 5.19.0 and
1.33.0):

* not a folder, not a file, not a valid repo id (an absolute path such as ``/does/not/exist``):
  ``huggingface_hub`` ``validate_repo_id`` (utils/_validators.py) refuses it. transformers 4.57.1 turns that into
  ``OSError: Can't load the configuration of '<path>'. ... containing a config.json file``
  (configuration_utils.py:742-749); 5.x into ``OSError: <the validation message>`` (utils/hub.py:468-469 in 5.3.0,
  594-595 in 5.19.0);
* a valid repo id that is not in the hub cache: ``OSError: We couldn't connect to '<HF_ENDPOINT>' to load the
  files, and couldn't find them in the cached files. ...`` (utils/hub.py:553 in 4.57.1, 494 in 5.3.0, 620 in
  5.19.0);
* ``config.json`` that is not JSON: ``OSError: It looks like the config file at '<file>' is not a valid JSON
  file.`` (configuration_utils.py:760 in 4.57.1, 667 in 5.3.0, 886 in 5.19.0);
* a folder without ``config.json`` reads as an empty config (utils/hub.py:445-446 in 4.57.1), so does one whose
  ``config.json`` has no ``model_type``: transformers 5.x refuses it (``ValueError: Unrecognized model in <path>.
  Should have a `model_type` key in its config.json.``, configuration_auto.py:1471 in 5.3.0, 442 in 5.19.0);
  4.57.1 first looks for a model type's name in the path, longest first (configuration_auto.py:1372-1384; the names
  of ``data/hf-model-types-0.5.9.json``) and raises the same ValueError, listing those names, when none is in it;
* a config without ``architectures`` (0.5.9 and 0.5.10.post1, without ``--enable-multimodal``): ``ModelConfig``
  reads ``self.hf_config.architectures[0]`` (0.5.9 configs/model_config.py:149, 0.5.10.post1 162): ``TypeError:
  'NoneType' object is not subscriptable``. So a folder without ``config.json`` never starts.

Not modelled: the hub download itself (a model that only the hub has), remote code (``auto_map``), GGUF files, and
whether transformers knows the config's ``model_type`` (transformers 4.57.1 does not know GLM-5's ``glm_moe_dsa``:
``ValueError: The checkpoint you are trying to load has model type `glm_moe_dsa` but Transformers does not
recognize this architecture``, configuration_auto.py:1359-1370; the lab's model folders declare it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources

from . import EMULATED_SGLANG_VERSION

Frame = tuple[str, int, str, str]
TYPES_DATA = "data/hf-model-types-0.5.9.json"  # 0.5.9 only: transformers 5.x matches no names

_AC = "/transformers/models/auto/configuration_auto.py"
_CU = "/transformers/configuration_utils.py"
_HUB = "/transformers/utils/hub.py"
_SA = "/sglang/srt/server_args.py"
_MC = "/sglang/srt/configs/model_config.py"
_CACHED_FILES = "file = cached_files(path_or_repo_id=path_or_repo_id, filenames=[filename], **kwargs)"
_GET_DICT = "config_dict, kwargs = cls._get_config_dict(pretrained_model_name_or_path, **kwargs)"
_JSON_RAISE = "raise OSError(f\"It looks like the config file at '{resolved_config_file}' is not a valid JSON file.\")"
_CFG = "/sglang/srt/utils/hf_transformers/config.py"  # 0.5.23
_HUB_DOCS = "https://huggingface.co/docs/transformers/installation#offline-mode"


class ModelConfigError(Exception):
    """The start ends with this exception line after these frames (an uncaught traceback, exit 1)."""

    def __init__(self, exc_line: str, frames: list[Frame]):
        super().__init__(exc_line)
        self.exc_line = exc_line
        self.frames = frames


@dataclass
class Loaded:
    path: str | None  # the config file read; None when there was none (a folder without config.json)
    data: dict = field(default_factory=dict)


def _model_types() -> list[str]:
    text = resources.files("sglang_sim").joinpath(TYPES_DATA).read_text(encoding="utf-8")
    return list(json.loads(text)["model_types"])


def _head(version: str, args: argparse.Namespace) -> list[Frame]:
    """The frames from the entry point to ``ModelConfig.from_server_args``: the first step of the resolution that
    builds the model's config."""
    if version == "0.5.23":
        # launch_server.py:84 -> run_server (29: resolve_once) -> server_args.py:277 run_resolution_pipeline ->
        # arg_groups/pipeline.py:185, the first step that reads the model's config
        return [
            ("/sglang/launch_server.py", 84, "<module>", "run_server(server_args)"),
            ("/sglang/launch_server.py", 29, "run_server", "server_args.resolve_once()"),
            (_SA, 277, "resolve_once", "run_resolution_pipeline(self)"),
            ("/sglang/srt/arg_groups/pipeline.py", 185, "run_resolution_pipeline",
             "run_hook(apply_inkling_prefill_cuda_graph_default, server_args)"),
            ("/sglang/srt/arg_groups/resolution_hooks.py", 139, "run_hook", "step(server_args)"),
            ("/sglang/srt/arg_groups/cuda_graph_hook.py", 363, "apply_inkling_prefill_cuda_graph_default",
             "arch = model_config_of(server_args).hf_config.architectures[0]"),
            ("/sglang/srt/arg_groups/model_override_base.py", 213, "model_config_of",
             "model_config = ModelConfig.from_server_args(server_args)"),
            (_MC, 955, "from_server_args", "return ModelConfig("),
        ]  # fmt: skip
    if version == "0.5.10.post1":
        head = [
            ("/sglang/launch_server.py", 59, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
            (_SA, 6539, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
            (_SA, 5975, "from_cli_args", "return cls(**{attr: getattr(args, attr) for attr in attrs})"),
        ]
        if not getattr(args, "enforce_piecewise_cuda_graph", False):
            step = [
                (_SA, 778, "__post_init__", "self._handle_piecewise_cuda_graph()"),
                (_SA, 1086, "_handle_piecewise_cuda_graph",
                 "if self.get_model_config().is_piecewise_cuda_graph_disabled_model:"),
            ]  # fmt: skip
        elif args.mem_fraction_static is None:
            step = [
                (_SA, 784, "__post_init__", "self._handle_gpu_memory_settings(gpu_mem)"),
                (_SA, 1332, "_handle_gpu_memory_settings", "model_config = self.get_model_config()"),
            ]
        else:
            step = [
                (_SA, 787, "__post_init__", "self._handle_model_specific_adjustments()"),
                (_SA, 1498, "_handle_model_specific_adjustments", "hf_config = self.get_model_config().hf_config"),
            ]
        return [
            *head,
            *step,
            (_SA, 6025, "get_model_config", "self.model_config = ModelConfig.from_server_args(self)"),
            (_MC, 270, "from_server_args", "return ModelConfig("),
        ]
    # 0.5.9: launch_server.py:32; ServerArgs.__post_init__ reads the model's config first in
    # _handle_gpu_memory_settings when --mem-fraction-static is not given (1067), else in
    # _handle_model_specific_adjustments (1188)
    if args.mem_fraction_static is None:
        step = [
            (_SA, 733, "__post_init__", "self._handle_gpu_memory_settings(gpu_mem)"),
            (_SA, 1067, "_handle_gpu_memory_settings", "model_config = self.get_model_config()"),
        ]
    else:
        step = [
            (_SA, 736, "__post_init__", "self._handle_model_specific_adjustments()"),
            (_SA, 1188, "_handle_model_specific_adjustments", "hf_config = self.get_model_config().hf_config"),
        ]
    return [
        ("/sglang/launch_server.py", 32, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
        (_SA, 5592, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
        (_SA, 5078, "from_cli_args", "return cls(**{attr: getattr(args, attr) for attr in attrs})"),
        *step,
        (_SA, 5092, "get_model_config", "self.model_config = ModelConfig.from_server_args(self)"),
        (_MC, 250, "from_server_args", "return ModelConfig("),
    ]


def _get_config(version: str) -> list[Frame]:
    """From ``ModelConfig.__init__`` into sglang's ``get_config`` (behind its ``lru_cache_frozenset`` wrapper)."""
    if version == "0.5.23":
        return [
            (_MC, 620, "__init__", "get_config("),
            ("/sglang/srt/utils/common.py", 4570, "wrapper", "result = func(*args, **kwargs)"),
        ]
    if version == "0.5.10.post1":
        return [
            (_MC, 139, "__init__", "self.hf_config = get_config("),
            ("/sglang/srt/utils/common.py", 3156, "wrapper", "result = func(*args, **kwargs)"),
            ("/sglang/srt/utils/hf_transformers_utils.py", 514, "get_config", "config = AutoConfig.from_pretrained("),
        ]
    return [
        (_MC, 127, "__init__", "self.hf_config = get_config("),
        ("/sglang/srt/utils/common.py", 3475, "wrapper", "result = func(*args, **kwargs)"),
        ("/sglang/srt/utils/hf_transformers_utils.py", 315, "get_config", "config = AutoConfig.from_pretrained("),
    ]


# transformers' frames per version, from AutoConfig.from_pretrained (0.5.23: from its config parser, which reads the
# config dict itself first: srt/utils/hf_transformers/config.py:162 _try_load_longcat_config)
_LINES = {
    # from_pretrained -> get_config_dict, get_config_dict -> _get_config_dict, _get_config_dict -> cached_file,
    # cached_file -> cached_files, the invalid-id raise, the not-cached raise, the JSON raise, the _commit_hash line,
    # the "Unrecognized model" raise
    "0.5.9": (1332, 662, 721, 322, 744, 553, 760, 758, 1380),
    "0.5.10.post1": (1429, 574, 629, 277, 469, 494, 667, 665, 1471),
    "0.5.23": (397, 792, 844, 370, 595, 620, 886, None, 442),
}


def _from_pretrained(version: str) -> list[Frame]:
    ac, gcd = _LINES[version][:2]
    if version == "0.5.23":
        # config.py: get_config -> parser.parse (379) -> _try_load_longcat_config (224) -> get_config_dict (162)
        return [
            (_CFG, 379, "get_config", "config = parser.parse("),
            (_CFG, 224, "parse",
             "config = _try_load_longcat_config(model, revision, **kwargs)"),
            (_CFG, 162, "_try_load_longcat_config",
             "config_dict, _ = PretrainedConfig.get_config_dict("),
            (_CU, gcd, "get_config_dict", _GET_DICT),
        ]  # fmt: skip
    cls = "PreTrainedConfig" if version == "0.5.10.post1" else "PretrainedConfig"
    return [
        (_AC, ac, "from_pretrained",
         f"config_dict, unused_kwargs = {cls}.get_config_dict(pretrained_model_name_or_path, **kwargs)"),
        (_CU, gcd, "get_config_dict", _GET_DICT),
    ]  # fmt: skip


def _cached_file(version: str) -> list[Frame]:
    cf, cfs = _LINES[version][2:4]
    return [
        (_CU, cf, "_get_config_dict", "resolved_config_file = cached_file("),
        (_HUB, cfs, "cached_file", _CACHED_FILES),
    ]


# huggingface_hub's validate_repo_id (0.36.2 utils/_validators.py:119-170; 1.33.0 the same rules, an ASCII regex)
_REPO_ID_0_36 = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")
_REPO_ID_1_33 = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)


def repo_id_problem(repo_id: str, version: str = EMULATED_SGLANG_VERSION) -> str | None:
    """``validate_repo_id``'s HFValidationError message for ``repo_id``, None for a valid one."""
    if repo_id.count("/") > 1:
        return (
            "Repo id must be in the form 'repo_name' or 'namespace/repo_name':"
            f" '{repo_id}'. Use `repo_type` argument if needed."
        )
    valid = _REPO_ID_0_36.match(repo_id) if version == "0.5.9" else _REPO_ID_1_33.fullmatch(repo_id)
    if not valid:
        return (
            "Repo id must use alphanumeric chars, '-', '_' or '.'."
            " The name cannot start or end with '-' or '.' and the maximum length is 96:"
            f" '{repo_id}'."
        )
    if "--" in repo_id or ".." in repo_id:
        return f"Cannot have -- or .. in repo_id: '{repo_id}'."
    if repo_id.endswith(".git"):
        return f"Repo_id cannot end by '.git': '{repo_id}'."
    return None


def hub_cache(version: str = EMULATED_SGLANG_VERSION, env: dict | None = None) -> str:
    """Where transformers looks for a repository's files (huggingface_hub constants.py: HF_HUB_CACHE,
    HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub; transformers
    4.57.1 utils/hub.py:99-101 first TRANSFORMERS_CACHE, PYTORCH_TRANSFORMERS_CACHE, PYTORCH_PRETRAINED_BERT_CACHE)."""
    env = os.environ if env is None else env
    if version == "0.5.9":
        for name in ("TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE", "PYTORCH_PRETRAINED_BERT_CACHE"):
            if name in env:
                return env[name]
    default_home = os.path.join(os.path.expanduser("~"), ".cache")
    home = os.path.join(env.get("XDG_CACHE_HOME", default_home), "huggingface")
    home = os.path.expandvars(os.path.expanduser(env.get("HF_HOME", home)))
    legacy = env.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    return os.path.expandvars(os.path.expanduser(env.get("HF_HUB_CACHE", legacy)))


def cached_config(repo_id: str, revision: str | None, cache: str) -> str | None:
    """huggingface_hub ``try_to_load_from_cache(repo_id, "config.json", revision=...)``: the cached snapshot's
    config.json (a ref such as ``main`` resolved through ``refs/``), None when the cache does not have it."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    if not os.path.isdir(repo):
        return None
    rev = revision or "main"
    ref = os.path.join(repo, "refs", rev)
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            rev = f.read()
    if os.path.isfile(os.path.join(repo, ".no_exist", rev, "config.json")):
        return None
    path = os.path.join(repo, "snapshots", rev, "config.json")
    return path if os.path.isfile(path) else None


def _endpoint(version: str) -> str:
    """transformers 4.57.1 utils/hub.py:122-130 (HF_ENDPOINT as given); huggingface_hub 1.33.0 constants.py:69
    (trailing slashes stripped)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return endpoint if version == "0.5.9" else endpoint.rstrip("/")


def load(args: argparse.Namespace, version: str = EMULATED_SGLANG_VERSION) -> Loaded:
    """The model's config as the emulated version reads it (``--model-path``, ``--revision``), or
    ModelConfigError with the exception and the frames the real start ends with."""
    model = str(args.model_path)
    head = _head(version, args)
    into = head + _get_config(version)
    lines = _LINES[version]

    config_file: str | None
    if os.path.isfile(model):
        config_file = model  # configuration_utils.py:709-712 (4.57.1): a file is the config itself
    elif os.path.isdir(model):
        config_file = os.path.join(model, "config.json")
        if not os.path.isfile(config_file):
            config_file = None  # utils/hub.py:432-446 (4.57.1): no config.json in a folder is no config
    else:
        problem = repo_id_problem(model, version)
        if problem and version == "0.5.9":
            raise ModelConfigError(
                f"OSError: Can't load the configuration of '{model}'. If you were trying to load it from "
                "'https://huggingface.co/models', make sure you don't have a local directory with the same name. "
                f"Otherwise, make sure '{model}' is the correct path to a directory containing a config.json file",
                into + _from_pretrained(version) + [(_CU, lines[4], "_get_config_dict", "raise OSError(")],
            )
        if problem and version == "0.5.23":
            # the first failure (OSError) sends get_config to load_pointer_adapter (config.py:380-387), whose
            # cached_file of head.pt raises the same validation error (configs/model_config.py:328-353)
            raise ModelConfigError(
                f"OSError: {problem}",
                into
                + [
                    (_CFG, 387, "get_config", "meta = load_pointer_adapter(model, revision)"),
                    (_MC, 353, "load_pointer_adapter", "meta = load_pointer_head(model_path, revision)"),
                    (_MC, 328, "load_pointer_head", "path = cached_file("),
                    (_HUB, lines[3], "cached_file", _CACHED_FILES),
                    (_HUB, lines[4], "cached_files", 'raise OSError(f"{e}") from e'),
                ],  # fmt: skip
            )
        if problem:
            raise ModelConfigError(
                f"OSError: {problem}",
                into
                + _from_pretrained(version)
                + _cached_file(version)
                + [(_HUB, lines[4], "cached_files", 'raise OSError(f"{e}") from e')],
            )
        config_file = cached_config(model, getattr(args, "revision", None), hub_cache(version))
        if config_file is None:
            raise ModelConfigError(
                f"OSError: We couldn't connect to '{_endpoint(version)}' to load the files, and couldn't find them "
                "in the cached files.\nCheck your internet connection or see how to run the library in offline "
                f"mode at '{_HUB_DOCS}'.",
                into
                + _from_pretrained(version)
                + _cached_file(version)
                + [(_HUB, lines[5], "cached_files", "raise OSError(")],
            )

    data: object = {}
    if config_file is not None:
        try:
            with open(config_file, encoding="utf-8") as f:  # configuration_utils.py _dict_from_json_file
                data = json.loads(f.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelConfigError(
                f"OSError: It looks like the config file at '{config_file}' is not a valid JSON file.",
                into + _from_pretrained(version) + [(_CU, lines[6], "_get_config_dict", _JSON_RAISE)],
            ) from None
        except OSError as e:
            raise ModelConfigError(f"{type(e).__name__}: {e}", into + _from_pretrained(version)) from None
        if not isinstance(data, dict):
            if version == "0.5.23":  # config.py:165 reads it as a dict first
                raise ModelConfigError(
                    f"AttributeError: '{type(data).__name__}' object has no attribute 'get'",
                    into
                    + _from_pretrained(version)[:3]
                    + [(_CFG, 165, "_try_load_longcat_config",
                        'architectures = config_dict.get("architectures") or []')],
                )  # fmt: skip
            reason = (
                "list indices must be integers or slices, not str"
                if isinstance(data, list)
                else f"'{type(data).__name__}' object does not support item assignment"
            )
            raise ModelConfigError(
                f"TypeError: {reason}",
                into
                + _from_pretrained(version)
                + [(_CU, lines[7] or 0, "_get_config_dict", 'config_dict["_commit_hash"] = commit_hash')],
            )

    # 0.5.9 (transformers 4.57.1): without a model_type, a model type's name in the path picks the config class
    if "model_type" not in data and not (version == "0.5.9" and any(name in model for name in _model_types())):
        listed = "."
        if version == "0.5.9":
            listed = f", or contain one of the following strings in its name: {', '.join(_model_types())}"
        where = into
        if version == "0.5.23":
            where = into + [
                (_CFG, 379, "get_config", "config = parser.parse("),
                (_CFG, 228, "parse", "config = AutoConfig.from_pretrained("),
            ]  # fmt: skip
        raise ModelConfigError(
            f"ValueError: Unrecognized model in {model}. Should have a `model_type` key in its config.json{listed}",
            where + [(_AC, lines[8], "from_pretrained", "raise ValueError(")],
        )

    # ModelConfig.__init__ without --enable-multimodal (0.5.9 configs/model_config.py:143-149, 0.5.10.post1 155-162)
    archs_line = {"0.5.9": (149, "if self.hf_config.architectures[0] in mm_disabled_models:"),
                  "0.5.10.post1": (162, "self.hf_config.architectures[0] in mm_disabled_models")}  # fmt: skip
    if version in archs_line and getattr(args, "enable_multimodal", None) is None:
        archs = data.get("architectures")
        line, code = archs_line[version]
        if archs is None:
            raise ModelConfigError(
                "TypeError: 'NoneType' object is not subscriptable", head + [(_MC, line, "__init__", code)]
            )
        if archs == []:
            raise ModelConfigError("IndexError: list index out of range", head + [(_MC, line, "__init__", code)])
    return Loaded(config_file, data)
