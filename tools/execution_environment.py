"""The execution environment's build context: `ansible-builder create` of execution-environment.yml, checked. Run by
`make lint`.

    python tools/execution_environment.py [--context DIR]   # exit 1 naming what the context lacks

`ansible-builder create` writes the context (the Containerfile and `_build/`: requirements.txt, requirements.yml,
bindep.txt) into DIR (default: a temporary folder, removed afterwards) without building an image; it fails on a
definition that does not follow ansible-builder's schema. The context must then name every dependency the
collection declares:

- each package of meta/ee-requirements.txt in `_build/requirements.txt`, and each of them is a runtime dependency of
  pyproject.toml with the same specifier (one source for the controller's Python packages);
- each collection of requirements.yml, at its pinned version, in `_build/requirements.yml`, and every dependency of
  galaxy.yml among them;
- ansible-core of pyproject.toml in the Containerfile.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NAME_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")


def requirement_lines(text: str) -> dict[str, str]:
    """name (lower case) -> specifier of a requirements file's entries (comments and blank lines left out)."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = NAME_RE.match(line)
        if match:
            found[match.group(1).lower()] = match.group(2).replace(" ", "")
    return found


def pyproject_dependencies(root: Path) -> dict[str, str]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return requirement_lines("\n".join(project["dependencies"]))


def create(root: Path, context: Path) -> None:
    """`ansible-builder create` of the project's execution-environment.yml into `context`."""
    builder = Path(sys.executable).parent / "ansible-builder"
    done = subprocess.run(
        [builder, "create", "--file", root / "execution-environment.yml", "--context", context],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ansible-builder create failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def problems(root: Path, context: Path) -> list[str]:
    """What the build context in `context` lacks of the dependencies the project declares."""
    out = []
    build = context / "_build"
    wanted = requirement_lines((root / "meta" / "ee-requirements.txt").read_text())
    built = requirement_lines((build / "requirements.txt").read_text()) if (build / "requirements.txt").exists() else {}
    project = pyproject_dependencies(root)
    for name, spec in sorted(wanted.items()):
        if built.get(name) != spec:
            out.append(f"_build/requirements.txt: {name}{spec} missing (meta/ee-requirements.txt)")
        if project.get(name) != spec:
            out.append(
                f"meta/ee-requirements.txt: {name}{spec} is not pyproject.toml's ({project.get(name, 'absent')})"
            )
    collections = {
        c["name"]: str(c["version"]) for c in yaml.safe_load((root / "requirements.yml").read_text())["collections"]
    }
    in_context = {}
    if (build / "requirements.yml").exists():
        listed = yaml.safe_load((build / "requirements.yml").read_text()) or {}
        in_context = {c["name"]: str(c.get("version", "")) for c in listed.get("collections", [])}
    for name, version in sorted(collections.items()):
        if in_context.get(name) != version:
            out.append(f"_build/requirements.yml: {name} {version} missing (requirements.yml)")
    for name in sorted(yaml.safe_load((root / "galaxy.yml").read_text()).get("dependencies") or {}):
        if name not in collections:
            out.append(f"galaxy.yml depends on {name}, which requirements.yml (the image's collections) lacks")
    files = [p for p in (context / "Containerfile", context / "Dockerfile") if p.exists()]
    core = f"ansible-core{project.get('ansible-core', '')}"
    if not files or core not in files[0].read_text():
        out.append(f"Containerfile: {core} missing (pyproject.toml)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=Path, help="where to write the context (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpufleet-ee-") as tmp:
        context = args.context or Path(tmp) / "context"
        create(ROOT, context)
        found = problems(ROOT, context)
    for problem in found:
        print(f"tools/execution_environment.py: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
