"""lab/cuda_mirror: the lab's signed CUDA apt mirror, its packages and the stand-in runfile."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from cuda_mirror import build, packages, runfile, wheels


def fake_wheels(tmp_path: Path) -> dict[str, Path]:
    """Wheels with the member layout of NVIDIA's 12.8 ones (tiny contents)."""
    layout = {
        "nvidia-cuda-nvcc-cu12": [
            "nvidia/cuda_nvcc/bin/ptxas",
            "nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so",
            "nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc",
            "nvidia/cuda_nvcc/include/crt/host_defines.h",
            "nvidia/cuda_nvcc/include/__init__.py",
        ],
        "nvidia-cuda-runtime-cu12": [
            "nvidia/cuda_runtime/lib/libcudart.so.12",
            "nvidia/cuda_runtime/include/cuda_runtime.h",
        ],
        "nvidia-cuda-nvrtc-cu12": [
            "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "nvidia/cuda_nvrtc/lib/libnvrtc.alt.so.12",
            "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8",
            "nvidia/cuda_nvrtc/include/nvrtc.h",
        ],
    }
    out = {}
    for name, members in layout.items():
        path = tmp_path / f"{name}.whl"
        with zipfile.ZipFile(path, "w") as zf:
            for member in members:
                zf.writestr(member, f"fake {member}\n")
        out[name] = path
    return out


def test_plan_places_files_like_nvidia(tmp_path):
    plan = {p.name + "=" + p.version: p for p in packages.plan(fake_wheels(tmp_path))}
    assert set(plan) == {
        "cuda-toolkit-12-8-config-common=12.8.90-1",
        "cuda-nvcc-12-8=12.8.93-1",
        "cuda-cudart-12-8=12.8.90-1",
        "cuda-cudart-dev-12-8=12.8.90-1",
        "cuda-nvrtc-12-8=12.8.93-1",
        "cuda-nvrtc-dev-12-8=12.8.93-1",
        "cuda-toolkit-12-8=12.8.0-1",
        "cuda-toolkit-12-8=12.8.1-1",
    }
    nvcc = plan["cuda-nvcc-12-8=12.8.93-1"]
    dests = {d for _, _, d in nvcc.files}
    assert "usr/local/cuda-12.8/bin/ptxas" in dests
    assert "usr/local/cuda-12.8/nvvm/lib64/libnvvm.so" in dests
    assert "usr/local/cuda-12.8/targets/x86_64-linux/include/crt/host_defines.h" in dests
    assert not any(d.endswith("__init__.py") for d in dests)
    assert "release 12.8, V12.8.93" in nvcc.texts["usr/local/cuda-12.8/bin/nvcc"][0]
    assert "gpufleet lab stand-in" in nvcc.texts["usr/local/cuda-12.8/bin/nvcc"][0]
    nvrtc = {d for _, _, d in plan["cuda-nvrtc-12-8=12.8.93-1"].files}
    assert not any(".alt." in d for d in nvrtc)
    assert (
        plan["cuda-toolkit-12-8-config-common=12.8.90-1"].links["usr/local/cuda-12.8/lib64"]
        == "targets/x86_64-linux/lib"
    )


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
needs_gpg = pytest.mark.skipif(shutil.which("gpg") is None or shutil.which("gpgv") is None, reason="needs gpg")


@needs_dpkg
def test_debs_and_index(tmp_path):
    wheel_files = fake_wheels(tmp_path)
    repo = tmp_path / "repo"
    for pkg in packages.plan(wheel_files):
        packages.build_deb(pkg, wheel_files, tmp_path / "work", repo)
    packages.write_index(repo)
    contents = subprocess.run(
        ["dpkg-deb", "-c", str(repo / "cuda-nvcc-12-8_12.8.93-1_amd64.deb")], capture_output=True, text=True, check=True
    ).stdout
    assert (
        "root/root" in contents and "-rwxr-xr-x root/root" in contents and "./usr/local/cuda-12.8/bin/nvcc" in contents
    )
    index = (repo / "Packages").read_text()
    assert index.count("Package: cuda-toolkit-12-8\n") == 2
    deb = repo / "cuda-cudart-12-8_12.8.90-1_amd64.deb"
    assert f"SHA256: {hashlib.sha256(deb.read_bytes()).hexdigest()}" in index
    assert "Filename: ./cuda-cudart-12-8_12.8.90-1_amd64.deb" in index
    release = (repo / "Release").read_text()
    assert hashlib.sha256((repo / "Packages").read_bytes()).hexdigest() in release
    assert hashlib.sha256((repo / "Packages.gz").read_bytes()).hexdigest() in release


@needs_gpg
def test_signing_with_a_lab_key(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "Release").write_text("Origin: test\n")
    home = tmp_path / "gnupg"
    fpr = packages.ensure_key(home)
    assert packages.ensure_key(home) == fpr  # generated once, then reused
    packages.sign(repo, home, fpr)
    keyring = tmp_path / "key.gpg"
    keyring.write_bytes(
        subprocess.run(
            ["gpg", "--dearmor"], input=(repo / packages.KEY_FILE_NAME).read_bytes(), capture_output=True, check=True
        ).stdout
    )
    for args in (["InRelease"], ["Release.gpg", "Release"]):
        proc = subprocess.run(
            ["gpgv", "--keyring", str(keyring), *[str(repo / a) for a in args]],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    (repo / "Release").write_text("Origin: tampered\n")
    proc = subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(repo / "Release.gpg"), str(repo / "Release")],
        capture_output=True,
        check=False,
    )
    assert proc.returncode != 0


def test_standin_runfile_installs_with_the_real_options(tmp_path):
    run = runfile.build(tmp_path / "out", "12.6", "12.6.85")
    sums = (tmp_path / "out" / "SHA256SUMS").read_text()
    assert f"{hashlib.sha256(run.read_bytes()).hexdigest()}  {run.name}" in sums
    assert runfile.build(tmp_path / "again", "12.6", "12.6.85").read_bytes() == run.read_bytes()  # reproducible
    target = tmp_path / "cuda-12.6"
    proc = subprocess.run(
        ["sh", str(run), "--silent", "--toolkit", f"--toolkitpath={target}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(target / "bin/nvcc"), "--version"], capture_output=True, text=True, check=True).stdout
    assert "release 12.6, V12.6.85" in out and "gpufleet lab stand-in" in out


@pytest.mark.parametrize("args", [["--toolkit"], ["--silent"], ["--silent", "--toolkit", "--driver"]])
def test_standin_runfile_refuses_other_invocations(tmp_path, args):
    run = runfile.build(tmp_path, "12.6", "12.6.85")
    proc = subprocess.run(["sh", str(run), *args, f"--toolkitpath={tmp_path / 't'}"], capture_output=True, check=False)
    assert proc.returncode == 2 and not (tmp_path / "t").exists()


def test_wheel_pins_and_index_parsing():
    assert {w.name for w in wheels.CUDA_12_8} == {
        "nvidia-cuda-nvcc-cu12",
        "nvidia-cuda-runtime-cu12",
        "nvidia-cuda-nvrtc-cu12",
    }
    assert all(len(w.sha256) == 64 for w in (*wheels.CUDA_12_8, *wheels.CUDA_13_0))
    assert wheels.Wheel("nvidia-cuda-nvcc-cu12", "12.8.93", "x").prefix == "nvidia_cuda_nvcc_cu12-12.8.93-"
    links = wheels.parse_links('<a href="../../f/a-1-py3-none-any.whl#sha256=abc">a</a>', "file:///opt/pypi/simple/a/")
    assert links == [("a-1-py3-none-any.whl", "file:///opt/pypi/f/a-1-py3-none-any.whl", "abc")]


def test_fetch_refuses_a_wheel_with_the_wrong_checksum(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "x_y-1.0-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"not the pinned wheel")
    index = tmp_path / "simple" / "x-y"
    index.mkdir(parents=True)
    (index / "index.html").write_text('<a href="../../files/x_y-1.0-py3-none-manylinux_2_17_x86_64.whl">x</a>')
    pin = wheels.Wheel("x-y", "1.0", "0" * 64)
    with pytest.raises(wheels.MirrorError, match="refusing it"):
        wheels.fetch(pin, tmp_path / "cache", f"file://{tmp_path / 'simple'}", log=lambda m: None)
    assert not list((tmp_path / "cache").iterdir())


def test_recipe_id_is_stable():
    assert build.recipe_id() == build.recipe_id() and len(build.recipe_id()) == 16
