"""The cuda_toolkit role's checks before it changes a host: settings and the driver floor."""

from __future__ import annotations

import pytest
import yaml
from cuda_toolkit_helpers import ROLE, filters

FLOORS = yaml.safe_load((ROLE / "vars" / "driver_floors.yml").read_text())["cuda_toolkit_driver_floors"]
KNOWN_WHEELS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["cuda_toolkit_known_wheel_sets"]
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def settings(**overrides):
    base = {
        "version": "12.8",
        "method": "apt",
        "distribution": "Debian",
        "distribution_major_version": "12",
        "architecture": "x86_64",
        "apt_version": "",
        "runfile_url": "",
        "runfile_sha256": "",
        "wheels_packages": [],
    }
    base.update(overrides)
    return base


def test_defaults_are_accepted():
    assert filters.problems(settings()) == []


@pytest.mark.parametrize(
    ("distribution", "major", "repo"),
    [("Debian", "12", "debian12"), ("Ubuntu", "22", "ubuntu2204"), ("Ubuntu", "24", "ubuntu2404")],
)
def test_supported_distributions(distribution, major, repo):
    assert filters.repo_distribution(distribution, major) == repo
    assert filters.problems(settings(distribution=distribution, distribution_major_version=major)) == []


@pytest.mark.parametrize(
    ("distribution", "major"), [("Rocky", "9"), ("Debian", "11"), ("Ubuntu", "20"), ("Debian", "13")]
)
def test_unsupported_distribution_is_refused(distribution, major):
    (problem,) = filters.problems(settings(distribution=distribution, distribution_major_version=major))
    assert problem.startswith(f"unsupported distribution {distribution} {major}")
    assert "Debian 12, Ubuntu 22.04, Ubuntu 24.04" in problem


def test_unsupported_architecture_is_refused():
    (problem,) = filters.problems(settings(architecture="ppc64le"))
    assert "unsupported architecture ppc64le" in problem


def test_unknown_method_is_refused():
    (problem,) = filters.problems(settings(method="pip"))
    assert problem == "cuda_toolkit_method 'pip' is unknown: use one of apt, runfile, wheels"


@pytest.mark.parametrize("version", ["12", "12.8.1", "v12.8", "", "12.x", "12.8-1", "012.8", " 12.8"])
def test_malformed_version_is_refused(version):
    problems = filters.problems(settings(version=version))
    assert any(p.startswith(f"cuda_toolkit_version {version!r} is malformed") for p in problems)
    assert "MAJOR.MINOR" in problems[0]


@pytest.mark.parametrize("version", ["12.0", "12.8", "12.9", "13.0", "13.1"])
def test_wellformed_versions(version):
    assert filters.problems(settings(version=version)) == []


@pytest.mark.parametrize("version", ["12.8", "12.9", "11.8"])
def test_wheels_for_12x_refused_with_the_reason(version):
    (problem,) = filters.problems(settings(version=version, method="wheels"))
    assert f"cuda_toolkit_method 'wheels' cannot install CUDA {version}" in problem
    assert "have no nvcc" in problem and "Use method 'apt' or 'runfile'" in problem


def test_wheels_for_13_0_uses_the_known_set():
    assert filters.problems(settings(version="13.0", method="wheels", wheels_packages=KNOWN_WHEELS["13.0"])) == []
    names = {w["name"] for w in KNOWN_WHEELS["13.0"]}
    assert names == {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl"}
    assert all(len(w["sha256"]) == 64 and str(w["version"]).startswith("13.0.") for w in KNOWN_WHEELS["13.0"])


def test_wheels_without_a_known_set_need_a_list():
    (problem,) = filters.problems(settings(version="13.1", method="wheels"))
    assert "no wheel set is known for CUDA 13.1" in problem and "cuda_toolkit_wheels_packages" in problem


def test_wheels_of_another_release_refused():
    wheels = [{"name": "nvidia-cuda-nvcc", "version": "13.1.80"}]
    (problem,) = filters.problems(settings(version="13.0", method="wheels", wheels_packages=wheels))
    assert "nvidia-cuda-nvcc 13.1.80 is not a CUDA 13.0 wheel" in problem


@pytest.mark.parametrize(
    ("apt_version", "fragment"),
    [("12.6.3-1", "does not belong to toolkit 12.8"), ("latest!", "is not a Debian package version")],
)
def test_bad_apt_version(apt_version, fragment):
    (problem,) = filters.problems(settings(apt_version=apt_version))
    assert fragment in problem


def test_good_apt_version():
    assert filters.problems(settings(apt_version="12.8.1-1")) == []


def test_runfile_needs_url_and_sha256():
    problems = filters.problems(settings(method="runfile"))
    assert any("cuda_toolkit_runfile_url is empty" in p for p in problems)
    assert any("cuda_toolkit_runfile_sha256 must be" in p for p in problems)
    ok = settings(method="runfile", runfile_url="https://x/cuda.run", runfile_sha256="a" * 64)
    assert filters.problems(ok) == []
    assert filters.problems({**ok, "runfile_sha256": "A" * 64})  # uppercase is refused: compare exactly


# ---- driver floor ---------------------------------------------------------------------------------------
def test_floor_table():
    assert FLOORS["12.8"] == "570.26"
    assert FLOORS["13.0"].startswith("580.65")
    for version, floor in FLOORS.items():
        assert filters.VERSION_RE.match(version) and filters.DRIVER_RE.match(floor)


@pytest.mark.parametrize(
    ("driver", "toolkit"),
    [
        ("570.172.08", "12.8"),
        ("570.26", "12.8"),
        ("580.159.04", "12.8"),
        ("580.65.06", "13.0"),
        ("590.10", "13.0"),
        ("550.127.05", "12.4"),
    ],
)
def test_driver_new_enough(driver, toolkit):
    assert filters.driver_problem(driver, toolkit, FLOORS) == ""


@pytest.mark.parametrize(
    ("driver", "toolkit", "floor"),
    [
        ("550.127.05", "12.8", "570.26"),
        ("570.25.99", "12.8", "570.26"),
        ("570.172.08", "13.0", FLOORS["13.0"]),
        ("580.65", "13.0", FLOORS["13.0"]),
    ],
)
def test_driver_too_old(driver, toolkit, floor):
    problem = filters.driver_problem(driver, toolkit, FLOORS)
    assert problem.startswith(f"NVIDIA driver {driver} is older than {floor}, the minimum for CUDA {toolkit}")
    assert "cuda_toolkit_ignore_driver_floor: true" in problem


def test_override_skips_every_driver_check():
    assert filters.driver_problem("550.127.05", "12.8", FLOORS, True) == ""
    assert filters.driver_problem("", "99.9", {}, True) == ""


def test_no_driver_and_unreadable_driver():
    assert "no NVIDIA driver found" in filters.driver_problem("", "12.8", FLOORS)
    assert "cannot read the NVIDIA driver version 'N/A'" in filters.driver_problem("N/A", "12.8", FLOORS)


def test_unknown_release_has_no_floor():
    problem = filters.driver_problem("580.1", "14.0", FLOORS)
    assert "no minimum driver is known for CUDA 14.0" in problem and "driver_floors.yml" in problem


def test_filters_are_registered():
    assert set(filters.FilterModule().filters()) == {
        "cuda_toolkit_problems",
        "cuda_toolkit_driver_problem",
        "cuda_toolkit_repo_distribution",
    }


# ---- defaults, argument specs and docs agree ----------------------------------------------------------
def test_every_default_has_an_argument_spec_with_the_same_default():
    assert set(DEFAULTS) == set(SPECS)
    for name, value in DEFAULTS.items():
        assert SPECS[name].get("default") == value, name


def test_method_choices_match_the_filter():
    assert SPECS["cuda_toolkit_method"]["choices"] == list(filters.METHODS)


def test_docs_list_every_variable():
    doc = (ROLE.parents[1] / "docs" / "cuda-toolkit.md").read_text()
    missing = [name for name in DEFAULTS if f"`{name}`" not in doc]
    assert not missing, missing
