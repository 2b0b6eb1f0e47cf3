"""promtool on the controller, from Debian 12's own Prometheus package (2.42.0+ds): no Prometheus daemon runs here.

    python3 tools/promtool.py            # fetch (once) and print the path of promtool
    python3 tools/promtool.py --check    # the same, then run `promtool --version` and print its first line too

The first call runs ``apt-get download prometheus=<version>`` (the version Debian's lists offer, which must be
2.42.0+ds-*, the monitor's Prometheus) into ``.cache/promtool/``, extracts ``usr/bin/promtool`` with
``dpkg-deb -x``, proves that it runs (``promtool --version`` names 2.42.0) and keeps only that binary as
``.cache/promtool/bin/promtool`` (with ``bin/promtool.version``, the package version); the .deb is deleted. A later
call finds the binary and does nothing else (no apt, no subprocess). Nothing is installed into the system: the
package's postinst (a ``prometheus`` user, a service) never runs.

Where the apt lists have no ``prometheus`` (a fresh machine: apt-get update never ran), it runs
``apt-get update`` once, as root only, and tries again. Exit status 1, with the reason on stderr, when promtool
cannot be had; tests must then fail, not skip. Standard library only (`make setup` runs it before the venv).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GPUFLEET_PROMTOOL_CACHE", ROOT / ".cache" / "promtool"))
PACKAGE = "prometheus"
# Debian 12 (bookworm) ships 2.42.0+ds-5+deb12u1; a point release keeps the upstream version.
VERSION_RE = re.compile(r"^2\.42\.0\+ds-")
UPSTREAM = "2.42.0"


def binary(cache: Path = CACHE) -> Path:
    return cache / "bin" / "promtool"


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def candidate_version() -> str | None:
    """The version of `prometheus` that apt would download, or None when the lists do not know the package."""
    done = _run(["apt-cache", "policy", PACKAGE])
    match = re.search(r"^\s*Candidate:\s*(\S+)", done.stdout, re.M)
    if done.returncode != 0 or not match or match.group(1) == "(none)":
        return None
    return match.group(1)


def _fail(message: str) -> None:
    sys.exit(f"tools/promtool.py: {message}")


def fetch(cache: Path = CACHE) -> Path:
    """Download the package, extract promtool, check it runs, keep it in the cache. Returns its path."""
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            _fail(f"{tool} not found: promtool comes from Debian 12's prometheus package (a Debian controller)")
    version = candidate_version()
    if version is None and os.geteuid() == 0:
        update = _run(["apt-get", "update", "-qq"])
        if update.returncode != 0:
            _fail(f"apt-get update failed:\n{update.stderr.strip()}")
        version = candidate_version()
    if version is None:
        _fail(f"apt knows no {PACKAGE} package (run `apt-get update` as root, on Debian 12)")
    if not VERSION_RE.match(version):
        _fail(f"apt offers {PACKAGE} {version}; the monitor runs Debian 12's {UPSTREAM}+ds: refusing another promtool")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=cache) as tmp:
        work = Path(tmp)
        # as root, apt downloads as _apt, who cannot write into the cache: download as root, unsandboxed (no warning)
        sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
        done = _run(["apt-get", "download", "-qq", *sandbox, f"{PACKAGE}={version}"], cwd=work)
        debs = sorted(work.glob(f"{PACKAGE}_*.deb"))
        if done.returncode != 0 or len(debs) != 1:
            _fail(f"apt-get download {PACKAGE}={version} failed (exit {done.returncode}):\n{done.stderr.strip()}")
        tree = work / "tree"
        done = _run(["dpkg-deb", "-x", str(debs[0]), str(tree)])
        extracted = tree / "usr" / "bin" / "promtool"
        if done.returncode != 0 or not extracted.is_file():
            _fail(f"dpkg-deb -x {debs[0].name} gave no usr/bin/promtool:\n{done.stderr.strip()}")
        check = _run([str(extracted), "--version"])
        first = (check.stdout or check.stderr).strip().splitlines()[:1]
        if check.returncode != 0 or not first or f"version {UPSTREAM}" not in first[0]:
            _fail(f"the extracted promtool does not run as {UPSTREAM} (exit {check.returncode}): {first}")
        target = binary(cache)
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(".promtool.tmp")
        shutil.copy2(extracted, staged)
        staged.chmod(0o755)
        target.with_name("promtool.version").write_text(version + "\n")
        os.replace(staged, target)  # last: a binary in place means a finished, checked fetch
    return target


def ensure(cache: Path = CACHE) -> Path:
    target = binary(cache)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    return fetch(cache)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="also run `promtool --version` and print its first line")
    args = parser.parse_args(argv)
    path = ensure()
    print(path)
    if args.check:
        done = _run([str(path), "--version"])
        if done.returncode != 0:
            _fail(f"{path} --version exited {done.returncode}: {done.stderr.strip()}")
        print((done.stdout or done.stderr).strip().splitlines()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
