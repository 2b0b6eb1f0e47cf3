"""All-reduce bus bandwidth over every GPU of this host (torch.distributed + NCCL).

One process per GPU (``torch.multiprocessing.spawn``), bf16 tensors from 1 MiB to 1 GiB,
warm-ups then timed iterations (CUDA events), and the nccl-tests formulas:

    algbw = bytes / time            busbw = algbw * 2 * (n - 1) / n

Each *variant* is a set of NCCL environment variables; every variant runs in fresh processes
(NCCL reads its environment once per process).  Variables named by any variant are removed
from the base environment first, so ``defaults`` ({}) really is NCCL's default for them; other
variables (e.g. NCCL_NVLS_ENABLE=0 set by the machine) stay.

    python allreduce_bw.py --variant derived='{"NCCL_P2P_LEVEL":"PHB"}' --variant defaults='{}' \
        --variant p2p_off='{"NCCL_P2P_DISABLE":"1"}' --json-out result.json

Exit codes: 0 measured (or not applicable: fewer than 2 GPUs, reported as status
"not_applicable"), 2 torch/CUDA/NCCL missing (status "unavailable"), 1 a run failed.
``--probe`` only reports what is available (always exit 0).
Used by roles/gpu_facts/tasks/measure_nccl.yml (playbooks/measure_nccl.yml); docs/gpu-facts.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import socket
import sys
import tempfile
import time

MIB = 1024 * 1024
DEFAULT_SIZES_MIB = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def busbw_gbps(nbytes, seconds, world_size):
    """nccl-tests all-reduce bus bandwidth in GB/s (10^9 bytes/s)."""
    if seconds <= 0 or world_size < 1:
        return 0.0
    return nbytes / seconds * (2 * (world_size - 1) / world_size) / 1e9


def algbw_gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def parse_variant(text):
    """``name={"VAR": "value"}`` (or ``name=VAR=value,VAR2=value``) -> (name, env dict)."""
    name, _sep, spec = text.partition("=")
    if not name or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise argparse.ArgumentTypeError(f"variant needs NAME=ENV, got {text!r}")
    spec = spec.strip()
    if not spec:
        return name, {}
    env = json.loads(spec) if spec.startswith("{") else dict(i.split("=", 1) for i in spec.split(",") if i)
    return name, {str(k): (None if v is None else str(v)) for k, v in env.items()}


def summarize(variants, reference=None):
    """Bus bandwidth per variant and size, the best variant per size and ``reference``/best ratios.

    ``reference`` defaults to the first variant (the derived environment when run by the role).
    Returns ``{"reference", "busbw_gbps": {variant: {size_mib: GB/s}}, "best": {size_mib: {"variant",
    "busbw_gbps"}}, "reference_vs_best": {size_mib: ratio}, "min_ratio", "min_ratio_large"}``; "large"
    means sizes >= 64 MiB, where bandwidth (not latency) dominates.
    """
    ok = [v for v in variants if v.get("ok")]
    if not ok:
        return {"reference": reference, "busbw_gbps": {}, "best": {}, "reference_vs_best": {}}
    reference = reference or ok[0]["name"]
    table = {v["name"]: {_size_key(r["size_mib"]): r["busbw_gbps"] for r in v["results"]} for v in ok}
    sizes = sorted({s for row in table.values() for s in row}, key=float)
    best, ratio = {}, {}
    for size in sizes:
        name, value = max(((n, row[size]) for n, row in table.items() if size in row), key=lambda t: t[1])
        best[size] = {"variant": name, "busbw_gbps": value}
        if reference in table and size in table[reference] and value > 0:
            ratio[size] = round(table[reference][size] / value, 3)
    large = [r for s, r in ratio.items() if float(s) >= 64]
    return {
        "reference": reference,
        "busbw_gbps": table,
        "best": best,
        "reference_vs_best": ratio,
        "min_ratio": min(ratio.values()) if ratio else None,
        "min_ratio_large": min(large) if large else None,
    }


def _size_key(size_mib):
    return str(int(size_mib)) if float(size_mib).is_integer() else str(size_mib)


def transports_from_logs(paths):
    """Unique NCCL transports from NCCL_DEBUG=INFO logs (``via P2P/CUMEM``, ``via SHM/direct/direct``)."""
    found = set()
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    m = re.search(r"\bvia (\S+)", line)
                    if m:
                        found.add(m.group(1))
        except OSError:
            continue
    return sorted(found)


def probe():
    info = {"python": sys.executable, "torch": None, "cuda_available": False, "gpu_count": 0, "nccl": None}
    try:
        import torch  # noqa: PLC0415
    except ImportError as exc:
        info["error"] = f"torch not importable: {exc}"
        return info
    info["torch"] = torch.__version__
    info["cuda_available"] = bool(torch.cuda.is_available())
    info["gpu_count"] = torch.cuda.device_count() if info["cuda_available"] else 0
    try:
        info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception as exc:  # noqa: BLE001
        info["error"] = f"NCCL not available in torch: {exc}"
    return info


def _worker(rank, world, port, sizes, warmup, iters, dtype_name, queue):
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    torch.cuda.set_device(rank)
    init = {"init_method": f"tcp://127.0.0.1:{port}", "rank": rank, "world_size": world}
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank), **init)
    except TypeError:  # torch < 2.3 has no device_id
        dist.init_process_group("nccl", **init)
    dtype = getattr(torch, dtype_name)
    elem = torch.tensor([], dtype=dtype).element_size()
    results = []
    try:
        for nbytes in sizes:
            x = torch.ones(nbytes // elem, dtype=dtype, device="cuda")
            for _i in range(warmup):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _i in range(iters):
                dist.all_reduce(x)
            end.record()
            torch.cuda.synchronize()
            seconds = torch.tensor([start.elapsed_time(end) / 1000.0 / iters], device="cuda")
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
            # correctness: the sum of ones over the ranks, after warm-ups + iterations of in-place sums
            ok = True
            if rank == 0:
                y = torch.ones(1024, dtype=torch.float32, device="cuda")
                dist.all_reduce(y)
                ok = bool(torch.all(y == world).item())
            else:
                y = torch.ones(1024, dtype=torch.float32, device="cuda")
                dist.all_reduce(y)
            t = float(seconds.item())
            results.append(
                {
                    "bytes": nbytes,
                    "size_mib": nbytes / MIB,
                    "time_us": round(t * 1e6, 2),
                    "algbw_gbps": round(algbw_gbps(nbytes, t), 2),
                    "busbw_gbps": round(busbw_gbps(nbytes, t, world), 2),
                    "correct": ok,
                }
            )
            del x
        if rank == 0:
            queue.put({"ok": True, "results": results})
    except Exception as exc:  # noqa: BLE001
        if rank == 0:
            queue.put({"ok": False, "error": repr(exc)})
        raise
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_variant(name, env, managed, args, world):
    import torch.multiprocessing as mp  # noqa: PLC0415

    saved = dict(os.environ)
    logdir = tempfile.mkdtemp(prefix=f"nccl-{name}-")
    try:
        for key in managed:
            os.environ.pop(key, None)
        for key, value in env.items():
            if value is not None:
                os.environ[key] = value
        if args.nccl_debug:
            os.environ["NCCL_DEBUG"] = "INFO"
            os.environ["NCCL_DEBUG_FILE"] = os.path.join(logdir, "nccl.%h.%p.log")
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        started = time.monotonic()
        mp.spawn(
            _worker,
            args=(world, _free_port(), args.sizes, args.warmup, args.iters, args.dtype, queue),
            nprocs=world,
            join=True,
        )
        out = queue.get()
        out.update(
            {
                "name": name,
                "env": env,
                "seconds": round(time.monotonic() - started, 1),
                "transports": transports_from_logs(glob.glob(os.path.join(logdir, "nccl.*.log"))),
            }
        )
        return out
    except Exception as exc:  # noqa: BLE001
        return {"name": name, "env": env, "ok": False, "error": repr(exc)}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--variant", action="append", type=parse_variant, default=[], metavar="NAME=ENV")
    parser.add_argument("--sizes-mib", type=lambda s: [int(v) for v in s.split(",")], default=DEFAULT_SIZES_MIB)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--nccl-debug", action="store_true", help="record the transports NCCL chose (NCCL_DEBUG=INFO)")
    parser.add_argument("--json-out", default=None, help="also write the JSON report here")
    parser.add_argument("--probe", action="store_true", help="only report torch/CUDA/NCCL availability")
    args = parser.parse_args(argv)
    args.sizes = [m * MIB for m in args.sizes_mib]
    variants = args.variant or [("current", {})]

    info = probe()
    report = {
        "tool": "gpufleet benchmarks/nccl/allreduce_bw.py",
        "host": socket.gethostname(),
        "formula": "busbw = bytes/time * 2*(n-1)/n (nccl-tests all_reduce)",
        "dtype": args.dtype,
        "warmup": args.warmup,
        "iters": args.iters,
        "probe": info,
        "world_size": info["gpu_count"],
        "variants": [],
    }
    rc = 0
    if args.probe:
        report["status"] = "probe"
    elif info["torch"] is None or not info["cuda_available"] or info["nccl"] is None:
        report["status"] = "unavailable"
        report["message"] = info.get("error") or "CUDA is not available to torch"
        rc = 2
    elif info["gpu_count"] < 2:
        report["status"] = "not_applicable"
        report["message"] = f"{info['gpu_count']} GPU: all-reduce between GPUs needs at least 2"
    else:
        managed = sorted({k for _unused, env in variants for k in env})
        report["managed_env"] = managed
        report["base_env"] = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") and k not in managed}
        for name, env in variants:
            result = run_variant(name, env, managed, args, info["gpu_count"])
            report["variants"].append(result)
            print(f"# {name} {env}: " + ("ok" if result.get("ok") else result.get("error", "failed")), file=sys.stderr)
        report["summary"] = summarize(report["variants"])
        report["status"] = "ok" if all(v.get("ok") for v in report["variants"]) else "failed"
        rc = 0 if report["status"] == "ok" else 1
    text = json.dumps(report, indent=1)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
