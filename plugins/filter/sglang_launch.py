"""Filters of the sglang_server role: the server's launch spec meets the host's GPU facts.

``sglang_comm_flags(comm, overrides)``
    The SGLang communication flags of one host from gpu_facts' derived communication profile
    (``gpu_facts_comm.profile``): without GPU peer access SGLang's custom all-reduce is turned off. Inventory
    overrides (``sglang_server_comm_flags_overrides``) add or remove (null) flags, each with its source.

``sglang_launch_problems(facts, settings)``
    The checks of the launch spec against the hardware, before anything changes on a host: tp x pp (x dp)
    against the GPUs of a node, attention backends, quantization and fusion options against the architecture.
    Every problem names the host, the fact, the variable and the fix, as gpu_facts' preflight does.

gpu_facts owns the facts and the NCCL environment; this role owns the flags and reads the facts, never the other
way round. Pure functions of plain data, tested directly (tests/unit/sglang_server/test_launch_spec.py).
"""

from __future__ import annotations

from types import SimpleNamespace

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.fleet.plugins.filter.gpu_facts_filters import _problem

# Without P2P (gpu_facts_comm.profile "no-p2p") SGLang's custom all-reduce, which needs CUDA IPC peer access, must
# not be tried; NCCL (over SHM) does the all-reduce. From the seed machine's working launch (docs/gpu-facts.md).
NO_P2P_FLAGS = {"disable-custom-all-reduce": True}
OVERRIDES = "sglang_server_comm_flags_overrides"
_BACKEND_KEYS = ("nsa-decode-backend", "nsa-prefill-backend", "dsa-decode-backend", "dsa-prefill-backend")


def _norm_args(args):
    out = {}
    for key, value in (args or {}).items():
        out[str(key).lstrip("-").replace("_", "-")] = value
    return out


def sglang_comm_flags(comm, overrides=None):
    """``{"flags", "sources", "removed", "reasons", "warnings"}``: the communication flags of the host's profile
    (``comm``: gpu_facts_comm, the output of gpu_comm_settings), then the inventory's overrides (null removes)."""
    if not isinstance(comm, dict) or "profile" not in comm:
        raise AnsibleFilterError(
            "sglang_comm_flags needs gpu_facts_comm (run the gpu_facts role first: it derives the host's profile)"
        )
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, dict):
        raise AnsibleFilterError(f"{OVERRIDES} must be a mapping of flag: value (null removes), got {overrides!r}")
    profile = comm["profile"]
    flags, reasons, warnings, removed = {}, [], [], []
    if profile == "no-p2p":
        flags.update(NO_P2P_FLAGS)
        reasons.append(
            "--disable-custom-all-reduce: SGLang's custom all-reduce needs GPU peer access (CUDA IPC); "
            "without P2P it must not be tried, NCCL does the all-reduce"
        )
    # the sources' words are gpu_comm_settings' (the deploy report shows both together): facts or inventory
    sources = dict.fromkeys(flags, "facts")
    for key, value in overrides.items():
        key = str(key).lstrip("-")
        sources[key] = "inventory"
        if value is None:
            flags.pop(key, None)
            removed.append(key)
            reasons.append(f"{key}: removed by inventory (null)")
        else:
            flags[key] = value
            reasons.append(f"{key}={value}: set by inventory")
    if profile == "no-p2p" and "disable-custom-all-reduce" in removed:
        warnings.append(
            f"{OVERRIDES} removes disable-custom-all-reduce on a host without P2P: SGLang's custom all-reduce "
            "needs peer access"
        )
    return {"flags": flags, "sources": sources, "removed": removed, "reasons": reasons, "warnings": warnings}


def _check_parallelism(c):
    """The parallel layout fits the GPUs of this node.

    The layout is read once (the fact sglang_server_parallel, filter sglang_parallel); here it meets the GPUs
    gpu_facts found.
    """
    host, errors, warnings, summary, gpu_count = (c.host, c.errors, c.warnings, c.summary, c.gpu_count)
    par = c.parallel or {}
    where = "sglang_server_parallel (from sglang_server_args_*)"
    try:
        nnodes = int(par.get("nnodes", 1))
        world = int(par.get("world", 1))
        per_node = int(par.get("per_node", world // max(nnodes, 1)))
        if nnodes < 1 or world < 1:
            raise ValueError
    except (TypeError, ValueError):
        errors.append(
            _problem(
                host,
                "parallelism",
                f"the parallel layout is not usable: {par!r}",
                f"gpu_facts.gpu_count={gpu_count}",
                where,
                "run the sglang_server role's `flags` entry point (tasks/flags.yml) before this check",
            )
        )
        return
    for text in par.get("problems") or []:
        errors.append(_problem(host, "parallelism", text, f"gpu_facts.gpu_count={gpu_count}", where, text))
    if par.get("problems"):
        return
    opts = par.get("options") or {}
    tp_key, pp_key, nn_key = opts.get("tp", "tp-size"), opts.get("pp", "pp-size"), opts.get("nnodes", "nnodes")
    tp, pp, dp = par.get("tp", 1), par.get("pp", 1), par.get("dp", 1)
    dp_attention = bool(par.get("dp_attention"))
    needs = f"tp x pp{'' if dp_attention or dp == 1 else ' x dp'} = {world}"
    variable = f"sglang_server_args_*: {tp_key}={tp}, {pp_key}={pp}, {nn_key}={nnodes}"
    summary.update({"tp": tp, "pp": pp, "dp": dp, "nnodes": nnodes, "gpus_needed_total": world})
    summary["gpus_needed_per_node"] = per_node
    if per_node > gpu_count:
        errors.append(
            _problem(
                host,
                "parallelism",
                f"{needs} over {nnodes} node(s) needs {per_node} GPUs per node but {host} has {gpu_count}",
                f"gpu_facts.gpu_count={gpu_count}",
                variable,
                f"lower {tp_key}/{pp_key} to at most {gpu_count * nnodes} GPUs in total, or span more nodes "
                f"({-(-world // gpu_count) if gpu_count else '?'} hosts: sglang_server_multinode_group, "
                "docs/multinode.md)",
            )
        )
    elif per_node < gpu_count:
        warnings.append(
            _problem(
                host,
                "parallelism",
                f"{needs} uses {per_node} of {gpu_count} GPUs per node: {gpu_count - per_node} would sit idle",
                f"gpu_facts.gpu_count={gpu_count}",
                variable,
                f"set {tp_key} x {pp_key} to {gpu_count * nnodes}, or accept the idle GPUs",
            )
        )


def _check_backends(c):
    """Attention backends, quantization and fusion options suit the architecture."""
    host, warnings, archs, args = (c.host, c.warnings, c.archs, c.args)
    arch_set = set(archs)
    for key in _BACKEND_KEYS:
        value = str(args.get(key) or "")
        if not value:
            continue
        if value == "trtllm" and "sm_120" in arch_set:
            warnings.append(
                _problem(
                    host,
                    "backends",
                    f"--{key}=trtllm on sm_120 needs SGLang/FlashInfer builds with SM120 kernels "
                    "(sglang-kernel and flashinfer-cubin for 12.0); it was the only coherent NSA backend on "
                    "the seed machine",
                    f"gpu_facts.archs={archs}",
                    f"sglang_server_args_*.{key}",
                    "keep the pinned SM120-capable versions; check output with a real generation after start",
                )
            )
        elif value == "trtllm" and not arch_set & {"sm_100", "sm_103", "sm_120", "sm_121"}:
            warnings.append(
                _problem(
                    host,
                    "backends",
                    f"--{key}=trtllm uses TensorRT-LLM kernels built for Blackwell; {archs} may lack them",
                    f"gpu_facts.archs={archs}",
                    f"sglang_server_args_*.{key}",
                    "use the architecture's default NSA backend (drop the option) unless tested",
                )
            )
        elif value.startswith("flashmla") and "sm_120" in arch_set:
            warnings.append(
                _problem(
                    host,
                    "backends",
                    f"--{key}={value} gave NaN output on sm_120 (seed machine); only trtllm was coherent",
                    f"gpu_facts.archs={archs}",
                    f"sglang_server_args_*.{key}",
                    f"set sglang_server_args_*.{key}: trtllm",
                )
            )
    quant = str(args.get("quantization") or "")
    if "fp4" in quant and not arch_set & {"sm_100", "sm_103", "sm_120", "sm_121"}:
        warnings.append(
            _problem(
                host,
                "backends",
                f"--quantization={quant} (NVFP4) needs Blackwell FP4 tensor cores; {archs} has none",
                f"gpu_facts.archs={archs}",
                "sglang_server_args_*.quantization",
                "serve an FP8/BF16 checkpoint on this architecture",
            )
        )
    if args.get("enable-flashinfer-allreduce-fusion") and not arch_set <= {"sm_90", "sm_100", "sm_103"}:
        warnings.append(
            _problem(
                host,
                "backends",
                "--enable-flashinfer-allreduce-fusion: its help says it needs SM90 or SM10X",
                f"gpu_facts.archs={archs}",
                "sglang_server_args_*.enable-flashinfer-allreduce-fusion",
                "verify throughput and output with and without it on this architecture",
            )
        )
    if str(args.get("kv-cache-dtype") or "").startswith("fp8") and "sm_120" in arch_set:
        warnings.append(
            _problem(
                host,
                "backends",
                f"--kv-cache-dtype={args['kv-cache-dtype']} was reported broken for GLM-5 on sm_120",
                f"gpu_facts.archs={archs}",
                "sglang_server_args_*.kv-cache-dtype",
                "use kv-cache-dtype auto unless tested with a real generation",
            )
        )


def sglang_launch_problems(facts, settings):
    """``{"errors": [problem], "warnings": [problem], "summary": {...}}`` of the launch spec on one host.

    ``facts``: ansible_facts.gpu_facts; ``settings``: host, flags (the flags the engine gets), parallel
    (sglang_server_parallel: tp, pp, dp, nnodes, world, per_node, options, problems)."""
    if not isinstance(facts, dict) or "gpu_count" not in facts:
        raise AnsibleFilterError("sglang_launch_problems needs ansible_facts.gpu_facts (run the gpu_facts role first)")
    s = settings or {}
    host = s.get("host", "this host")
    errors, warnings = [], []
    gpu_count = int(facts.get("gpu_count") or 0)
    archs = facts.get("archs") or []
    summary = {"host": host, "gpu_count": gpu_count}
    c = SimpleNamespace(
        host=host, errors=errors, warnings=warnings, summary=summary, gpu_count=gpu_count, archs=archs,
        parallel=s.get("parallel"), args=_norm_args(s.get("flags")),
    )  # fmt: skip
    _check_parallelism(c)
    _check_backends(c)
    return {"errors": errors, "warnings": warnings, "summary": summary}


class FilterModule:
    def filters(self):
        return {"sglang_comm_flags": sglang_comm_flags, "sglang_launch_problems": sglang_launch_problems}
