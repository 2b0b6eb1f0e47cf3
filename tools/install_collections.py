"""Install the collections of requirements.yml into the project-local collections path.

Two sources:
  galaxy  the usual `ansible-galaxy collection install -r requirements.yml` (needs Galaxy or a Galaxy mirror);
  pypi    the same collection versions taken from the PyPI `ansible` distribution wheel, which bundles
          them, and installed with `ansible-galaxy collection install --offline` (works where only PyPI is
          reachable). Each requested version must equal the bundled one, or the install is refused.
Idempotent: collections already installed at the requested version are left alone.

The checkout itself is the collection gpufleet.fleet (galaxy.yml at the root): it is linked as
<dest>/ansible_collections/gpufleet/fleet -> the root, so ansible-playbook, ansible-lint, Molecule and pytest
resolve gpufleet.fleet.* (modules, filters, module_utils, roles, playbooks) to the working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

# The `ansible` distribution whose bundled collections match requirements.yml (ansible-core 2.19 line).
ANSIBLE_DISTRIBUTION = "12.3.0"


def installed_version(dest: Path, fqcn: str) -> str | None:
    manifest = dest / "ansible_collections" / Path(*fqcn.split(".")) / "MANIFEST.json"
    if not manifest.exists():
        return None
    return json.loads(manifest.read_text())["collection_info"]["version"]


def download_distribution(cache: Path) -> Path:
    wheel = cache / f"ansible-{ANSIBLE_DISTRIBUTION}-py3-none-any.whl"
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--dest",
                str(cache),
                f"ansible=={ANSIBLE_DISTRIBUTION}",
            ],
            check=True,
        )
    return wheel


def install_from_pypi(missing: list[dict], dest: Path, cache: Path, galaxy: str) -> None:
    wheel = download_distribution(cache)
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        for req in missing:
            ns, name = req["name"].split(".")
            prefix = f"ansible_collections/{ns}/{name}/"
            members = [m for m in zf.namelist() if m.startswith(prefix)]
            if not members:
                raise SystemExit(f"{req['name']} is not bundled in ansible {ANSIBLE_DISTRIBUTION}")
            zf.extractall(tmp, members)
            src = Path(tmp, prefix)
            bundled = json.loads((src / "MANIFEST.json").read_text())["collection_info"]["version"]
            if str(req.get("version", bundled)) != bundled:
                raise SystemExit(
                    f"requirements.yml asks for {req['name']} {req['version']} but ansible "
                    f"{ANSIBLE_DISTRIBUTION} bundles {bundled}: align the versions or use --source galaxy"
                )
            subprocess.run(
                [galaxy, "collection", "install", "--offline", "--force", "-p", str(dest), str(src)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            print(f"installed {req['name']} {bundled} from the PyPI ansible {ANSIBLE_DISTRIBUTION} distribution")


def link_self(dest: Path, root: Path) -> None:
    """Link <dest>/ansible_collections/<namespace>/<name> to the root (the collection of galaxy.yml)."""
    galaxy = yaml.safe_load((root / "galaxy.yml").read_text())
    link = dest / "ansible_collections" / galaxy["namespace"] / galaxy["name"]
    target = os.path.relpath(root, link.parent)
    if link.is_symlink() and os.readlink(link) == target:
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.exists():
        raise SystemExit(f"{link} exists and is not a link to the checkout: remove it and rerun make collections")
    link.symlink_to(target, target_is_directory=True)
    print(f"linked {galaxy['namespace']}.{galaxy['name']} ({link}) to the checkout")


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=["pypi", "galaxy"], default="pypi")
    parser.add_argument("--requirements", type=Path, default=root / "requirements.yml")
    parser.add_argument("--dest", type=Path, default=root / "collections")
    parser.add_argument("--cache", type=Path, default=root / ".cache" / "collections")
    args = parser.parse_args()
    galaxy = shutil.which("ansible-galaxy", path=str(Path(sys.executable).parent)) or "ansible-galaxy"
    link_self(args.dest, root)
    wanted = yaml.safe_load(args.requirements.read_text())["collections"]
    missing = [r for r in wanted if installed_version(args.dest, r["name"]) != str(r.get("version"))]
    if not missing:
        print(f"collections up to date in {args.dest}")
        return 0
    if args.source == "galaxy":
        subprocess.run(
            [galaxy, "collection", "install", "-r", str(args.requirements), "-p", str(args.dest)], check=True
        )
    else:
        install_from_pypi(missing, args.dest, args.cache, galaxy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
