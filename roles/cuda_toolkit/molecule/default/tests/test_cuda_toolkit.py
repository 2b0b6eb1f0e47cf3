"""cuda_toolkit on a lab host: CUDA 12.8 (apt, lab mirror), 13.0 (wheels) and 12.6 (runfile) side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[1] / "files"
CUDA_128 = "/usr/local/cuda-12.8"
CUDA_130 = "/usr/local/cuda-13.0"
CUDA_126 = "/usr/local/cuda-12.6"


@pytest.fixture
def cuda(host_by_name):
    """The converged host (the other platform, old-driver-host, is only for tests/test_error_cases.py)."""
    return host_by_name("cuda-host")


@pytest.fixture
def work(cuda):
    """A scratch directory on the host with the test sources."""
    path = "/var/tmp/cuda-toolkit-tests"
    cuda.check_output(f"rm -rf {path} && mkdir -p {path}")
    for name in ("axpy_sm120.ptx", "probe.cu"):
        text = (FILES / name).read_text()
        cuda.check_output(f"cat > {path}/{name} <<'GPUFLEET_EOF'\n{text}GPUFLEET_EOF")
    return path


# ---- CUDA 12.8 through apt against the lab mirror ---------------------------------------------------
def test_deb822_source_with_signed_by(cuda):
    source = cuda.file("/etc/apt/sources.list.d/nvidia-cuda.sources")
    assert source.exists
    text = source.content_string
    assert "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc" in text
    assert "Suites: /" in text
    assert "/compute/cuda/repos/debian12/x86_64/" in text
    key = cuda.file("/etc/apt/keyrings/nvidia-cuda.asc")
    assert key.exists and "BEGIN PGP PUBLIC KEY BLOCK" in key.content_string
    assert not cuda.file("/etc/apt/sources.list.d/nvidia-cuda.list").exists


def test_repository_signature_verified_by_apt(cuda):
    out = cuda.run("apt-get update 2>&1")
    assert out.rc == 0, out.stdout
    assert "NO_PUBKEY" not in out.stdout and "not signed" not in out.stdout
    lists = cuda.check_output("ls /var/lib/apt/lists/")
    assert "compute_cuda_repos_debian12_x86%5f64_InRelease" in lists  # signed InRelease fetched


def test_pinned_version_installed_though_newer_exists(cuda):
    pref = cuda.file("/etc/apt/preferences.d/nvidia-cuda-cuda-toolkit-12-8.pref").content_string
    assert "Package: cuda-toolkit-12-8" in pref and "Pin: version 12.8.0-1" in pref
    policy = cuda.check_output("apt-cache policy cuda-toolkit-12-8")
    assert "Installed: 12.8.0-1" in policy
    assert "Candidate: 12.8.0-1" in policy
    assert "12.8.1-1" in policy  # the newer one is available, and not taken
    assert cuda.package("cuda-toolkit-12-8").version == "12.8.0-1"


def test_package_is_held(cuda):
    assert "cuda-toolkit-12-8" in cuda.check_output("apt-mark showhold").split()
    sim = cuda.check_output("apt-get -s upgrade 2>&1")
    assert "Inst cuda-toolkit-12-8" not in sim


def test_ptxas_is_release_12_8(cuda):
    out = cuda.check_output(f"{CUDA_128}/bin/ptxas --version")
    assert "Cuda compilation tools, release 12.8, V12.8.93" in out


def test_ptxas_assembles_sm120_cubin(cuda, work):
    out = cuda.run(f"{CUDA_128}/bin/ptxas -arch=sm_120 -v {work}/axpy_sm120.ptx -o {work}/axpy_sm120.cubin")
    assert out.rc == 0, out.stderr
    assert "Compiling entry function 'axpy' for 'sm_120'" in out.stderr + out.stdout
    assert cuda.check_output(f"head -c 4 {work}/axpy_sm120.cubin | od -An -c").split() == ["177", "E", "L", "F"]


def test_nvcc_standin_reports_12_8_and_says_so(cuda):
    out = cuda.check_output(f"{CUDA_128}/bin/nvcc --version")
    assert "release 12.8, V12.8.93" in out
    assert "gpufleet lab stand-in" in out


def test_12_8_tree_layout_like_nvidia(cuda):
    assert cuda.file(f"{CUDA_128}/lib64").linked_to == f"{CUDA_128}/targets/x86_64-linux/lib"
    for path in (
        "lib64/libcudart.so.12",
        "lib64/libnvrtc.so.12",
        "nvvm/lib64/libnvvm.so",
        "nvvm/libdevice/libdevice.10.bc",
        "include/cuda_runtime.h",
        "include/nvrtc.h",
    ):
        assert cuda.file(f"{CUDA_128}/{path}").exists, path


# ---- CUDA 13.0 from NVIDIA's wheels, beside 12.8 -----------------------------------------------------
def test_nvcc_13_0_reports_release(cuda):
    assert "Cuda compilation tools, release 13.0, V13.0.88" in cuda.check_output(f"{CUDA_130}/bin/nvcc --version")


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
def test_nvcc_13_0_compiles_ptx(cuda, work, arch):
    ptx = f"{work}/probe_{arch}.ptx"
    out = cuda.run(f"{CUDA_130}/bin/nvcc --ptx -arch={arch} {work}/probe.cu -o {ptx}")
    assert out.rc == 0, out.stderr
    text = cuda.file(ptx).content_string
    assert f".target {arch}" in text and ".entry _Z4axpyfPKfPfi" in text


def test_nvcc_13_0_links_executables(cuda, work):
    for flags, exe in (("", "probe_static"), ("-cudart shared", "probe_shared")):
        out = cuda.run(
            f"{CUDA_130}/bin/nvcc {flags} -gencode arch=compute_120,code=sm_120 -gencode arch=compute_90,code=sm_90 "
            f"{work}/probe.cu -o {work}/{exe}"
        )
        assert out.rc == 0, out.stderr
        run = cuda.run(f"{work}/{exe}")
        assert run.rc == 0 and "gpufleet cuda probe: runtime 13000" in run.stdout, run.stdout + run.stderr
    # The shared build finds libcudart.so.13 through the role's ld.so.conf entry.
    assert f"{CUDA_130}/lib64/libcudart.so.13" in cuda.check_output(f"ldd {work}/probe_shared")


def test_13_0_tree_for_non_root_users(cuda):
    assert cuda.file(f"{CUDA_130}/lib64").linked_to == f"{CUDA_130}/lib"
    assert cuda.file(f"{CUDA_130}/lib/libcudart.so").linked_to == f"{CUDA_130}/lib/libcudart.so.13"
    for binary in ("bin/nvcc", "bin/ptxas", "bin/cudafe++", "bin/fatbinary", "bin/nvlink", "nvvm/bin/cicc"):
        assert cuda.file(f"{CUDA_130}/{binary}").mode == 0o755, binary
    out = cuda.run(f"su nobody -s /bin/sh -c '{CUDA_130}/bin/nvcc --version'")
    assert out.rc == 0 and "release 13.0" in out.stdout


def test_12_8_tree_byte_for_byte_unchanged(cuda):
    before = cuda.file("/var/tmp/cuda-12.8.manifest").content_string
    now = cuda.check_output(f"/var/tmp/tree-manifest.sh {CUDA_128}")
    assert before.strip() == now.strip()
    assert len(before.splitlines()) > 50


# ---- CUDA 12.6 from a runfile (lab stand-in) --------------------------------------------------------
def test_runfile_release_installed_and_download_removed(cuda):
    out = cuda.check_output(f"{CUDA_126}/bin/nvcc --version")
    assert "release 12.6," in out and "gpufleet lab stand-in" in out
    assert cuda.run("ls /var/cache/gpufleet/cuda-toolkit/*.run").rc != 0


def test_default_symlink_left_alone(cuda):
    assert not cuda.file("/usr/local/cuda").exists
    assert not cuda.file("/etc/profile.d/gpufleet-cuda.sh").exists
