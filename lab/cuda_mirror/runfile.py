"""A stand-in CUDA ``.run`` installer (lab equipment) for the role's `runfile` method.

NVIDIA's runfiles are multi-GB self-extracting archives. This one is a few KiB: a POSIX shell header
and a tar.gz payload, honouring the options the role passes (``--silent --toolkit
--toolkitpath=DIR``) and refusing anything else. It installs a tiny tree whose ``bin/nvcc``
reports the release in nvcc's format and says it is a lab stand-in.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

HEADER = """#!/bin/sh
# gpufleet lab stand-in for NVIDIA's CUDA {release} runfile (lab equipment, not NVIDIA's installer).
# Honours: --silent --toolkit --toolkitpath=DIR (also accepts --no-man-page, --override, --tmpdir=DIR).
set -eu
silent=""; toolkit=""; toolkitpath="/usr/local/cuda-{release}"
for arg in "$@"; do
  case "$arg" in
    --silent) silent=1 ;;
    --toolkit) toolkit=1 ;;
    --toolkitpath=*) toolkitpath="${{arg#--toolkitpath=}}" ;;
    --no-man-page|--override|--tmpdir=*) ;;
    *) echo "cuda runfile (gpufleet lab stand-in): unsupported option $arg" >&2; exit 2 ;;
  esac
done
[ -n "$silent" ] || {{ echo "this lab stand-in only installs with --silent" >&2; exit 2; }}
[ -n "$toolkit" ] || {{ echo "nothing selected: pass --toolkit (the stand-in has no driver)" >&2; exit 2; }}
mkdir -p "$toolkitpath"
tail -n +{skip} "$0" | tar -xzf - -C "$toolkitpath" --no-same-owner
echo "CUDA {release} toolkit (gpufleet lab stand-in) installed in $toolkitpath"
exit 0
"""

NVCC = """#!/bin/sh
# gpufleet lab stand-in nvcc installed by the stand-in CUDA {release} runfile.
case " $* " in
  *" --version "*|*" -V "*)
    cat <<'VERSION'
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Cuda compilation tools, release {release}, V{full}
gpufleet lab stand-in: installed from a lab stand-in runfile, not NVIDIA's nvcc.
VERSION
    exit 0 ;;
esac
echo "nvcc: gpufleet lab stand-in (runfile fixture), cannot compile" >&2
exit 1
"""


def _payload(release: str, full: str) -> bytes:
    files = {
        "bin/nvcc": (NVCC.format(release=release, full=full), 0o755),
        "version.json": (
            json.dumps(
                {"cuda": {"name": "CUDA SDK", "version": full}, "gpufleet_lab": "stand-in runfile fixture"}, indent=2
            )
            + "\n",
            0o644,
        ),
        "GPUFLEET-LAB-STANDIN.txt": ("Installed by a gpufleet lab stand-in runfile (lab equipment).\n", 0o644),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        for d in ("bin", "lib64", "include"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1740000000
            tar.addfile(info)
        for name, (text, mode) in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 1740000000
            tar.addfile(info, io.BytesIO(data))
    # tarfile writes the gzip header with the current time: pin it for a reproducible checksum.
    raw = bytearray(buf.getvalue())
    raw[4:8] = b"\x00\x00\x00\x00"
    return bytes(raw)


def build(out_dir: Path, release: str = "12.6", full: str = "12.6.85") -> Path:
    """Write cuda_<release>_gpufleet-lab-standin_linux.run and update SHA256SUMS; returns the file."""
    header_lines = HEADER.format(release=release, skip=0).count("\n")
    header = HEADER.format(release=release, skip=header_lines + 1)
    data = header.encode() + _payload(release, full)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"cuda_{full}_gpufleet-lab-standin_linux.run"
    path.write_bytes(data)
    path.chmod(0o755)
    sums = out_dir / "SHA256SUMS"
    lines = {line.split()[1]: line for line in sums.read_text().splitlines() if line.strip()} if sums.exists() else {}
    lines[path.name] = f"{hashlib.sha256(data).hexdigest()}  {path.name}"
    sums.write_text("".join(f"{lines[k]}\n" for k in sorted(lines)))
    return path
