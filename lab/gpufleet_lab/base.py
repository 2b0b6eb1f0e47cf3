"""Build and cache the Debian 12 base root filesystem shared (read-only) by every lab host."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpufleet_lab.sysutil import LabError, run

DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
# What every lab "VM" has before any role runs: a systemd host reachable over ssh with a Python for
# Ansible. python3-apt/python3-debian serve ansible.builtin.apt and deb822_repository; acl lets
# become_user switch to unprivileged users; curl is used by health checks; systemd-journal-remote writes the lab's
# kernel log lines (lab/gpusim/gpusim_kmsg.py: its binary only, no unit of it is enabled).
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-apt",
    "python3-debian",
    "openssh-server",
    "sudo",
    "acl",
    "iproute2",
    "iputils-ping",
    "procps",
    "ca-certificates",
    "curl",
    "gnupg",
    "xz-utils",
    "zstd",
    "systemd-journal-remote",
)
# Customize hooks run by mmdebstrap inside the new tree ($1 is the root).
HOOKS = (
    # e2scrub_reap fails in a container; nothing to scrub on an overlay.
    'rm -f "$1/etc/systemd/system/default.target.wants/e2scrub_reap.service"',
    # Each host gets its own ssh host keys when it is created.
    'rm -f "$1"/etc/ssh/ssh_host_*',
    'mkdir -p -m 700 "$1/root/.ssh"',
    # Keep the console quiet: no getty on the passive console.
    'ln -sf /dev/null "$1/etc/systemd/system/console-getty.service"',
)
HOOK_VERSION = 1


def cache_key(mirror: str) -> str:
    material = json.dumps(
        {"suite": SUITE, "mirror": mirror, "packages": PACKAGES, "hooks": HOOKS, "v": HOOK_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def ensure_base(cache_dir: Path, mirror: str = DEFAULT_MIRROR, log=print) -> Path:
    """Return the extracted base root for this package set, building and caching it when needed.

    The base is built once with mmdebstrap into a zstd tarball (the cache) and extracted next to it;
    later labs only mount overlays over the extracted tree.
    """
    key = cache_key(mirror)
    root = cache_dir / f"base-{key}"
    marker = root / ".gpufleet-base-complete"
    if marker.exists():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Labs come up in parallel (make test runs Molecule scenarios and lab tests at once): one builds the base,
    # the others wait for it here and then find it complete.
    with open(cache_dir / f".base-{key}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return root
        return _build_base(cache_dir, key, root, mirror, log)


def _build_base(cache_dir: Path, key: str, root: Path, mirror: str, log) -> Path:
    tarball = cache_dir / f"base-{key}.tar.zst"
    if not tarball.exists():
        started = time.monotonic()
        log(f"building the Debian 12 base root filesystem with mmdebstrap from {mirror} (about a minute)")
        plain = cache_dir / f".base-{key}.tar"
        cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}"]
        cmd += [f"--customize-hook={hook}" for hook in HOOKS]
        cmd += [SUITE, str(plain), mirror]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            plain.unlink(missing_ok=True)
            raise LabError(
                f"mmdebstrap failed (exit {proc.returncode}); is the Debian mirror {mirror} reachable?\n"
                + "\n".join(proc.stderr.strip().splitlines()[-15:])
            )
        tmp_zst = cache_dir / f".base-{key}.tar.zst"
        run(["zstd", "-q", "-T0", "-f", "--rm", str(plain), "-o", str(tmp_zst)])
        os.replace(tmp_zst, tarball)
        log(f"base root filesystem cached at {tarball} ({time.monotonic() - started:.0f} s)")
    if root.exists():
        shutil.rmtree(root)
    partial = cache_dir / f".base-{key}.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    run(["tar", "--numeric-owner", "--zstd", "-xpf", str(tarball), "-C", str(partial)])
    (partial / ".gpufleet-base-complete").write_text(key + "\n")
    os.replace(partial, root)
    return root


if __name__ == "__main__":  # pragma: no cover - manual use
    print(ensure_base(Path(sys.argv[1])))
