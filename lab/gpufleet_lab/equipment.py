"""Lab equipment installed into a lab host's root before it boots: the simulated GPUs.

Only the lab tool installs these; no product role ever does. Each simulator says it is one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpufleet_lab.sysutil import LabError

LAB_DIR = Path(__file__).resolve().parents[1]
GPUSIM_DIR = LAB_DIR / "gpusim"
PROFILES_DIR = GPUSIM_DIR / "profiles"


def available_profiles() -> list[str]:
    return sorted(p.name for p in PROFILES_DIR.iterdir() if (p / "profile.json").exists())


def check_profile(profile: str) -> None:
    if profile not in available_profiles():
        raise LabError(f"unknown GPU profile {profile!r}; available: {', '.join(available_profiles())}")


def install_equipment(root: Path, profile: str) -> None:
    """Install the simulated nvidia-smi and the host's GPU profile into a host root filesystem."""
    check_profile(profile)
    target = root / "etc/gpusim/profile"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(PROFILES_DIR / profile, target)
    smi = root / "usr/bin/nvidia-smi"
    shutil.copyfile(GPUSIM_DIR / "nvidia_smi.py", smi)
    os.chmod(smi, 0o755)
    # "another program holds the GPUs": any user can run it (lab/gpusim/gpusim_hold.py)
    hold = root / "usr/local/bin/gpusim-hold"
    hold.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(GPUSIM_DIR / "gpusim_hold.py", hold)
    os.chmod(hold, 0o755)
    (root / "etc/gpusim/README").write_text(
        "gpufleet lab simulator: /usr/bin/nvidia-smi on this host is a simulation driven by\n"
        f"/etc/gpusim/profile (profile {profile}). This host is lab equipment, not a GPU machine.\n"
    )
