"""Every result file a document cites is in git: run by `make lint`.

    python tools/check_cited_results.py [--root DIR]   # exit 1 listing doc:line and path of each uncommitted one

Scans README.md, CONTRIBUTING.md and docs/**/*.md for cited files: any path under `benchmarks/results/` or
`docs/measurements/`, and any relative path with a folder ending in .json, .jsonl, .log, .txt or .csv that lies in
the repository (its first folder is one git tracks, or git ignores the path: `.cache/`, `tmp/`, `reports/`,
`tests/lab/artifacts/`). A figure is only as good as the file behind it, so each such path must be tracked
(`git ls-files`); a file in an ignored folder is not. A path folder (ending in `/`) must hold a tracked file.

Left out: absolute paths, URLs, bare file names, and patterns (`<host>`, `{x}`, `*`, `...`, `$VAR` next to the path).
A doc that names a file on purpose that is not in git (a run's artifact, a runtime cache) says so right after the
path, `(not in git` (e.g. "`tests/lab/artifacts/monitoring-faults.json` (not in git: that run's file was not
kept)"), and does not present the file as what backs a figure.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT_SUFFIXES = (".json", ".jsonl", ".log", ".txt", ".csv")
RESULT_PREFIXES = ("benchmarks/results/", "docs/measurements/")
NOT_IN_GIT = "(not in git"
# A path token: segments of word characters, dots and dashes joined by '/', at least one '/'. Not preceded by what
# would make it the tail of a longer path, a URL, a home or absolute path or a pattern.
PATH_RE = re.compile(r"(?<![\w./~$<>{}*:@-])([\w.-]+(?:/[\w.-]+)+/?)")
PATTERN_NEXT = tuple("<{*$")


def documents(root: Path) -> list[Path]:
    docs = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("**/*.md"))]
    return [d for d in docs if d.is_file()]


def cited_paths(line: str) -> list[str]:
    """The result paths a line cites, as written (not yet sorted by where they lie)."""
    found = []
    for m in PATH_RE.finditer(line):
        path, after = m.group(1).rstrip("."), line[m.end() :]  # rstrip: a sentence's full stop
        if after.startswith(PATTERN_NEXT) or "..." in path or "/../" in f"/{path}/":
            continue
        path = path.removeprefix("./")
        if not (path.startswith(RESULT_PREFIXES) or path.endswith(RESULT_SUFFIXES)):
            continue
        if after.lstrip("`").lstrip().startswith(NOT_IN_GIT):
            continue
        found.append(path)
    return found


def git(root: Path, *args: str, stdin: str = "") -> list[str]:
    """git's NUL-separated answer (`-z`) as a list."""
    out = subprocess.run(["git", *args], cwd=root, input=stdin, capture_output=True, text=True, check=False).stdout
    return [p for p in out.split("\0") if p]


def uncommitted(root: Path) -> list[tuple[str, int, str, bool]]:
    """(doc, line number, path, whether git ignores it) for each cited result path in the repository that git does
    not track."""
    tracked = set(git(root, "ls-files", "-z"))
    if not tracked:
        raise SystemExit(f"{root}: no file tracked by git (not a git checkout?)")
    folders = {p.rsplit("/", 1)[0] + "/" for p in tracked if "/" in p}
    top = {p.split("/", 1)[0] for p in tracked}
    missing = []
    for doc in documents(root):
        rel = doc.relative_to(root).as_posix()
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for path in cited_paths(line):
                held = any(f.startswith(path) for f in folders) if path.endswith("/") else path in tracked
                if not held:
                    missing.append((rel, number, path))
    paths = sorted({p for _, _, p in missing})
    ignored = set(git(root, "check-ignore", "-z", "--stdin", "--no-index", stdin="\0".join(paths))) if paths else set()
    # A path whose first folder git does not track lies in the repository only where git ignores it.
    return [(rel, n, p, p in ignored) for rel, n, p in missing if p.split("/", 1)[0] in top or p in ignored]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    found = uncommitted(root)
    for rel, number, path, ignored in found:
        print(f"{rel}:{number}: {path} is not in git" + (" (git ignores it)" if ignored else ""))
    if found:
        print(
            f"{len(found)} cited file(s) not in git: commit the file, cite the committed file that holds the figure, "
            f"or say {NOT_IN_GIT}: ...) right after the path and qualify the figure",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
