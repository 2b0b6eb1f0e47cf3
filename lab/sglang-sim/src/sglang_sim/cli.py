"""The command line of ``python -m sglang.launch_server`` (sglang 0.5.9), rebuilt from its argparse dump.

``data/server-args-0.5.9.json`` was dumped from sglang 0.5.9's own parser (``ServerArgs.add_cli_args``):
option strings, dest, action, nargs, type, choices, default for all 331 arguments. We rebuild an
``argparse.ArgumentParser`` from it, so parsing behaves like SGLang's (abbreviations allowed, unknown
flags -> exit 2 ``error: unrecognized arguments: ...``). Semantic checks that SGLang performs after
parsing (and a few the fleet relies on) live in :func:`validate`.
"""

from __future__ import annotations

import argparse
import json
import os
from importlib import resources
from typing import Any

from . import BANNER, EMULATED_SGLANG_VERSION, __version__, engines

ARGS_DATA = engines.args_data(EMULATED_SGLANG_VERSION)  # the emulated version's parser dump
DEFAULT_MEM_FRACTION = 0.88


class SimFatal(Exception):
    """A start-up failure that real SGLang reports as an uncaught Python exception (exit 1)."""

    def __init__(self, exc_line: str, frames: list[tuple[str, int, str, str]] | None = None):
        super().__init__(exc_line)
        self.exc_line = exc_line
        self.frames = frames or []


def load_arg_spec() -> dict[str, Any]:
    text = resources.files("sglang_sim").joinpath(ARGS_DATA).read_text(encoding="utf-8")
    return json.loads(text)


# --- the non-builtin "type" callables of sglang's parser (names matter: argparse prints them) ---
def nullable_str(val: str) -> str | None:
    if not val or val.lower() in ("none", "null"):
        return None
    return val


def json_list_type(val: str) -> list:
    try:
        value = json.loads(val)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {val!r}") from e
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"Expected a JSON list, got {val!r}")
    return value


def loads(val: str) -> Any:  # json.loads under the name argparse shows in error messages
    return json.loads(val)


def human_readable_int(value: str) -> int:
    """0.5.10+ ``utils/common.py`` ``human_readable_int`` (0.5.23 line 3394): ``1k``, ``25.6k``, ``1Ki``, or an int."""
    import re

    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        if m.group(2) in iec:
            if "." in m.group(1):
                raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes: {value!r}")
            return int(m.group(1)) * iec[m.group(2)]
        return int(float(m.group(1)) * si[m.group(2)])
    return int(value)


def parse_cuda_graph_backend_arg(raw: str) -> str:
    """0.5.23 ``model_executor/cuda_graph_config.py:237``."""
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def parse_cuda_graph_config_arg(raw: str) -> dict:
    """0.5.23 ``model_executor/cuda_graph_config.py:246`` (a JSON dict of phase -> settings; keys not checked)."""
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {raw!r}")
    return value


TYPES = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "loads": loads,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}


class LoRAPathAction(argparse.Action):
    """sglang's LoRAPathAction: ``name=path`` or ``path`` items -> {name: path}."""

    def __call__(self, parser, namespace, values, option_string=None):
        result: dict[str, str] = {}
        for item in values or []:
            if "=" in item:
                name, path = item.split("=", 1)
                result[name] = path
            else:
                result[item] = item
        setattr(namespace, self.dest, result)


class DeprecatedAction(argparse.Action):
    """sglang's DeprecatedAction (0.5.9 server_args.py:5729-5738, 0.5.10.post1 server_args.py:6673-6682): no value
    (nargs=0), stores nothing, logs a warning; the start goes on."""

    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from .log import log

        log(
            f"WARNING server_args.py: The command line argument '{option_string}' is deprecated and will be removed "
            "in future versions."
        )


class DeprecatedStoreTrueAction(argparse.Action):
    """0.5.10+/0.5.23 ``arg_groups/argparse_actions.py:77``: warns, stores True (the flag still works)."""

    def __init__(self, option_strings, dest, nargs=0, const=True, default=False, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from .log import log

        log(f"WARNING server_args.py: '{option_string}' is deprecated and will be removed in a future release.")
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """0.5.23 ``arg_groups/argparse_actions.py:103``: warns, stores the value (or True without one)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from .log import log

        log(f"WARNING server_args.py: '{option_string}' is deprecated and will be removed in a future release.")
        setattr(namespace, self.dest, values if values not in (None, []) else True)


ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "BooleanOptionalAction": argparse.BooleanOptionalAction,
    "LoRAPathAction": LoRAPathAction,
    "DeprecatedAction": DeprecatedAction,
    "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
    "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
    # 0.5.23's smg-grpc-servicer plugin actions store their value (and set an environment variable the simulator
    # has no use for)
    "_ServicerImplAction": "store",
    "_EnvStoreAction": "store",
}


class _VersionAction(argparse.Action):
    """Like argparse's "version" action, but printed on one line (argparse would re-wrap it)."""

    def __call__(self, parser, namespace, values, option_string=None):
        import sys

        sys.stdout.write(version_text() + "\n")
        parser.exit(0)


def version_text() -> str:
    return (
        f"sglang-sim {__version__} - {BANNER}; emulates `python -m sglang.launch_server` "
        f"of sglang {EMULATED_SGLANG_VERSION}"
    )


class SimArgumentParser(argparse.ArgumentParser):
    """argparse, but an error is preceded by one line saying this is the simulator.

    The ``usage:`` and ``launch_server.py: error: ...`` lines (exit 2) are argparse's own, as in SGLang.
    """

    def error(self, message: str):
        import sys

        sys.stderr.write(f"sglang-sim {__version__}: {BANNER}\n")
        super().error(message)


def build_parser(spec: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    spec = spec or load_arg_spec()
    parser = SimArgumentParser(
        prog="launch_server.py",
        description=(
            f"{version_text()}. Every flag of sglang {spec.get('version')} is accepted and validated like "
            "SGLang's argparse parser; most only change what /get_server_info reports."
        ),
        allow_abbrev=bool(spec.get("allow_abbrev", True)),
    )
    for arg in spec["arguments"]:
        action_name = arg.get("action") or "_StoreAction"
        action = ACTIONS.get(action_name, "store")
        kwargs: dict[str, Any] = {"dest": arg["dest"], "action": action}
        if action in ("store", "append"):
            if arg.get("nargs") is not None:
                kwargs["nargs"] = arg["nargs"]
            typ = TYPES.get(arg.get("type"), str)
            if typ is not None:
                kwargs["type"] = typ
            if arg.get("choices") is not None:
                kwargs["choices"] = arg["choices"]
        elif action is LoRAPathAction:
            kwargs["nargs"] = arg.get("nargs") or "*"
            kwargs["type"] = str
        elif action is DeprecatedStoreConstAction:
            kwargs["nargs"] = arg.get("nargs")
            if arg.get("choices") is not None:
                kwargs["choices"] = arg["choices"]
        kwargs["default"] = arg.get("default")
        if action is DeprecatedAction:
            kwargs["help"] = "deprecated (ignored, with a warning)"
        else:
            kwargs["help"] = "default: %(default)s"
        parser.add_argument(*arg["options"], **kwargs)
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show the simulator's version and exit")
    return parser


# --- --config FILE.yaml: sglang 0.5.9 server_args_config_parser.ConfigArgumentMerger, line by line ---
CONFIG_FRAMES = [
    ("/sglang/srt/server_args.py", 5589, "prepare_server_args", "argv = config_merger.merge_config_with_args(argv)"),
    ("/sglang/srt/server_args_config_parser.py", 68, "merge_config_with_args", "config_data = ..."),
]


def _config_fatal(exc: BaseException) -> SimFatal:
    # PyYAML's errors are named like 0.5.9's traceback's last line: yaml.composer.ComposerError, ...
    module = type(exc).__module__
    name = type(exc).__name__ if module == "builtins" else f"{module}.{type(exc).__name__}"
    return SimFatal(f"{name}: {exc}", CONFIG_FRAMES)


def parse_config_yaml(path: str) -> dict[str, Any]:
    """``ConfigArgumentMerger._parse_yaml_config``: suffix check, ``yaml.safe_load`` (PyYAML), a mapping."""
    import yaml  # PyYAML: the simulator's one dependency, needed only here

    suffix = os.path.splitext(path)[1]
    if suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    if not os.path.exists(path):
        raise ValueError(f"Config file not found: {path}")
    try:
        with open(path) as file:
            config_data = yaml.safe_load(file)
    except Exception as e:
        log_error(f"Failed to read config file {path}: {e}")
        raise
    if config_data is None:
        config_data = {}
    if not isinstance(config_data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    return config_data


def config_to_args(parser: argparse.ArgumentParser, config: dict[str, Any]) -> list[str]:
    """``ConfigArgumentMerger._convert_config_to_args``: values become argv words with ``str(value)``."""
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    unsupported = {
        a.dest: a
        for a in parser._actions
        if a.option_strings
        and not isinstance(a, argparse._StoreTrueAction | argparse._StoreAction)
        and "--config" not in a.option_strings
        and "--help" not in a.option_strings
        and "-h" not in a.option_strings
        and "--version" not in a.option_strings  # the simulator's own addition
    }
    args: list[str] = []
    for key, value in config.items():
        key_norm = key.replace("-", "_")
        if key_norm in unsupported:
            action = unsupported[key_norm]
            raise ValueError(f"Unsupported config option '{key_norm}' with action '{action.__class__.__name__}'")
        if isinstance(value, bool):
            if key_norm in store_true:
                if value:
                    args.append(f"--{key}")
            else:
                args.extend([f"--{key}", str(value).lower()])
        elif isinstance(value, list):
            if value:
                args.append(f"--{key}")
                args.extend(str(item) for item in value)
        else:
            args.extend([f"--{key}", str(value)])
    return args


def merge_config(argv: list[str], parser: argparse.ArgumentParser | None = None) -> list[str]:
    """``ConfigArgumentMerger.merge_config_with_args``: config words first, then the command line."""
    if "--config" not in argv:
        return argv
    parser = parser or build_parser()
    try:
        indices = [i for i, a in enumerate(argv) if a == "--config"]
        if len(indices) > 1:
            raise ValueError("Multiple config files specified! Only one allowed.")
        idx = indices[0]
        if idx == len(argv) - 1:
            raise ValueError("No config file specified after --config flag!")
        cfg = parse_config_yaml(argv[idx + 1])
        cfg_args = config_to_args(parser, cfg)
    except Exception as e:  # sglang lets it propagate: a traceback and exit 1
        raise _config_fatal(e) from e
    return cfg_args + argv[:idx] + argv[idx + 2 :]


def log_error(msg: str) -> None:
    from .log import log

    log(msg)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    argv = merge_config(list(argv), parser)
    args = parser.parse_args(argv)
    if not args.model_path:
        parser.error("the following arguments are required: --model-path/--model")
    engines.to_sim(args, EMULATED_SGLANG_VERSION)  # the 0.5.9 names the simulator reads, from this version's dests
    return args


# --- post-parse (ServerArgs.__post_init__-like) ---
def tp_size(args: argparse.Namespace) -> int:
    return int(args.tensor_parallel_size or 1)


def pp_size(args: argparse.Namespace) -> int:
    return int(args.pipeline_parallel_size or 1)


def finalize(args: argparse.Namespace) -> argparse.Namespace:
    """Fill defaults SGLang derives after parsing."""
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    # mem_fraction_static: resolved from the GPUs (resolve.py, server_args.py:1020); DEFAULT_MEM_FRACTION (0.88) is
    # 0.5.9's value when the GPU memory is unknown
    return args


def validate(args: argparse.Namespace) -> None:
    """Checks that do not need the GPU profile. Raises SimFatal (exit 1)."""
    frames = [
        ("/sglang/srt/server_args.py", 612, "__post_init__", "self._handle_missing_default_values()"),
    ]
    frac = args.mem_fraction_static
    if frac is not None and not (0.0 < float(frac) < 1.0):
        raise SimFatal(f"ValueError: --mem-fraction-static must be in (0, 1), got {frac}", frames)
    name = args.served_model_name
    if name is not None and ":" in name:
        raise SimFatal(
            f"ValueError: --served-model-name must not contain ':' (got {name!r}); "
            "':' separates a model from a LoRA adapter name",
            frames,
        )
    nnodes = int(args.nnodes or 1)
    if nnodes < 1:
        raise SimFatal(f"ValueError: --nnodes must be >= 1, got {nnodes}", frames)
    world = tp_size(args) * pp_size(args)
    if world < 1:
        raise SimFatal(f"ValueError: tp_size * pp_size must be >= 1, got {world}", frames)
    if world % nnodes != 0:
        raise SimFatal(
            f"ValueError: tp_size * pp_size ({world}) must be divisible by nnodes ({nnodes})",
            frames,
        )
    if not (0 <= int(args.node_rank or 0) < nnodes):
        raise SimFatal(f"ValueError: --node-rank must be in [0, {nnodes}), got {args.node_rank}", frames)
    if int(args.port) <= 0 or int(args.port) > 65535:
        raise SimFatal(f"ValueError: --port must be in 1..65535, got {args.port}", frames)


def server_args_repr(args: argparse.Namespace) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in vars(args).items())
    return f"ServerArgs({inner})"
