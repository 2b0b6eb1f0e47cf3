"""Repack NVIDIA's CUDA 12.8 wheels as Debian packages laid out like NVIDIA's, and index and sign them."""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from cuda_mirror.wheels import MirrorError

CUDA_HOME = "usr/local/cuda-12.8"
TARGET = f"{CUDA_HOME}/targets/x86_64-linux"
MAINTAINER = "gpufleet lab <cuda-mirror@gpufleet-lab.invalid>"
KEY_UID = "gpufleet lab CUDA mirror (lab equipment, not NVIDIA) <cuda-mirror@gpufleet-lab.invalid>"
KEY_FILE_NAME = "gpufleet-lab-cuda.asc"
# Versions of cuda-toolkit-12-8 in the mirror: NVIDIA numbers the metapackage by toolkit release
# (12.8.0-1 = GA, 12.8.1-1 = Update 1). Two are published so a pin to the older one is visible.
TOOLKIT_VERSIONS = ("12.8.0-1", "12.8.1-1")

NVCC_STANDIN = """#!/bin/sh
# gpufleet lab stand-in for nvcc (CUDA 12.8). PyPI has no CUDA 12.8 nvcc, so the lab mirror's
# cuda-nvcc-12-8 carries NVIDIA's real ptxas, libnvvm and libdevice plus this script, which only
# reports the version in nvcc's format. It cannot compile: use bin/ptxas (PTX -> cubin) or NVRTC.
case " $* " in
  *" --version "*|*" -V "*)
    cat <<'VERSION'
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
gpufleet lab stand-in: not NVIDIA's nvcc, it only reports this version (ptxas, libnvvm, NVRTC are NVIDIA's)
VERSION
    exit 0 ;;
esac
echo "nvcc: gpufleet lab stand-in, cannot compile (PyPI has no CUDA 12.8 nvcc); use ptxas or NVRTC" >&2
exit 1
"""

STANDIN_README = """This CUDA 12.8 tree comes from the gpufleet lab CUDA mirror (lab equipment, not NVIDIA's repo).
NVIDIA's real files, repacked from PyPI wheels: bin/ptxas 12.8.93, nvvm/ (libnvvm, libdevice),
headers, libcudart.so.12 (12.8.90), libnvrtc.so.12 (12.8.93).
Stand-in: bin/nvcc only reports "release 12.8" and says it is a lab stand-in; it cannot compile.
"""


@dataclass
class Package:
    name: str
    version: str
    description: str
    depends: list[str] = field(default_factory=list)
    # (wheel distribution, member path inside the wheel, destination path below the package root)
    files: list[tuple[str, str, str]] = field(default_factory=list)
    texts: dict[str, tuple[str, int]] = field(default_factory=dict)  # dest -> (content, mode)
    links: dict[str, str] = field(default_factory=dict)  # link path -> target

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_amd64.deb"


def _wheel_tree(wheel: Path, top: str) -> list[tuple[str, str]]:
    """(member, path relative to top) of every regular file under top/ in a wheel."""
    with zipfile.ZipFile(wheel) as zf:
        return [
            (m, m[len(top) + 1 :])
            for m in zf.namelist()
            if m.startswith(top + "/") and not m.endswith("/") and not m.endswith("__init__.py")
        ]


def _library_and_dev(
    lib: str,
    version: str,
    depends: list[str],
    libs: list[tuple[str, str, str]],
    headers: list[tuple[str, str, str]],
    description: str,
    dev_description: str,
) -> list[Package]:
    """A library split as NVIDIA packages it: cuda-<lib>-12-8 (lib<lib>.so.12) and cuda-<lib>-dev-12-8 (the headers
    and the lib<lib>.so development link), which depends on that exact version of the first."""
    library = Package(f"cuda-{lib}-12-8", version, description, depends=depends, files=libs)
    dev = Package(
        f"cuda-{lib}-dev-12-8",
        version,
        dev_description,
        depends=[f"{library.name} (= {version})"],
        files=headers,
        links={f"{TARGET}/lib/lib{lib}.so": f"lib{lib}.so.12"},
    )
    return [library, dev]


def plan(wheels: dict[str, Path]) -> list[Package]:
    """The packages of the mirror, with each wheel member mapped to its place in /usr/local/cuda-12.8."""
    nvcc, rt, nvrtc = (
        wheels[n] for n in ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvrtc-cu12")
    )
    common = Package(
        "cuda-toolkit-12-8-config-common",
        "12.8.90-1",
        "CUDA 12.8 tree layout (gpufleet lab stand-in)",
        texts={
            f"{CUDA_HOME}/version.json": (
                json.dumps(
                    {
                        "cuda": {"name": "CUDA SDK", "version": "12.8.1"},
                        "cuda_nvcc": {"name": "CUDA NVCC", "version": "12.8.93"},
                        "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": "12.8.90"},
                        "cuda_nvrtc": {"name": "CUDA NVRTC", "version": "12.8.93"},
                        "gpufleet_lab": "stand-in tree built from PyPI wheels; bin/nvcc is a stand-in",
                    },
                    indent=2,
                )
                + "\n",
                0o644,
            ),
            f"{CUDA_HOME}/GPUFLEET-LAB-STANDIN.txt": (STANDIN_README, 0o644),
        },
        links={
            f"{CUDA_HOME}/include": "targets/x86_64-linux/include",
            f"{CUDA_HOME}/lib64": "targets/x86_64-linux/lib",
        },
    )
    nvcc_files = [
        ("nvcc", m, f"{CUDA_HOME}/bin/ptxas") for m, rel in _wheel_tree(nvcc, "nvidia/cuda_nvcc/bin") if rel == "ptxas"
    ]
    nvcc_files += [("nvcc", m, f"{CUDA_HOME}/nvvm/{rel}") for m, rel in _wheel_tree(nvcc, "nvidia/cuda_nvcc/nvvm")]
    nvcc_files += [("nvcc", m, f"{TARGET}/include/{rel}") for m, rel in _wheel_tree(nvcc, "nvidia/cuda_nvcc/include")]
    rt_headers = [("rt", m, f"{TARGET}/include/{rel}") for m, rel in _wheel_tree(rt, "nvidia/cuda_runtime/include")]
    rt_libs = [
        ("rt", m, f"{TARGET}/lib/{rel}")
        for m, rel in _wheel_tree(rt, "nvidia/cuda_runtime/lib")
        if rel.startswith("libcudart.so")
    ]
    nvrtc_libs = [
        ("nvrtc", m, f"{TARGET}/lib/{rel}")
        for m, rel in _wheel_tree(nvrtc, "nvidia/cuda_nvrtc/lib")
        if ".alt." not in rel
    ]
    nvrtc_headers = [
        ("nvrtc", m, f"{TARGET}/include/{rel}") for m, rel in _wheel_tree(nvrtc, "nvidia/cuda_nvrtc/include")
    ]
    cfg = f"cuda-toolkit-12-8-config-common (>= {common.version})"
    packages = [
        common,
        Package(
            "cuda-nvcc-12-8",
            "12.8.93-1",
            "CUDA 12.8 compiler pieces: NVIDIA's ptxas, libnvvm, libdevice, crt headers; stand-in nvcc",
            depends=[cfg],
            files=nvcc_files,
            texts={f"{CUDA_HOME}/bin/nvcc": (NVCC_STANDIN, 0o755)},
        ),
        *_library_and_dev(
            "cudart",
            "12.8.90-1",
            [cfg],
            rt_libs,
            rt_headers,
            "CUDA 12.8 runtime library (NVIDIA's libcudart.so.12)",
            "CUDA 12.8 runtime headers and development link",
        ),
        *_library_and_dev(
            "nvrtc",
            "12.8.93-1",
            [cfg],
            nvrtc_libs,
            nvrtc_headers,
            "CUDA 12.8 runtime compiler (NVIDIA's libnvrtc.so.12)",
            "CUDA 12.8 NVRTC header and development link",
        ),
    ]
    for version in TOOLKIT_VERSIONS:
        packages.append(
            Package(
                "cuda-toolkit-12-8",
                version,
                "CUDA Toolkit 12.8 metapackage (gpufleet lab stand-in)",
                depends=[
                    "cuda-nvcc-12-8 (>= 12.8.93)",
                    "cuda-cudart-dev-12-8 (>= 12.8.90)",
                    "cuda-nvrtc-dev-12-8 (>= 12.8.93)",
                ],
            )
        )
    return packages


def _control(pkg: Package, installed_kib: int) -> str:
    lines = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        "Architecture: amd64",
        f"Maintainer: {MAINTAINER}",
        f"Installed-Size: {installed_kib}",
    ]
    if pkg.depends:
        lines.append(f"Depends: {', '.join(pkg.depends)}")
    lines += [
        "Section: devel",
        "Priority: optional",
        f"Description: {pkg.description}",
        " gpufleet lab equipment: built from NVIDIA's CUDA wheels on PyPI by lab/cuda_mirror,",
        " laid out like NVIDIA's cuda repository packages. Not for production use.",
    ]
    return "\n".join(lines) + "\n"


def build_deb(pkg: Package, wheels: dict[str, Path], work: Path, out_dir: Path) -> Path:
    """Build one .deb with dpkg-deb (root-owned files, gzip for speed)."""
    keys = {"nvcc": "nvidia-cuda-nvcc-cu12", "rt": "nvidia-cuda-runtime-cu12", "nvrtc": "nvidia-cuda-nvrtc-cu12"}
    root = work / pkg.name / pkg.version
    shutil.rmtree(root, ignore_errors=True)
    (root / "DEBIAN").mkdir(parents=True)
    size = 0
    by_wheel: dict[str, list[tuple[str, str]]] = {}
    for key, member, dest in pkg.files:
        by_wheel.setdefault(keys[key], []).append((member, dest))
    for dist, items in by_wheel.items():
        with zipfile.ZipFile(wheels[dist]) as zf:
            for member, dest in items:
                target = root / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                executable = dest.endswith("/bin/ptxas") or ".so" in Path(dest).name
                os.chmod(target, 0o755 if executable else 0o644)
                size += target.stat().st_size
    for dest, (text, mode) in pkg.texts.items():
        target = root / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        os.chmod(target, mode)
        size += len(text)
    for link, target in pkg.links.items():
        path = root / link
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    for d in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
        os.chmod(d, 0o755)
    (root / "DEBIAN/control").write_text(_control(pkg, max(1, size // 1024)))
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / pkg.filename
    env = dict(os.environ, SOURCE_DATE_EPOCH="1740000000")
    proc = subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z6", "--build", str(root), str(deb)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise MirrorError(f"dpkg-deb failed for {pkg.name}: {proc.stderr.strip()}")
    shutil.rmtree(root, ignore_errors=True)
    return deb


def _digests(path: Path) -> dict[str, str]:
    data = path.read_bytes()
    return {
        "MD5sum": hashlib.md5(data).hexdigest(),
        "SHA1": hashlib.sha1(data).hexdigest(),  # noqa: S324
        "SHA256": hashlib.sha256(data).hexdigest(),
    }


def write_index(repo: Path) -> None:
    """Packages, Packages.gz and Release of a flat repository (apt `Suites: /`), like NVIDIA's."""
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
        sums = _digests(deb)
        stanza = control.rstrip("\n").split("\n")
        # Filename/Size/digests go before Description (as apt-ftparchive writes them).
        at = next(i for i, line in enumerate(stanza) if line.startswith("Description:"))
        stanza[at:at] = [
            f"Filename: ./{deb.name}",
            f"Size: {deb.stat().st_size}",
            *(f"{k}: {v}" for k, v in sums.items()),
        ]
        stanzas.append("\n".join(stanza))
    packages = "\n\n".join(stanzas) + "\n"
    (repo / "Packages").write_text(packages)
    with gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages.encode())
    lines = [
        "Origin: gpufleet lab",
        "Label: gpufleet lab CUDA mirror (lab stand-in for NVIDIA's CUDA repository)",
        "Architectures: amd64",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        "Description: CUDA 12.8 packages repacked from NVIDIA's PyPI wheels (lab equipment)",
    ]
    for field_name, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(f"{field_name}:")
        for name in ("Packages", "Packages.gz"):
            data = (repo / name).read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>16} {name}")
    (repo / "Release").write_text("\n".join(lines) + "\n")


def _gpg(home: Path, *args: str) -> str:
    proc = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--yes", "--quiet", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise MirrorError(f"gpg {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def ensure_key(home: Path) -> str:
    """The lab signing key (generated once, cached with the mirror); returns its fingerprint."""
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    try:
        listing = _gpg(home, "--with-colons", "--list-secret-keys", KEY_UID)
    except MirrorError:
        listing = ""
    if "fpr:" not in listing:
        _gpg(home, "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        listing = _gpg(home, "--with-colons", "--list-secret-keys", KEY_UID)
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def sign(repo: Path, home: Path, fingerprint: str) -> None:
    """InRelease (clear-signed) and Release.gpg (detached) with the lab key; the public key beside them."""
    try:
        _gpg(home, "--local-user", fingerprint, "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
        _gpg(
            home,
            "--local-user",
            fingerprint,
            "--armor",
            "--detach-sign",
            "-o",
            str(repo / "Release.gpg"),
            str(repo / "Release"),
        )
        (repo / KEY_FILE_NAME).write_text(_gpg(home, "--armor", "--export", fingerprint))
    finally:
        # gpg started an agent for this home directory: stop exactly that one.
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)
