"""Build (or reuse) the whole lab CUDA mirror under the lab cache: apt repo, wheelhouse, runfile."""

from __future__ import annotations

import fcntl
import hashlib
import html
import json
import os
import shutil
from pathlib import Path

from cuda_mirror import packages, runfile, wheels

DISTROS = ("debian12", "ubuntu2204", "ubuntu2404")
REPO_REL = "compute/cuda/repos"  # the path layout of developer.download.nvidia.com


def default_cache() -> Path:
    return Path(os.environ.get("GPUFLEET_LAB_CACHE", "/var/cache/gpufleet-lab")) / "cuda-mirror"


def recipe_id() -> str:
    """Changes when the pins or the builders change, so a stale cached repo is rebuilt."""
    digest = hashlib.sha256()
    for wheel in (*wheels.CUDA_12_8, *wheels.CUDA_13_0):
        digest.update(f"{wheel.name}={wheel.version}:{wheel.sha256}\n".encode())
    here = Path(__file__).resolve().parent
    for name in ("packages.py", "runfile.py", "build.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def _wheelhouse_index(wheel_dir: Path) -> None:
    """index.html with #sha256= fragments (a PEP 503-style flat page), served instead of a bare listing."""
    rows = [
        f'<a href="{html.escape(p.name)}#sha256={wheels.sha256_of(p)}">{html.escape(p.name)}</a><br/>'
        for p in sorted(wheel_dir.glob("*.whl"))
    ]
    (wheel_dir / "index.html").write_text(
        "<!DOCTYPE html><html><head><title>gpufleet lab wheelhouse</title></head><body>\n"
        + "\n".join(rows)
        + "\n</body></html>\n"
    )


def ensure_built(cache: Path | None = None, index_url: str | None = None, log=print) -> dict:
    """Make the mirror complete and current under cache/www; returns its layout. Safe in parallel."""
    cache = cache or default_cache()
    www = cache / "www"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = cache / "built.json"
        rid = recipe_id()
        repo = www / REPO_REL / "debian12" / "x86_64"
        wheel_dir = www / "wheels"
        run_dir = www / "runfile"
        info = {
            "www": str(www),
            "repo_paths": {d: f"/{REPO_REL}/{d}/x86_64/" for d in DISTROS},
            "key_path": f"/{REPO_REL}/debian12/x86_64/{packages.KEY_FILE_NAME}",
            "wheelhouse_path": "/wheels/",
            "runfile_path": "/runfile/",
        }
        if stamp.exists() and json.loads(stamp.read_text()).get("recipe") == rid and (repo / "InRelease").exists():
            info.update(json.loads(stamp.read_text()), rebuilt=False)
            return info
        log(f"cuda-mirror: building the lab CUDA mirror (cached under {cache})")
        wheel_files = {}
        for wheel in (*wheels.CUDA_12_8, *wheels.CUDA_13_0):
            wheel_files[wheel.name] = wheels.fetch(wheel, wheel_dir, index_url, log=log)
        _wheelhouse_index(wheel_dir)
        new_repo = repo.with_name("x86_64.new")
        shutil.rmtree(new_repo, ignore_errors=True)
        for pkg in packages.plan(wheel_files):
            packages.build_deb(pkg, wheel_files, cache / "work", new_repo)
        packages.write_index(new_repo)
        fingerprint = packages.ensure_key(cache / "gnupg")
        packages.sign(new_repo, cache / "gnupg", fingerprint)
        shutil.rmtree(repo, ignore_errors=True)
        new_repo.rename(repo)
        for distro in DISTROS[1:]:  # the packages are distribution-neutral: same repo under each path
            link = www / REPO_REL / distro
            if not link.is_symlink():
                shutil.rmtree(link, ignore_errors=True)
                link.symlink_to("debian12")
        runfile.build(run_dir)
        shutil.rmtree(cache / "work", ignore_errors=True)
        record = {"recipe": rid, "key_fingerprint": fingerprint, "packages": sorted(p.name for p in repo.glob("*.deb"))}
        stamp.write_text(json.dumps(record, indent=2) + "\n")
        info.update(record, rebuilt=True)
        return info
