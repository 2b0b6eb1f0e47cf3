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
    """Install the simulated nvidia-smi, its tools and the host's GPU profile into a host root filesystem."""
    check_profile(profile)
    target = root / "etc/gpusim/profile"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(PROFILES_DIR / profile, target)
    smi = root / "usr/bin/nvidia-smi"
    shutil.copyfile(GPUSIM_DIR / "nvidia_smi.py", smi)
    os.chmod(smi, 0o755)
    # "another program holds the GPUs": any user can run it (lab/gpusim/gpusim_hold.py); the kernel log's NVRM: Xid
    # lines, which a container has no kernel of its own to write (lab/gpusim/gpusim_kmsg.py, root only: the journal)
    for name, source in (("gpusim-hold", "gpusim_hold.py"), ("gpusim-kmsg", "gpusim_kmsg.py")):
        tool = root / "usr/local/bin" / name
        tool.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(GPUSIM_DIR / source, tool)
        os.chmod(tool, 0o755)
    (root / "etc/gpusim/README").write_text(
        "gpufleet lab simulator: /usr/bin/nvidia-smi on this host is a simulation driven by\n"
        f"/etc/gpusim/profile (profile {profile}). This host is lab equipment, not a GPU machine.\n"
    )
