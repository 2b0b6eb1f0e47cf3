"""python -m cuda_mirror build [--cache DIR] [--index URL]: build or reuse the lab CUDA mirror."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cuda_mirror.build import default_cache, ensure_built
from cuda_mirror.wheels import MirrorError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cuda_mirror", description=__doc__)
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--cache", type=Path, default=None, help=f"cache directory (default {default_cache()})")
    parser.add_argument("--index", default=None, help="PEP 503 index (default $GPUFLEET_PYPI_INDEX or PyPI)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        info = ensure_built(args.cache, args.index, log=lambda m: print(m, file=sys.stderr))
    except MirrorError as exc:
        print(f"cuda_mirror: error: {exc}", file=sys.stderr)
        return 1
    info["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
