"""Validation filters of the cuda_toolkit role: every check that runs before the role changes a host.

Pure standard-library Python (also imported directly by tests/unit/cuda_toolkit).
"""

from __future__ import annotations

import re

METHODS = ("apt", "runfile", "wheels")
# (distribution, major version) -> NVIDIA repository path name; the role supports exactly these.
SUPPORTED = {("Debian", "12"): "debian12", ("Ubuntu", "22"): "ubuntu2204", ("Ubuntu", "24"): "ubuntu2404"}
REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
VERSION_RE = re.compile(r"^(?P<major>[1-9][0-9]?)\.(?P<minor>[0-9]{1,2})$")
DRIVER_RE = re.compile(r"^[0-9]+(\.[0-9]+){1,2}$")
APT_VERSION_RE = re.compile(r"^[0-9][A-Za-z0-9.+~-]*$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# The first CUDA major whose PyPI wheels contain the whole compiler (nvcc, cicc, crt, fatbinary, nvlink).
FIRST_WHEELS_MAJOR = 13


def _supported_list() -> str:
    return ", ".join(f"{d} {v}{'.04' if d == 'Ubuntu' else ''}" for d, v in SUPPORTED)


def repo_distribution(distribution: str, major_version) -> str:
    """NVIDIA's repository name for a host (debian12, ubuntu2204, ubuntu2404), '' when unsupported."""
    return SUPPORTED.get((str(distribution), str(major_version)), "")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))


def problems(settings: dict) -> list[str]:
    """Every inconsistency in the role's settings; an empty list means the role may go on."""
    out: list[str] = []
    version = str(settings.get("version", ""))
    method = settings.get("method", "apt")
    match = VERSION_RE.match(version)
    if not match:
        out.append(
            f"cuda_toolkit_version {version!r} is malformed: give the toolkit release as MAJOR.MINOR "
            "(e.g. '12.8' or '13.0'); an exact package version goes in cuda_toolkit_apt_version"
        )
    if method not in METHODS:
        out.append(f"cuda_toolkit_method {method!r} is unknown: use one of {', '.join(METHODS)}")
    distribution = settings.get("distribution", "")
    major = str(settings.get("distribution_major_version", ""))
    if not repo_distribution(distribution, major):
        out.append(
            f"unsupported distribution {distribution} {major}: the cuda_toolkit role supports {_supported_list()}"
        )
    arch = settings.get("architecture", "x86_64")
    if arch not in REPO_ARCH:
        out.append(f"unsupported architecture {arch}: the cuda_toolkit role supports {', '.join(REPO_ARCH)}")
    if method == "apt":
        apt_version = str(settings.get("apt_version") or "")
        if apt_version and not APT_VERSION_RE.match(apt_version):
            out.append(f"cuda_toolkit_apt_version {apt_version!r} is not a Debian package version (e.g. '12.8.1-1')")
        elif apt_version and match and not apt_version.startswith(version + "."):
            out.append(
                f"cuda_toolkit_apt_version {apt_version!r} does not belong to toolkit {version}: "
                f"it must start with '{version}.' (e.g. '{version}.1-1')"
            )
    if method == "runfile":
        if not settings.get("runfile_url"):
            out.append("cuda_toolkit_runfile_url is empty: give the runfile's URL or its path on the controller")
        sha = str(settings.get("runfile_sha256") or "")
        if not SHA256_RE.match(sha):
            out.append(
                "cuda_toolkit_runfile_sha256 must be the runfile's sha256 (64 lowercase hex digits): "
                "the role installs no runfile it cannot verify"
            )
    if method == "wheels" and match:
        if int(match["major"]) < FIRST_WHEELS_MAJOR:
            out.append(
                f"cuda_toolkit_method 'wheels' cannot install CUDA {version}: the CUDA {match['major']}.x wheels on "
                "PyPI have no nvcc (only ptxas, libnvvm and headers), so they cannot make a working toolkit. "
                f"Use method 'apt' or 'runfile' for {version}, or wheels with {FIRST_WHEELS_MAJOR}.0 or later"
            )
        elif not settings.get("wheels_packages"):
            out.append(
                f"no wheel set is known for CUDA {version}: list the wheels (name, version, sha256) "
                "in cuda_toolkit_wheels_packages"
            )
        for pkg in settings.get("wheels_packages") or []:
            if not isinstance(pkg, dict) or not pkg.get("name") or not pkg.get("version"):
                out.append(f"cuda_toolkit_wheels_packages entry {pkg!r} needs 'name' and 'version'")
            elif match and not str(pkg["version"]).startswith(version + "."):
                out.append(
                    f"cuda_toolkit_wheels_packages: {pkg['name']} {pkg['version']} is not a CUDA {version} wheel"
                )
    return out


def driver_problem(driver_version, toolkit_version, floors: dict, ignore: bool = False) -> str:
    """'' when the driver may run the toolkit (or the check is overridden), else the reason."""
    if ignore:
        return ""
    driver = str(driver_version or "").strip()
    toolkit = str(toolkit_version)
    override = "set cuda_toolkit_ignore_driver_floor: true to install anyway (e.g. a toolkit-only build host)"
    floor = (floors or {}).get(toolkit)
    if floor is None:
        return (
            f"no minimum driver is known for CUDA {toolkit}: add it to the table in "
            f"roles/cuda_toolkit/vars/driver_floors.yml, or {override}"
        )
    if not driver:
        return (
            f"no NVIDIA driver found (nvidia-smi gave no driver version): CUDA {toolkit} needs >= {floor}; {override}"
        )
    if not DRIVER_RE.match(driver):
        return f"cannot read the NVIDIA driver version {driver!r}; {override}"
    if _version_tuple(driver) < _version_tuple(floor):
        return (
            f"NVIDIA driver {driver} is older than {floor}, the minimum for CUDA {toolkit}: upgrade the driver "
            f"first, or {override}"
        )
    return ""


class FilterModule:
    def filters(self):
        return {
            "cuda_toolkit_problems": problems,
            "cuda_toolkit_driver_problem": driver_problem,
            "cuda_toolkit_repo_distribution": repo_distribution,
        }
