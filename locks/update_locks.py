"""Build the lab wheelhouse and (re)write the ml-env locks of gpufleet.

Each lock is a directory ``locks/<name>/`` with ``requirements.in`` (what we ask for), ``lock.yml``
(Python version, target platform, indexes, resolution date, modules to verify) and
``requirements.txt`` (the hashed lock, written by ``uv pip compile --generate-hashes``; never edit it).

  python locks/update_locks.py wheelhouse [--dir DIR]   # lab wheelhouse: sglang-sim + PyYAML wheels, uv wheel
  python locks/update_locks.py sim-wheels --dir DIR     # the sglang-sim wheel and the wheel of its dependency
  python locks/update_locks.py lab                      # rebuild the wheelhouse, rewrite locks/lab-sim
  python locks/update_locks.py production [--name sglang-cu128] [--exclude-newer DATE]
  python locks/update_locks.py check-lab                # the lab lock still matches a fresh wheel build
  python locks/update_locks.py wheelhouse-production [--name sglang-cu128] [--dir DIR]   # production wheels

The sglang-sim wheel is built reproducibly (fixed SOURCE_DATE_EPOCH, pinned setuptools, sources
copied with fixed modes), so its hash in locks/lab-sim/requirements.txt is stable until the simulator's
sources change; then ``lab`` writes the new hash. Needs ``uv`` on PATH (the project's toolchain has it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import yaml

LOCKS = Path(__file__).resolve().parent
ROOT = LOCKS.parent
SIM_SRC = ROOT / "lab" / "sglang-sim"
DEFAULT_WHEELHOUSE = ROOT / ".cache" / "ml-env" / "wheelhouse-lab"
# Fixed build inputs of the sglang-sim wheel (its hash is in the lab lock).
SOURCE_DATE_EPOCH = "1764374400"  # 2025-11-29T00:00:00Z
BUILD_CONSTRAINTS = LOCKS / "lab-sim" / "build-constraints.txt"
# uv for the hosts, from PyPI (the static binary is in the wheel); the role installs it from the wheelhouse.
UV_VERSION = "0.13.9"
UV_WHEEL = f"uv-{UV_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
UV_WHEEL_SHA256 = "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"
UV_WHEEL_URL = (
    "https://files.pythonhosted.org/packages/3d/aa/"
    "26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/" + UV_WHEEL
)
# The simulator's one dependency (lab/sglang-sim/pyproject.toml: PyYAML, for --config), PyPI's wheel for CPython
# 3.11 on x86_64 manylinux: the lab lock's Python and Debian 12's python3 on the lab hosts (the same file and hash
# as in uv.lock and locks/smg). ml_env installs it from the lab wheelhouse (the lab lock pins it, via sglang-sim);
# where tests install the simulator without ml_env it is unpacked next to the sglang-sim wheel (sim_wheels).
PYYAML_WHEEL = "pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl"
PYYAML_WHEEL_SHA256 = "622aa875fa6533f25fedcffe23079357d65a690d462200afed5d8e9d0e01ebee"
PYYAML_WHEEL_URL = (
    "https://files.pythonhosted.org/packages/9d/3e/"
    "c1c307b6c03e4ea7d86f166f14920ead07aecc35e88d873814d12aa2da66/" + PYYAML_WHEEL
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+ " + " ".join(str(a) for a in argv), file=sys.stderr, flush=True)
    return subprocess.run([str(a) for a in argv], check=True, **kwargs)


def build_sim_wheel(out_dir: Path) -> Path:
    """Build sglang_sim-*.whl reproducibly into out_dir; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ml-env-sim-") as tmp:
        src = Path(tmp) / "sglang-sim"
        for path in sorted(SIM_SRC.rglob("*")):
            rel = path.relative_to(SIM_SRC)
            if (
                path.is_dir()
                or rel.parts[0] in ("build", "dist")
                or any(p.endswith(".egg-info") or p == "__pycache__" for p in rel.parts)
            ):
                continue
            if path.suffix == ".pyc" or rel.name == ".gitignore":
                continue
            dest = src / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            dest.chmod(0o644)
            os.utime(dest, (int(SOURCE_DATE_EPOCH), int(SOURCE_DATE_EPOCH)))
        built = Path(tmp) / "dist"
        env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
        run(
            ["uv", "build", "--wheel", "--quiet", "--build-constraint", BUILD_CONSTRAINTS, "-o", built, src],
            env=env,
        )
        wheels = sorted(built.glob("sglang_sim-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"expected one sglang_sim wheel, got {wheels}")
        target = out_dir / wheels[0].name
        shutil.copyfile(wheels[0], target)
        target.chmod(0o644)
        return target


def _copy_into(src: Path, target: Path) -> None:
    """Copy under a private name, then rename: labs and scenarios running at once fill the same cache."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def fetch_pinned_wheel(out_dir: Path, name: str, digest: str, url: str) -> Path:
    """A wheel checked against its pinned sha256, from out_dir, the lab wheelhouse (a cache) or its URL."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / name
    if target.exists() and sha256(target) == digest:
        return target
    cached = DEFAULT_WHEELHOUSE / name
    if cached != target and cached.exists() and sha256(cached) == digest:
        _copy_into(cached, target)
        return target
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=out_dir)
    tmp = Path(tmp_name)
    print(f"downloading {url}", file=sys.stderr, flush=True)
    with urllib.request.urlopen(url, timeout=120) as response, os.fdopen(fd, "wb") as handle:
        shutil.copyfileobj(response, handle)
    got = sha256(tmp)
    if got != digest:
        tmp.unlink()
        raise SystemExit(f"{name}: sha256 {got} is not the pinned {digest}")
    tmp.chmod(0o644)
    os.replace(tmp, target)
    if target != cached:
        cached.parent.mkdir(parents=True, exist_ok=True)
        _copy_into(target, cached)
    return target


def fetch_uv_wheel(out_dir: Path) -> Path:
    """The uv wheel (checked against its pinned sha256), from a cache or PyPI."""
    return fetch_pinned_wheel(out_dir, UV_WHEEL, UV_WHEEL_SHA256, UV_WHEEL_URL)


def fetch_pyyaml_wheel(out_dir: Path) -> Path:
    """The PyYAML wheel the simulator needs (checked against its pinned sha256), from a cache or PyPI."""
    return fetch_pinned_wheel(out_dir, PYYAML_WHEEL, PYYAML_WHEEL_SHA256, PYYAML_WHEEL_URL)


def sim_wheels(out_dir: Path) -> list[Path]:
    """The simulator as wheels for a lab host's Python 3.11: the sglang-sim wheel and its dependency's (PyYAML).
    Tests that install it without ml_env unpack both into one site-packages (``python -m zipfile -e``). The sim
    wheel comes last: Molecule's prepare steps take it as the sign that the directory is complete (``creates``)."""
    pyyaml = fetch_pyyaml_wheel(out_dir)
    return [build_sim_wheel(out_dir), pyyaml]


# Small pure-Python wheels from PyPI for the lab wheelhouse (lab hosts install from the wheelhouse only).
LAB_PYPI_WHEELS = [("packaging", "25.0")]


def fetch_pypi_wheel(out_dir: Path, name: str, version: str) -> Path:
    """A py3-none-any wheel of name==version from PyPI's simple JSON API, checked against its sha256."""
    request = urllib.request.Request(
        f"https://pypi.org/simple/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    prefix = f"{name}-{version}-"
    wanted = [f for f in files if f["filename"].startswith(prefix) and f["filename"].endswith("-none-any.whl")]
    if not wanted:
        raise SystemExit(f"PyPI has no py3-none-any wheel of {name}=={version}")
    entry = wanted[0]
    target = out_dir / entry["filename"]
    if target.exists() and sha256(target) == entry["hashes"]["sha256"]:
        return target
    with urllib.request.urlopen(entry["url"], timeout=120) as response:
        target.write_bytes(response.read())
    if sha256(target) != entry["hashes"]["sha256"]:
        target.unlink()
        raise SystemExit(f"{entry['filename']}: sha256 differs from PyPI's")
    return target


def cmd_wheelhouse(args) -> int:
    out = Path(args.dir).resolve()
    sim = sim_wheels(out)
    uv = fetch_uv_wheel(out)
    extra = [fetch_pypi_wheel(out, name, version) for name, version in LAB_PYPI_WHEELS]
    for wheel in (*sim, uv, *extra):
        print(f"{wheel}  sha256:{sha256(wheel)}")
    return 0


def cmd_sim_wheels(args) -> int:
    for wheel in sim_wheels(Path(args.dir).resolve()):
        print(wheel)
    return 0


# ---- Production wheelhouse: every wheel of a hashed lock for its target (Python, platform), from PyPI ----
# One wheelhouse per lock (a lane's wheels never mix with another's, nor its manifest): wheelhouse-<lock name>.
PROD_WHEELHOUSE_ROOT = Path("/var/cache/gpufleet-lab")


def lock_pins(lock_dir: Path) -> list[tuple[str, str, set[str]]]:
    """[(name, version, {sha256...})] of a lock written by `uv pip compile --generate-hashes`."""
    pins: list[tuple[str, str, set[str]]] = []
    logical = " ".join(
        line.split("#", 1)[0].rstrip().removesuffix("\\") if not line.lstrip().startswith("--hash") else line.strip()
        for line in (lock_dir / "requirements.txt").read_text().splitlines()
    )
    for token in logical.split():
        if token.startswith("--hash=sha256:"):
            pins[-1][2].add(token.removeprefix("--hash=sha256:"))
        elif "==" in token:
            name, version = token.split("==", 1)
            pins.append((name, version, set()))
    return pins


def target_tags(python_version: str, python_platform: str) -> list:
    """Wheel tags a host of the lock's target accepts, best first (CPython, manylinux x86_64)."""
    from packaging import tags

    major, minor = (int(x) for x in python_version.split(".")[:2])
    arch, _sep, plat = python_platform.partition("-")
    if not plat.startswith("manylinux_2_"):
        raise SystemExit(f"unsupported python_platform {python_platform} (expected <arch>-manylinux_2_<N>)")
    glibc = int(plat.removeprefix("manylinux_2_"))
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    platforms += [f"{legacy[m]}_{arch}" for m in (17, 12, 5) if m <= glibc]
    abi = f"cp{major}{minor}"
    return [
        *tags.cpython_tags((major, minor), abis=[abi, "abi3", "none"], platforms=platforms),
        *tags.compatible_tags((major, minor), abi, platforms),
    ]


def choose_wheel(files: list[dict], name: str, version: str, hashes: set[str], ranked: dict) -> dict | None:
    """The PyPI file entry of the best wheel of name==version for the target, among the lock's hashes."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    best = None
    for entry in files:
        fname = entry["filename"]
        if not fname.endswith(".whl") or entry.get("hashes", {}).get("sha256") not in hashes:
            continue
        try:
            wname, wversion, _unused, wtags = parse_wheel_filename(fname)
        except InvalidWheelFilename:
            continue
        if canonicalize_name(wname) != canonicalize_name(name) or str(wversion) != str(version):
            continue
        rank = min((ranked[t] for t in wtags if t in ranked), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, entry)
    return best[1] if best else None


def _pypi_files(name: str) -> list[dict]:
    request = urllib.request.Request(
        f"https://pypi.org/simple/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["files"]


def _download(entry: dict, out: Path, known: dict | None = None) -> tuple[Path, bool]:
    """Fetch one wheel, checked against its sha256; a file already there is kept when its size matches and
    its sha256 does (read again, or taken from the manifest of an earlier verified download: `known`)."""
    target = out / entry["filename"]
    want = entry["hashes"]["sha256"]
    same_size = target.exists() and target.stat().st_size == entry.get("size", target.stat().st_size)
    if same_size and ((known or {}).get(target.name) == (target.stat().st_size, want) or sha256(target) == want):
        return target, False
    tmp = target.with_name(target.name + ".part")
    with urllib.request.urlopen(entry["url"], timeout=300) as response, tmp.open("wb") as handle:
        shutil.copyfileobj(response, handle, 1 << 20)
    got = sha256(tmp)
    if got != want:
        tmp.unlink()
        raise SystemExit(f"{entry['filename']}: sha256 {got} is not the lock's {want}")
    tmp.rename(target)
    target.chmod(0o644)
    return target, True


def cmd_wheelhouse_production(args) -> int:
    """Download every pinned wheel of a production lock for its target into a (cached) wheelhouse."""
    from concurrent.futures import ThreadPoolExecutor

    lock_dir = LOCKS / args.name
    meta = yaml.safe_load((lock_dir / "lock.yml").read_text())
    out = Path(args.dir or PROD_WHEELHOUSE_ROOT / f"wheelhouse-{args.name}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    lock_sha = sha256(lock_dir / "requirements.txt")
    manifest_path = out / "wheelhouse.json"
    if manifest_path.exists() and not args.verify:
        old = json.loads(manifest_path.read_text())
        complete = (
            all((out / w["file"]).exists() and (out / w["file"]).stat().st_size == w["size"] for w in old["wheels"])
            and (out / old["uv_wheel"]).exists()
        )
        if old.get("lock_sha256") == lock_sha and complete:
            print(f"{out}: complete for lock {args.name} ({old['total_bytes'] / 2**30:.2f} GiB), nothing to fetch")
            return 0
    ranked = {t: i for i, t in enumerate(target_tags(meta["python_version"], meta["python_platform"]))}
    pins = lock_pins(lock_dir)
    with ThreadPoolExecutor(max_workers=8) as pool:
        listings = list(pool.map(lambda pin: _pypi_files(pin[0]), pins))
    chosen, missing = [], []
    for (name, version, hashes), files in zip(pins, listings, strict=True):
        entry = choose_wheel(files, name, version, hashes, ranked)
        if entry is None:
            missing.append(f"{name}=={version}")
        else:
            chosen.append(entry)
    if missing:
        raise SystemExit(
            f"no wheel with a locked hash for Python {meta['python_version']} on {meta['python_platform']}: "
            + ", ".join(missing)
        )
    known = {}
    if manifest_path.exists() and not args.verify:
        known = {w["file"]: (w["size"], w["sha256"]) for w in json.loads(manifest_path.read_text())["wheels"]}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda entry: _download(entry, out, known), chosen))
    uv = fetch_uv_wheel(out)
    manifest = {
        "lock": args.name,
        "lock_sha256": lock_sha,
        "python_version": meta["python_version"],
        "python_platform": meta["python_platform"],
        "wheels": [
            {"file": path.name, "size": path.stat().st_size, "sha256": entry["hashes"]["sha256"]}
            for (path, _unused), entry in zip(results, chosen, strict=True)
        ],
        "uv_wheel": uv.name,
    }
    manifest["total_bytes"] = sum(w["size"] for w in manifest["wheels"]) + uv.stat().st_size
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    fetched = sum(1 for _unused, new in results if new)
    print(
        f"{out}: {len(results)} wheels of lock {args.name} + uv ({manifest['total_bytes'] / 2**30:.2f} GiB), "
        f"{fetched} downloaded now, {len(results) - fetched} already there"
    )
    return 0


# Other locks over the lab wheelhouse, rewritten by `lab` too: the lab's CUDA 13 lane (the same simulator wheel; its
# lock.yml says which engine version the simulator emulates there) and Molecule's second lock of role ml_env.
LAB_EXTRA_LOCKS = [
    LOCKS / "lab-sim-cu130",
    ROOT / "roles" / "ml_env" / "molecule" / "default" / "locks" / "lab-sim-next",
]


def compile_lock(name: str, find_links: Path | None = None, exclude_newer: str | None = None) -> Path:
    lock_dir = LOCKS / name
    meta = yaml.safe_load((lock_dir / "lock.yml").read_text())
    out = lock_dir / "requirements.txt"
    argv = [
        "uv",
        "pip",
        "compile",
        lock_dir / "requirements.in",
        "--generate-hashes",
        "--python-version",
        meta["python_version"],
        "--python-platform",
        meta["python_platform"],
        "--custom-compile-command",
        f"python locks/update_locks.py {'lab' if find_links else 'production --name ' + Path(name).name}",
        "--quiet",
        "-o",
        out,
    ]
    if meta.get("index_url"):
        argv += ["--index-url", meta["index_url"]]
    else:
        argv += ["--no-index"]
    for url in meta.get("extra_index_urls") or []:
        argv += ["--extra-index-url", url]
    if find_links:
        # --no-cache: uv caches the hash of a local wheel by its name; a rebuilt wheel must be read again
        argv += ["--find-links", find_links, "--no-cache"]
        # and an existing lock would be kept as a preference, old hash included
        out.unlink(missing_ok=True)
    newer = exclude_newer or meta.get("exclude_newer")
    if newer:
        argv += ["--exclude-newer", str(newer)]
    env = dict(os.environ, UV_NO_CONFIG="1")
    run(argv, env=env, cwd=ROOT)
    return out


def cmd_lab(args) -> int:
    out = Path(args.dir).resolve()
    sim_wheels(out)
    fetch_uv_wheel(out)
    for name, version in LAB_PYPI_WHEELS:
        fetch_pypi_wheel(out, name, version)
    print(compile_lock("lab-sim", find_links=out))
    for extra in LAB_EXTRA_LOCKS:
        print(compile_lock(str(extra), find_links=out))
    return 0


def cmd_production(args) -> int:
    if args.exclude_newer:
        meta_path = LOCKS / args.name / "lock.yml"
        text = meta_path.read_text()
        meta = yaml.safe_load(text)
        old = str(meta.get("exclude_newer"))
        meta_path.write_text(text.replace(f"exclude_newer: {old}", f"exclude_newer: {args.exclude_newer}"))
    print(compile_lock(args.name))
    return 0


def cmd_check_lab(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_sim_wheel(Path(tmp))
        digest = sha256(wheel)
    stale = [
        str(path.relative_to(ROOT))
        for path in [LOCKS / "lab-sim" / "requirements.txt", *(d / "requirements.txt" for d in LAB_EXTRA_LOCKS)]
        if digest not in path.read_text()
    ]
    if stale:
        print(
            f"{', '.join(stale)} do(es) not hold the hash of a fresh {wheel.name} ({digest}): "
            "the simulator's sources changed; run `python locks/update_locks.py lab`",
            file=sys.stderr,
        )
        return 1
    print(f"lab lock matches {wheel.name} sha256:{digest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("wheelhouse", cmd_wheelhouse), ("lab", cmd_lab)):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=str(DEFAULT_WHEELHOUSE), help="wheelhouse directory (default %(default)s)")
        p.set_defaults(func=func)
    p = sub.add_parser("sim-wheels", help="the sglang-sim wheel and the PyYAML wheel it needs, into --dir")
    p.add_argument("--dir", required=True, help="output directory")
    p.set_defaults(func=cmd_sim_wheels)
    p = sub.add_parser("production")
    p.add_argument("--name", default="sglang-cu128")
    p.add_argument("--exclude-newer", help="resolve as of this date (RFC 3339); recorded in lock.yml")
    p.set_defaults(func=cmd_production)
    p = sub.add_parser("wheelhouse-production", help="download a production lock's wheels (cached wheelhouse)")
    p.add_argument("--name", default="sglang-cu128")
    p.add_argument("--dir", help=f"wheelhouse directory (default {PROD_WHEELHOUSE_ROOT}/wheelhouse-<name>)")
    p.add_argument("--jobs", type=int, default=4, help="parallel downloads")
    p.add_argument("--verify", action="store_true", help="read every cached wheel again (default: trust the manifest)")
    p.set_defaults(func=cmd_wheelhouse_production)
    p = sub.add_parser("check-lab")
    p.set_defaults(func=cmd_check_lab)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
