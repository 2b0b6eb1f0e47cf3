"""``python -m sglang_sim.launch_server <SGLang flags>``: the simulated ``sglang.launch_server``.

gpufleet lab simulator (not SGLang). See README.md for flags, environment knobs and fault modes.
"""

from __future__ import annotations

import sys

from . import BANNER, EMULATED_SGLANG_VERSION, __version__, cli, engines, gpus
from .cli import SimFatal
from .faults import FaultError, from_env
from .log import fake_traceback, log, write_raw

ENTRY_FRAME = ("/sglang/launch_server.py", 24, "<module>", "server_args = prepare_server_args(sys.argv[1:])")


def banner_line() -> str:
    return (
        f"sglang-sim {__version__}: {BANNER}, emulating `python -m sglang.launch_server` of sglang "
        f"{EMULATED_SGLANG_VERSION}"
    )


def fatal(e: SimFatal) -> int:
    fake_traceback([ENTRY_FRAME, *e.frames], e.exc_line)
    return 1


def check_gpus(args, profile: gpus.Profile) -> None:
    world = cli.tp_size(args) * cli.pp_size(args)
    nnodes = int(args.nnodes or 1)
    have = len(profile.gpus)
    frames = [("/sglang/srt/entrypoints/engine.py", 721, "_launch_subprocesses", "proc.start()")]
    if world > have * nnodes:
        raise SimFatal(
            f"RuntimeError: tp_size * pp_size = {world} needs {world} GPUs over {nnodes} node(s), "
            "but this host "
            f"has {have} GPUs (gpusim profile {profile.name!r}). CUDA error: invalid device ordinal",
            frames,
        )
    local = world // nnodes
    base = int(args.base_gpu_id or 0)
    missing = [base + i for i in range(local) if profile.gpu(base + i) is None]
    if missing:
        raise SimFatal(
            f"RuntimeError: CUDA error: invalid device ordinal (GPU {missing[0]} does not exist; "
            "this host has "
            f"{have} GPUs, --base-gpu-id {base} with {local} local ranks)",
            frames,
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    unknown = engines.problem(EMULATED_SGLANG_VERSION)
    if unknown:
        write_raw(f"sglang-sim {__version__}: {BANNER}: error: {unknown}\n")
        return 2
    try:
        args = cli.parse(argv)
    except SimFatal as e:
        log(banner_line())
        return fatal(e)
    log(banner_line())
    try:
        faults = from_env()
    except FaultError as e:
        write_raw(f"sglang-sim: error: {e}\n")
        return 2
    if faults.names():
        log(f"sglang-sim: fault injection active: {', '.join(faults.names())}")
    args = cli.finalize(args)
    try:
        cli.validate(args)
    except SimFatal as e:
        return fatal(e)
    if faults.crash_on_start:
        fake_traceback(
            [
                ENTRY_FRAME,
                ("/sglang/srt/utils/common.py", 1203, "get_device_core_count", "torch.cuda.init()"),
            ],
            "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu. "
            "[sglang-sim fault injection: crash-on-start]",
        )
        return 1
    profile = gpus.load_profile()
    if profile is None:
        fake_traceback(
            [ENTRY_FRAME, ("/torch/cuda/__init__.py", 372, "_lazy_init", "torch._C._cuda_init()")],
            f"RuntimeError: No CUDA GPUs are available (sglang-sim: no GPU profile at {gpus.profile_path()})",
        )
        return 1
    from .hf_config import ModelConfigError
    from .resolve import ResolveError, load_model_config, resolve

    # The model's config is read while the server arguments are resolved, before any child process or port
    # (hf_config.py): a model path sglang cannot load ends the start here, with transformers' exception.
    try:
        model = load_model_config(args)
    except ModelConfigError as e:
        fake_traceback(e.frames, e.exc_line)
        return 1
    try:
        check_gpus(args, profile)
    except SimFatal as e:
        return fatal(e)
    try:
        resolved = resolve(args, profile, model)
    except ResolveError as e:
        return fatal(
            SimFatal(
                e.exc_line,
                [
                    ("/sglang/srt/server_args.py", 736, "__post_init__", "self._handle_model_specific_adjustments()")
                    if e.line < 1772
                    else (
                        "/sglang/srt/server_args.py",
                        740,
                        "__post_init__",
                        "self._handle_attention_backend_compatibility()",
                    ),
                ],
            )
        )
    for line in resolved.logs:
        log(line)
    log(f"server_args={cli.server_args_repr(args)}")
    from .app import App

    return App(args, faults, profile, model).run()


if __name__ == "__main__":
    sys.exit(main())
