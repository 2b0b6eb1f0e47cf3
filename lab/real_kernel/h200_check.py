#!/usr/bin/env python3
"""Run the gpufleet-axpy extension on a real GPU (docs/measurements/real-kernel-build.md, H200 section).

Given a wheel directory holding gpufleet_axpy (built from the same sdist as `make real-kernel`, with the
machine's python, torch and nvcc), import it, run ``axpy`` for float32, float16 and bfloat16 against torch's
own ``alpha * x + y``, and time it with CUDA events. Prints one JSON document.
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> int:
    sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "/tmp/site")
    import gpufleet_axpy

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    report = {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "extension": gpufleet_axpy._C.__file__,
        "results": [],
    }
    ok = True
    n = 1 << 26  # 64 Mi elements: 256 MiB per float32 tensor, well past the 60 MB L2
    for dtype, tol in ((torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 1e-2)):
        gen = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(n, device=dev, dtype=dtype, generator=gen)
        y = torch.randn(n, device=dev, dtype=dtype, generator=gen)
        expected = (2.5 * x.float() + y.float()).to(dtype)
        got = gpufleet_axpy.axpy(2.5, x, y.clone())
        max_err = (got.float() - expected.float()).abs().max().item()
        rel = max_err / max(expected.float().abs().max().item(), 1e-30)
        passed = rel <= tol
        ok &= passed
        for _ in range(3):
            gpufleet_axpy.axpy(1.0, x, y)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 20
        start.record()
        for _ in range(reps):
            gpufleet_axpy.axpy(1.0, x, y)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / reps
        moved = 3 * n * x.element_size()  # read x, read y, write y
        report["results"].append(
            {
                "dtype": str(dtype).replace("torch.", ""),
                "elements": n,
                "max_rel_err_vs_torch": rel,
                "passed": passed,
                "ms_per_call": round(ms, 4),
                "GB_per_s": round(moved / ms / 1e6, 1),
            }
        )
    try:
        gpufleet_axpy.axpy(1.0, torch.ones(4), torch.ones(4))
        report["cpu_tensor_refused"] = False
        ok = False
    except RuntimeError as err:
        report["cpu_tensor_refused"] = str(err).splitlines()[0]
    report["ok"] = bool(ok)
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
