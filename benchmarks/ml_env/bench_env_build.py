#!/usr/bin/env python3
"""Benchmark: building an ml-env from a hashed lock and a wheelhouse, uv vs pip.

For a lock (default: the lab lock locks/lab-sim, from the lab wheelhouse) it times, on this machine:
  * uv:  `uv venv` + `uv pip sync --require-hashes --no-index --find-links WHEELHOUSE LOCK`
  * pip: `python -m venv` + `pip install --require-hashes --no-index --find-links WHEELHOUSE -r LOCK`
each with a cold cache (fresh cache directory) and a warm one (same cache, new venv); and
  * N "hosts" sharing one wheelhouse served over HTTP (python -m http.server): N concurrent uv builds,
    each with its own cold cache (N = 1, 2, 4, 8), wall time for all.
Results (best of --repeats) go to benchmarks/results/ml_env.json.

  python benchmarks/ml_env/bench_env_build.py [--lock locks/lab-sim] [--wheelhouse DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_results import save_result  # noqa: E402  (benchmarks/bench_results.py)

DEFAULT_WHEELHOUSE = ROOT / ".cache" / "ml-env" / "wheelhouse-lab"
ISOLATED = {"PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def env() -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {**clean, **ISOLATED}


def run(argv, **kwargs) -> float:
    started = time.perf_counter()
    subprocess.run([str(a) for a in argv], check=True, capture_output=True, env=env(), **kwargs)
    return time.perf_counter() - started


def uv_build(work: Path, lock: Path, find_links: str, cache: Path, python: str) -> dict:
    venv = work / f"uv-{time.monotonic_ns()}"
    t_venv = run(["uv", "venv", "--no-config", "--python", python, venv])
    t_install = run(
        ["uv", "pip", "sync", "--no-config", "--require-hashes", "--no-index", "--find-links", find_links,
         "--cache-dir", cache, "--python", venv / "bin" / "python", lock]
    )  # fmt: skip
    shutil.rmtree(venv)
    return {"venv_s": t_venv, "install_s": t_install, "total_s": t_venv + t_install}


def pip_build(work: Path, lock: Path, find_links: str, cache: Path, python: str) -> dict:
    venv = work / f"pip-{time.monotonic_ns()}"
    t_venv = run([python, "-m", "venv", venv])
    t_install = run(
        [venv / "bin" / "python", "-m", "pip", "install", "--isolated", "--require-hashes", "--no-index",
         "--find-links", find_links, "--cache-dir", cache, "-r", lock]
    )  # fmt: skip
    shutil.rmtree(venv)
    return {"venv_s": t_venv, "install_s": t_install, "total_s": t_venv + t_install}


def best(samples: list[dict]) -> dict:
    top = min(samples, key=lambda s: s["total_s"])
    return {k: round(v, 3) for k, v in top.items()} | {"samples": len(samples)}


@contextlib.contextmanager
def http_wheelhouse(directory: Path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(50):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(timeout=10)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock", default=str(ROOT / "locks" / "lab-sim"), help="lock directory (requirements.txt)")
    parser.add_argument("--wheelhouse", default=str(DEFAULT_WHEELHOUSE))
    parser.add_argument("--python", default=sys.executable, help="interpreter of the venvs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", default="1,2,4,8", help="N values for the shared-wheelhouse run")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "ml_env.json"))
    args = parser.parse_args(argv)
    lock = Path(args.lock) / "requirements.txt"
    wheelhouse = Path(args.wheelhouse)
    if not any(wheelhouse.glob("*.whl")):
        print(f"no wheels in {wheelhouse}: run `python locks/update_locks.py wheelhouse` first", file=sys.stderr)
        return 2
    results: dict = {
        "lock": str(Path(args.lock).relative_to(ROOT)) if Path(args.lock).is_relative_to(ROOT) else args.lock,
        "packages": sum(1 for line in lock.read_text().splitlines() if "==" in line and not line.startswith("#")),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "uv": subprocess.run(["uv", "--version"], capture_output=True, text=True).stdout.strip(),
        "command": "python benchmarks/ml_env/bench_env_build.py " + " ".join(argv or sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="ml-env-bench-") as tmp:
        work = Path(tmp)
        for tool, build in (("uv", uv_build), ("pip", pip_build)):
            cold, warm = [], []
            for i in range(args.repeats):
                cache = work / f"{tool}-cache-{i}"
                cold.append(build(work, lock, str(wheelhouse), cache, args.python))
                warm.append(build(work, lock, str(wheelhouse), cache, args.python))
                shutil.rmtree(cache, ignore_errors=True)
            results[tool] = {"cold_cache": best(cold), "warm_cache": best(warm)}
            times = results[tool]
            print(f"{tool}: cold {times['cold_cache']['total_s']} s, warm {times['warm_cache']['total_s']} s")
        shared = {}
        with http_wheelhouse(wheelhouse) as url:
            for n in [int(x) for x in args.hosts.split(",")]:
                walls = []
                for r in range(args.repeats):
                    started = time.perf_counter()
                    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
                        futures = [
                            pool.submit(uv_build, work, lock, url, work / f"shared-{n}-{r}-{h}", args.python)
                            for h in range(n)
                        ]
                        per_host = [f.result()["total_s"] for f in futures]
                    walls.append({"wall_s": time.perf_counter() - started, "slowest_host_s": max(per_host)})
                top = min(walls, key=lambda w: w["wall_s"])
                shared[str(n)] = {k: round(v, 3) for k, v in top.items()}
                print(f"{n} hosts sharing the wheelhouse over HTTP (uv, cold caches): {shared[str(n)]['wall_s']} s")
        results["shared_wheelhouse_http_uv_cold"] = shared
    save_result(results, Path(args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
