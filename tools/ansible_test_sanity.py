"""`ansible-test sanity` on the collection as it ships: run by `make lint`.

    python tools/ansible_test_sanity.py [--keep] [ANSIBLE-TEST SANITY ARGS...]   # e.g. --test validate-modules

ansible-test needs the collection at a real path `.../ansible_collections/gpufleet/fleet` (the checkout's
`collections/` link resolves away), so this builds one in a temporary folder: the files git knows (tracked, and
untracked ones git does not ignore, as they are in the working tree) are copied out, `ansible-galaxy collection
build` makes the artifact from them (galaxy.yml's `build_ignore` leaves out the lab, the tests, the tooling) and the
artifact is unpacked under `ansible_collections/gpufleet/fleet`. Sanity therefore checks exactly what a user
installs; `tests/sanity/ignore-<ansible version>.txt`, which does not ship, is copied in beside it. The collections
of `collections/` (requirements.yml: community.proxmox, whose module_utils the proxmox modules import, ...) are
linked in beside it for the import test.

Then `ansible-test sanity --local --python 3.11` runs every test that applies to a collection (`--skip-test` or
`--test` narrow it): all but `changelog`, which checks antsibull-changelog fragments (`changelogs/`, which this
collection does not keep: CHANGELOG.md is written by hand). ansible-test puts each test's requirements (pylint,
yamllint, voluptuous, ...) in its own virtual environment, pinned by ansible-test, from PyPI; they are kept in
`.cache/ansible-test/` (ansible-test's `~/.ansible/test`, with HOME pointed there), so only the first run installs
them and the project's venv is never touched. ansible-test fills an empty environment with pip through a
`get-pip.py` from ci-files.testing.ansible.com; where that host is unreachable (CI, this lab) the cache holds a
stand-in written here: it installs the pip wheel that Python bundles (`ensurepip`) and then runs `pip install` with
the arguments ansible-test passes (the pinned pip from PyPI), which is what get-pip.py does. A real get-pip.py
already in the cache is left alone.

Exit status: ansible-test's (0 when every test passes).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import ansible_test
import yaml

ROOT = Path(__file__).resolve().parent.parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
CACHE_HOME = Path(os.environ.get("GPUFLEET_ANSIBLE_TEST_HOME", ROOT / ".cache" / "ansible-test"))
# get-pip.py's own options, which `pip install` does not know.
GET_PIP_ONLY = ("--no-setuptools", "--no-wheel", "--no-pip")
STAND_IN = f'''"""Stand-in for get-pip.py written by gpufleet's tools/ansible_test_sanity.py
(ci-files.testing.ansible.com is unreachable): pip from the wheel Python bundles (ensurepip), then
`pip install` with this script's arguments."""
import subprocess
import sys

# in a process of its own: ensurepip sets PIP_CONFIG_FILE=/dev/null in its environment, which would hide pip.conf
subprocess.check_call([sys.executable, "-m", "ensurepip"])
args = [a for a in sys.argv[1:] if a not in {GET_PIP_ONLY!r}]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
'''


def bootstrap_pip_version() -> str:
    """The pip version ansible-test bootstraps into its environments (the name of its cached get-pip script)."""
    source = Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
    match = re.search(r"\bpip='(\d+(?:\.\d+)+)'", source.read_text())
    if not match:
        sys.exit(f"tools/ansible_test_sanity.py: no pip version found in {source}; update bootstrap_pip_version()")
    return match.group(1)


def write_stand_in(home: Path) -> None:
    script = home / ".ansible" / "test" / "cache" / f"get_pip_{bootstrap_pip_version().replace('.', '_')}.py"
    if not script.exists() or "Stand-in for get-pip.py" in script.read_text():
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(STAND_IN)


def git_files(root: Path) -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    )
    return sorted({name for name in done.stdout.decode().split("\0") if name})


def export(root: Path, dest: Path) -> None:
    """Copy the files git knows, as they are in the working tree (links kept as links)."""
    for name in git_files(root):
        source = root / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in git
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def build_tree(root: Path, work: Path) -> Path:
    """The collection as it ships, at work/ansible_collections/<namespace>/<name>. Returns that folder."""
    galaxy = yaml.safe_load((root / "galaxy.yml").read_text())
    source, dist = work / "source", work / "dist"
    export(root, source)
    bindir = Path(sys.executable).parent
    subprocess.run(
        [bindir / "ansible-galaxy", "collection", "build", source, "--output-path", dist],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    collections = work / "ansible_collections"
    tree = collections / galaxy["namespace"] / galaxy["name"]
    tree.mkdir(parents=True)
    with tarfile.open(dist / f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz") as tar:
        tar.extractall(tree, filter="data")
    for ignore in sorted((root / "tests" / "sanity").glob("ignore-*.txt")):
        (tree / "tests" / "sanity").mkdir(parents=True, exist_ok=True)
        shutil.copy2(ignore, tree / "tests" / "sanity" / ignore.name)
    # The other collections the code imports (community.proxmox's module_utils) or names, beside it.
    installed = root / "collections" / "ansible_collections"
    for namespace in sorted(p for p in installed.glob("*") if p.is_dir()):
        for collection in sorted(p for p in namespace.glob("*") if p.is_dir()):
            if (namespace.name, collection.name) == (galaxy["namespace"], galaxy["name"]):
                continue
            (collections / namespace.name).mkdir(exist_ok=True)
            (collections / namespace.name / collection.name).symlink_to(collection.resolve())
    return tree


def check_home(home: Path) -> None:
    """ansible-test's environments live under HOME; their scripts' shebang lines (#!<venv>/bin/python) must stay
    within Linux's 127 characters."""
    longest = home / ".ansible/test/venv/sanity.validate-modules" / PYTHON / "01234567/bin/python"
    if len(f"#!{longest}") > 127:
        sys.exit(f"tools/ansible_test_sanity.py: {home} is too long a path for ansible-test's environments (shebang "
                 "lines over 127 characters); set GPUFLEET_ANSIBLE_TEST_HOME to a shorter folder")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree (its path is printed)")
    args, rest = parser.parse_known_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-sanity-"))
    try:
        tree = build_tree(ROOT, work)
        check_home(CACHE_HOME)
        CACHE_HOME.mkdir(parents=True, exist_ok=True)
        write_stand_in(CACHE_HOME)
        # the collection alone: none of the checkout's Ansible settings (make test's opt-in speed-ups) or lab modules
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
        env["HOME"] = str(CACHE_HOME)
        command = [Path(sys.executable).parent / "ansible-test", "sanity", "--local", "--python", PYTHON]
        # changelog checks antsibull-changelog fragments (changelogs/); CHANGELOG.md is written by hand
        command += ["--color", "no", "--skip-test", "changelog", *rest]
        return subprocess.run(command, cwd=tree, env=env, check=False).returncode
    finally:
        if args.keep:
            print(f"tools/ansible_test_sanity.py: the tree is kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
