"""plugins/modules/cuda_toolkit_wheels.py: finding, verifying and laying out NVIDIA's compiler wheels."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
from cuda_toolkit_helpers import wheels_module as wm

PYPI_PAGE = """<html><body>
<a href="https://files.example/aa/nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl#sha256=aaa">a</a>
<a href="https://files.example/bb/nvidia_cuda_nvcc-13.0.88-py3-none-win_amd64.whl#sha256=bbb">b</a>
<a href="https://files.example/cc/nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl#sha256=ccc">c</a>
<a href="https://files.example/dd/nvidia_cuda_nvcc-13.0.48-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl#sha256=ddd">d</a>
</body></html>"""

# What `python -m http.server` lists for a directory (relative links, no checksums).
LISTING = """<!DOCTYPE HTML><html><body><ul>
<li><a href="index.html">index.html</a></li>
<li><a href="nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl">nvidia_nvvm</a></li>
</ul></body></html>"""


def test_parse_links_of_an_index_page():
    links = wm.parse_links(PYPI_PAGE, "https://pypi.org/simple/nvidia-cuda-nvcc/")
    assert links[2] == (
        "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "https://files.example/cc/nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "ccc",
    )


def test_parse_links_of_a_directory_listing_resolves_relative_links():
    links = wm.parse_links(LISTING, "http://10.123.0.1:8480/wheels/")
    assert links[1][1].startswith("http://10.123.0.1:8480/wheels/nvidia_nvvm-13.0.88-") and links[1][2] is None


def test_select_wheel_takes_the_linux_wheel_of_the_version_and_platform():
    links = wm.parse_links(PYPI_PAGE, "https://pypi.org/simple/nvidia-cuda-nvcc/")
    assert wm.select_wheel(links, "nvidia-cuda-nvcc", "13.0.88", "x86_64")[2] == "ccc"
    assert wm.select_wheel(links, "nvidia_cuda_nvcc", "13.0.88", "aarch64")[2] == "aaa"
    assert wm.select_wheel(links, "nvidia-cuda-nvcc", "13.0.48", "x86_64")[2] == "ddd"
    with pytest.raises(wm.WheelError, match=r"no x86_64 Linux wheel of nvidia-cuda-nvcc==13\.0\.99"):
        wm.select_wheel(links, "nvidia-cuda-nvcc", "13.0.99", "x86_64")


def test_normalize():
    assert wm.normalize("NVIDIA_CUDA.nvcc") == ("nvidia-cuda-nvcc", "nvidia_cuda_nvcc")


def test_tree_members_keep_only_the_toolkit_tree():
    names = [
        "nvidia/cu13/bin/nvcc",
        "nvidia/cu13/.metadata/provenance.txt",
        "nvidia/cu13/lib/",
        "nvidia_cuda_nvcc-13.0.88.dist-info/RECORD",
        "nvidia/cu13/../evil",
        "nvidia/cu13/include/crt/host_defines.h",
    ]
    assert wm.tree_members(names, "nvidia/cu13") == [
        ("nvidia/cu13/bin/nvcc", "bin/nvcc"),
        ("nvidia/cu13/include/crt/host_defines.h", "include/crt/host_defines.h"),
    ]


# ---- a synthetic toolkit in wheels -----------------------------------------------------------------------
def make_wheel(directory: Path, name: str, version: str, files: dict[str, tuple[bytes, int]]) -> tuple[Path, str]:
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, (data, mode) in files.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = (0o100000 | mode) << 16
            zf.writestr(info, data)
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "Name: x\n")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


# The toolkit's wheels: (name, version) -> {member: (data, mode)}.
WHEELS = {
    ("nvidia-cuda-nvcc", "13.0.88"): {
        "nvidia/cu13/bin/nvcc": (b"#!/bin/sh\necho release 13.0\n", 0o744),
        "nvidia/cu13/bin/nvcc.profile": (b"TOP = $(_HERE_)/..\n", 0o644),
        "nvidia/cu13/.metadata/provenance.txt": (b"x", 0o644),
    },
    ("nvidia-cuda-runtime", "13.0.96"): {
        "nvidia/cu13/lib/libcudart.so.13": (b"\x7fELF", 0o644),
        "nvidia/cu13/include/cuda_runtime.h": (b"/* rt */", 0o644),
    },
}


@pytest.fixture
def wheelhouse(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    packages = []
    for (name, version), files in WHEELS.items():
        _path, sha256 = make_wheel(house, name, version, files)
        packages.append({"name": name, "version": version, "sha256": sha256})
    return house, packages


class FakeModule:
    def __init__(self, check_mode=False):
        self.check_mode = check_mode


def params(tmp_path, house, packages, **extra):
    base = {
        "dest": str(tmp_path / "usr/local/cuda-13.0"),
        "packages": packages,
        "tree_prefix": "nvidia/cu13",
        "index_url": "https://pypi.invalid/simple",
        "find_links": str(house),
        "download_dir": str(tmp_path / "cache"),
        "platform": "x86_64",
        "timeout": 5,
    }
    base.update(extra)
    return base


def test_install_lays_out_a_normal_tree(tmp_path, wheelhouse):
    house, packages = wheelhouse
    p = params(tmp_path, house, packages)
    result = wm.install(FakeModule(), p)
    dest = Path(p["dest"])
    assert result["changed"] and result["dest"] == str(dest)
    assert os.readlink(dest / "lib64") == "lib"
    assert os.readlink(dest / "lib/libcudart.so") == "libcudart.so.13"
    assert (dest / "bin/nvcc").stat().st_mode & 0o777 == 0o755  # 0744 in the wheel: others may run it
    assert (dest / "bin/nvcc.profile").stat().st_mode & 0o777 == 0o644
    assert (dest / "include").stat().st_mode & 0o777 == 0o755
    assert not (dest / ".metadata").exists()
    manifest = json.loads((dest / wm.MANIFEST).read_text())
    assert {w["name"] for w in manifest["wheels"]} == {"nvidia-cuda-nvcc", "nvidia-cuda-runtime"}
    assert "lib64" in manifest["files"] and "bin/nvcc" in manifest["files"]


def test_second_run_changes_nothing_and_fetches_nothing(tmp_path, wheelhouse):
    house, packages = wheelhouse
    p = params(tmp_path, house, packages)
    wm.install(FakeModule(), p)
    before = (Path(p["dest"]) / "bin/nvcc").stat().st_mtime_ns
    for f in house.iterdir():
        f.unlink()  # nothing to fetch from any more
    assert wm.install(FakeModule(), p)["changed"] is False
    assert (Path(p["dest"]) / "bin/nvcc").stat().st_mtime_ns == before


def test_check_mode_reports_without_touching(tmp_path, wheelhouse):
    house, packages = wheelhouse
    p = params(tmp_path, house, packages)
    assert wm.install(FakeModule(check_mode=True), p)["changed"] is True
    assert not Path(p["dest"]).exists()


def test_a_missing_file_is_repaired(tmp_path, wheelhouse):
    house, packages = wheelhouse
    p = params(tmp_path, house, packages)
    wm.install(FakeModule(), p)
    (Path(p["dest"]) / "bin/nvcc").unlink()
    assert wm.install(FakeModule(), p)["changed"] is True
    assert (Path(p["dest"]) / "bin/nvcc").exists()


def test_checksum_mismatch_is_refused_and_the_old_tree_kept(tmp_path, wheelhouse):
    house, packages = wheelhouse
    p = params(tmp_path, house, packages)
    wm.install(FakeModule(), p)
    bad = [dict(packages[0], version="13.0.88", sha256="0" * 64), packages[1]]
    # Another requested checksum: the manifest no longer matches, the cached wheel is re-read and refused.
    with pytest.raises(wm.WheelError, match="expected 0000"):
        wm.install(FakeModule(), params(tmp_path, house, bad))
    assert (Path(p["dest"]) / "bin/nvcc").exists()
    assert not [x for x in Path(p["dest"]).parent.iterdir() if x.name.startswith(".cuda-13.0.")]
    assert not [x for x in Path(p["download_dir"]).iterdir() if x.name.startswith(".part-")]


def test_missing_wheel_is_a_clear_error(tmp_path, wheelhouse):
    house, packages = wheelhouse
    p = params(tmp_path, house, [*packages, {"name": "nvidia-nvvm", "version": "13.0.88", "sha256": "1" * 64}])
    with pytest.raises(wm.WheelError, match=r"no x86_64 Linux wheel of nvidia-nvvm==13\.0\.88"):
        wm.install(FakeModule(), p)
    assert not Path(p["dest"]).exists()


def test_a_wheel_without_any_checksum_is_refused(tmp_path, wheelhouse):
    house, packages = wheelhouse
    p = params(tmp_path, house, [{"name": "nvidia-cuda-nvcc", "version": "13.0.88"}])
    with pytest.raises(wm.WheelError, match="no sha256 known"):
        wm.install(FakeModule(), p)


def test_another_release_directory_is_never_touched(tmp_path, wheelhouse):
    house, packages = wheelhouse
    other = tmp_path / "usr/local/cuda-12.8/bin"
    other.mkdir(parents=True)
    (other / "nvcc").write_text("12.8")
    wm.install(FakeModule(), params(tmp_path, house, packages))
    assert (other / "nvcc").read_text() == "12.8"
    assert sorted(p.name for p in (tmp_path / "usr/local").iterdir()) == ["cuda-12.8", "cuda-13.0"]


def test_module_documentation_is_yaml():
    import yaml

    for block in (wm.DOCUMENTATION, wm.EXAMPLES, wm.RETURN):
        assert yaml.safe_load(block)
