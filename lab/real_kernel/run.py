#!/usr/bin/env python3
"""`make real-kernel`: the ml_env kernel builder compiles a real CUDA torch extension on a lab host.

1. Fills a cache (default /var/cache/gpufleet-lab/real-kernel, about 2.7 GB; kept between runs):
   ``wheelhouse/``   the lock locks/kernel-cu130 (torch 2.11.0 cu130 and its CUDA 13 wheels, hash-checked
                     by pip), the uv wheel, and the source distribution of lab/kernels/gpufleet-axpy;
   ``cuda-wheels/``  NVIDIA's CUDA 13.0 compiler wheels (the cuda_toolkit role's pinned set);
   ``tools/``        cuobjdump from NVIDIA's PyPI wheel (to read the machine code of the built wheel).
2. Brings up a one-host lab (``--lab``, default ``realkernel``) and runs lab/real_kernel/real_kernel.yml:
   cuda_toolkit (13.0 from the wheels) then ml_env (build venv with the lock, ``pip wheel
   --no-build-isolation`` with TORCH_CUDA_ARCH_LIST=9.0;12.0 and MAX_JOBS from the role, the wheel fetched
   into the cache's wheelhouse under kernels/<tag>/, then the release installed and imported).
3. Checks the wheel: cuobjdump --list-elf must show sm_90 and sm_120 machine code; prints a JSON summary
   (also written to <cache>/summary.json with the build log and cuobjdump output beside it).
4. Takes the lab down (``--keep-lab`` leaves it up).

Without ``--reuse`` an earlier wheel of the tag is removed first, so the run always compiles.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "locks"))
import update_locks  # noqa: E402 - the project's lock tool (uv wheel, sha256)

PLAYBOOK = ROOT / "lab" / "real_kernel" / "real_kernel.yml"
KERNEL_SRC = ROOT / "lab" / "kernels" / "gpufleet-axpy"
LOCK = ROOT / "locks" / "kernel-cu130"
CUDA_VARS = ROOT / "roles" / "cuda_toolkit" / "vars" / "main.yml"
DEFAULT_CACHE = Path("/var/cache/gpufleet-lab/real-kernel")
KERNEL_NAME, KERNEL_VERSION = "gpufleet-axpy", "0.1.0"
ARCHS = ["90", "120"]
CUDA_VERSION = "13.0"
# cuobjdump from PyPI (NVIDIA publishes no 13.0 build of this wheel; a newer cuobjdump reads older cubins).
CUOBJDUMP = ("nvidia-cuda-cuobjdump", "13.5.37", "38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58")
PIP_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
# Fixed mtime of the sdist's members (reproducible source distribution).
SOURCE_DATE_EPOCH = 1764374400


def log(msg: str) -> None:
    print(f"[real-kernel {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    log("+ " + " ".join(str(a) for a in argv))
    return subprocess.run([str(a) for a in argv], check=True, **kwargs)


def pip_download(requirements: Path, dest: Path, python_version: str) -> None:
    """pip download with --require-hashes from PyPI only (not this machine's pip configuration)."""
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_DISABLE_PIP_VERSION_CHECK="1")
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-r", requirements]
    argv += ["--index-url", "https://pypi.org/simple", "--only-binary", ":all:", "--progress-bar", "off", "-q"]
    argv += ["--python-version", python_version, "-d", dest]
    for platform in PIP_PLATFORMS:
        argv += ["--platform", platform]
    run(argv, env=env)


def build_sdist(src: Path, out_dir: Path) -> Path:
    """A reproducible sdist (name-version/ + PKG-INFO) of the extension's sources."""
    meta = {"name": KERNEL_NAME, "version": KERNEL_VERSION}
    base = f"{meta['name'].replace('-', '_')}-{meta['version']}"
    target = out_dir / f"{base}.tar.gz"
    pkg_info = (
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
        "Summary: A real CUDA torch extension (y <- a*x + y) to prove the ml_env kernel builder\n"
        "Requires-Python: >=3.10\nRequires-Dist: torch\n"
    ).encode()
    files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, data in [("PKG-INFO", pkg_info)] + [(str(p.relative_to(src)), p.read_bytes()) for p in files]:
            info = tarfile.TarInfo(f"{base}/{rel}")
            info.size, info.mtime, info.mode = len(data), SOURCE_DATE_EPOCH, 0o644
            tar.addfile(info, io.BytesIO(data))
    with target.open("wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=SOURCE_DATE_EPOCH) as gz:
        gz.write(raw.getvalue())
    target.chmod(0o644)
    return target


def fill_cache(cache: Path) -> dict:
    wheelhouse, cuda_wheels, tools = cache / "wheelhouse", cache / "cuda-wheels", cache / "tools"
    for d in (wheelhouse, cuda_wheels, tools, cache / "logs"):
        d.mkdir(parents=True, exist_ok=True)
    lock_meta = yaml.safe_load((LOCK / "lock.yml").read_text())
    started = time.monotonic()
    pip_download(LOCK / "requirements.txt", wheelhouse, str(lock_meta["python_version"]))
    update_locks.fetch_uv_wheel(wheelhouse)
    sdist = build_sdist(KERNEL_SRC, wheelhouse)
    # the cuda_toolkit role's pinned 13.0 compiler wheels, and cuobjdump (a tool of this controller)
    known = yaml.safe_load(CUDA_VARS.read_text())["cuda_toolkit_known_wheel_sets"][CUDA_VERSION]
    for dest, lines in (
        (cuda_wheels, [f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}" for w in known]),
        (tools, [f"{CUOBJDUMP[0]}=={CUOBJDUMP[1]} --hash=sha256:{CUOBJDUMP[2]}"]),
    ):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
            req.write("\n".join(lines) + "\n")
        try:
            pip_download(Path(req.name), dest, "3.11")
        finally:
            os.unlink(req.name)
    with zipfile.ZipFile(next(tools.glob("nvidia_cuda_cuobjdump-*.whl"))) as zf:
        member = next(n for n in zf.namelist() if n.endswith("/bin/cuobjdump"))
        (tools / "cuobjdump").write_bytes(zf.read(member))
    (tools / "cuobjdump").chmod(0o755)
    size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and "logs" not in p.parts)
    return {
        "sdist": str(sdist),
        "sdist_sha256": update_locks.sha256(sdist),
        "cache_bytes": size,
        "cache_seconds": round(time.monotonic() - started, 1),
    }


def kernel_tag() -> str:
    sys.path.insert(0, str(ROOT / "collections"))  # the checkout as gpufleet.fleet (make collections links it)
    from ansible_collections.gpufleet.fleet.plugins.filter import ml_env_filters

    lock_meta = yaml.safe_load((LOCK / "lock.yml").read_text())
    torch = ml_env_filters.parse_lock((LOCK / "requirements.txt").read_text())["packages"]["torch"]
    return ml_env_filters.kernel_tag(CUDA_VERSION, ARCHS, torch, str(lock_meta["python_version"]))


def lab_cmd(lab: str, *args: str, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "lab"))
    log(f"+ gpufleet_lab --name {lab} {' '.join(args)}")
    argv = [sys.executable, "-m", "gpufleet_lab", "--name", lab, *args]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=capture, text=True, check=check)


def inspect_wheel(wheel: Path, cuobjdump: Path, out_dir: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        so_names = [n for n in zf.namelist() if n.endswith(".so")]
        if not so_names:
            raise SystemExit(f"{wheel.name} holds no shared object")
        so_path = out_dir / Path(so_names[0]).name
        so_path.write_bytes(zf.read(so_names[0]))
    elf = subprocess.run([cuobjdump, "--list-elf", so_path], capture_output=True, text=True, check=True).stdout
    ptx = subprocess.run([cuobjdump, "--list-ptx", so_path], capture_output=True, text=True, check=False)
    # --dump-sass needs nvdisasm, which the cuobjdump wheel lacks; the resource usage names each kernel per arch
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", so_path], capture_output=True, text=True, check=True)
    sass = usage.stdout
    (out_dir / "cuobjdump-list-elf.txt").write_text(elf)
    (out_dir / "cuobjdump-dump-resource-usage.txt").write_text(sass)
    archs = sorted(set(re.findall(r"\.(sm_\d+)\.cubin", elf)), key=lambda a: int(a[3:]))
    return {
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
        "wheel_sha256": update_locks.sha256(wheel),
        "shared_object": so_names[0],
        "shared_object_bytes": so_path.stat().st_size,
        "elf_archs": archs,
        "list_elf": elf.strip().splitlines(),
        "list_ptx": (ptx.stdout + ptx.stderr).strip().splitlines(),
        "resource_usage": [line.strip() for line in sass.splitlines() if line.strip().startswith(("arch", "Function"))],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("REAL_KERNEL_CACHE") or DEFAULT_CACHE))
    parser.add_argument("--lab", default="realkernel", help="name of the one-host lab (default %(default)s)")
    parser.add_argument("--profile", default="h200x2-vm", help="GPU profile of the lab host")
    parser.add_argument("--reuse", action="store_true", help="keep an earlier wheel of the tag (then nothing compiles)")
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab up afterwards")
    args = parser.parse_args(argv)
    cache = args.cache.resolve()
    summary: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cache": str(cache)}
    summary.update(fill_cache(cache))
    tag = kernel_tag()
    kernel_dir = cache / "wheelhouse" / "kernels" / tag
    summary["kernel_tag"] = tag
    if not args.reuse and kernel_dir.exists():
        shutil.rmtree(kernel_dir)
    inventory = cache / "inventory.yml"
    lab_up = False
    try:
        started = time.monotonic()
        out = lab_cmd(
            args.lab,
            "up",
            "--hosts",
            "1",
            "--profile",
            args.profile,
            "--inventory",
            str(inventory),
            "--json",
            capture=True,
        ).stdout
        lab_up = True
        host = json.loads(out)["hosts"][0]["name"]
        summary["lab_up_seconds"] = round(time.monotonic() - started, 1)
        env = dict(
            os.environ,
            ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
            ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
            ANSIBLE_FORCE_COLOR="0",
        )
        started = time.monotonic()
        lines: list[str] = []
        with (cache / "logs" / "ansible.log").open("w") as ansible_log:
            proc = subprocess.Popen(
                [
                    shutil.which(
                        "ansible-playbook", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
                    ),
                    "-i",
                    str(inventory),
                    str(PLAYBOOK),
                    "-e",
                    f"real_kernel_cache={cache}",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for line in proc.stdout:  # streamed: the run takes minutes
                ansible_log.write(line)
                sys.stderr.write(line)
                lines.append(line.rstrip("\n"))
            proc.wait()
        summary["playbook_seconds"] = round(time.monotonic() - started, 1)
        summary["playbook_rc"] = proc.returncode
        summary["play_recap"] = [line for line in lines if " : ok=" in line]
        build_log = lab_cmd(
            args.lab,
            "exec",
            host,
            "--",
            "sh",
            "-c",
            f"cat /opt/ml-env/logs/build-{tag}-{KERNEL_NAME}.log",
            capture=True,
            check=False,
        ).stdout
        (cache / "logs" / "build.log").write_text(build_log)
        summary["nvcc_lines"] = [line.strip()[:400] for line in build_log.splitlines() if "/bin/nvcc " in line][:4]
        summary["build_host"] = {
            k: lab_cmd(args.lab, "exec", host, "--", "sh", "-c", cmd, capture=True, check=False).stdout.strip()
            for k, cmd in {
                "nvcc": "/usr/local/cuda-13.0/bin/nvcc --version | tail -2",
                "gxx": "g++ --version | head -1",
                "nproc_memtotal": "nproc; grep MemTotal /proc/meminfo",
                "release_import": "/opt/ml-env/current/bin/python -c 'import torch, gpufleet_axpy; "
                "print(torch.__version__, torch.version.cuda, gpufleet_axpy._C.__file__)'",
            }.items()
        }
        if proc.returncode != 0:
            raise SystemExit(f"the playbook failed (rc {proc.returncode}); log: {cache / 'logs' / 'ansible.log'}")
    finally:
        if lab_up and not args.keep_lab:
            lab_cmd(args.lab, "down")
    wheels = sorted(kernel_dir.glob("gpufleet_axpy-*.whl"))
    if not wheels:
        raise SystemExit(f"no gpufleet-axpy wheel in {kernel_dir}")
    summary.update(inspect_wheel(wheels[0], cache / "tools" / "cuobjdump", cache / "logs"))
    (cache / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    missing = {f"sm_{a}" for a in ARCHS} - set(summary["elf_archs"])
    if missing:
        print(f"FAIL: no machine code for {', '.join(sorted(missing))} in {wheels[0].name}", file=sys.stderr)
        return 1
    print(f"OK: {wheels[0].name} holds SASS for {', '.join(summary['elf_archs'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
