"""tools/check_cited_results.py (in `make lint`): every result file a doc cites is tracked by git, on a tiny git
repository of its own."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("check_cited_results", REPO / "tools" / "check_cited_results.py")
check = importlib.util.module_from_spec(_spec)
sys.modules["check_cited_results"] = check
_spec.loader.exec_module(check)


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=root, check=True,
                   capture_output=True)  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A checkout with one committed result, one committed measurement page and an ignored artifacts folder."""
    root = tmp_path / "repo"
    (root / "benchmarks/results").mkdir(parents=True)
    (root / "benchmarks/results/noop.json").write_text("{}\n")
    (root / "docs/measurements").mkdir(parents=True)
    (root / "docs/measurements/2026-12-05-noop.md").write_text("# noop\n")
    (root / "tests/lab/artifacts").mkdir(parents=True)
    (root / "tests/lab/artifacts/faults.json").write_text("{}\n")
    (root / "tests/lab/test_x.py").write_text("")
    (root / ".gitignore").write_text("/tests/lab/artifacts/\n/tmp/\n.cache/\n")
    (root / "README.md").write_text("# r\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "start")
    return root


def write_doc(root: Path, text: str, name: str = "docs/perf.md") -> None:
    (root / name).write_text(text)


def found(root: Path) -> list[tuple[str, int, str, bool]]:
    return check.uncommitted(root)


def test_committed_results_and_pages_pass(repo):
    write_doc(repo, "Figures: `benchmarks/results/noop.json`, see docs/measurements/2026-12-05-noop.md.\n"
                    "All pages: `docs/measurements/`; results in benchmarks/results/.\n")  # fmt: skip
    assert found(repo) == []
    assert check.main(["--root", str(repo)]) == 0


def test_a_result_file_that_is_not_in_git_is_named_with_doc_and_line(repo, capsys):
    write_doc(repo, "# perf\n\nbest 6.75 s (`benchmarks/results/noop_fastpath.json`)\n")
    assert found(repo) == [("docs/perf.md", 3, "benchmarks/results/noop_fastpath.json", False)]
    assert check.main(["--root", str(repo)]) == 1
    assert "docs/perf.md:3: benchmarks/results/noop_fastpath.json is not in git" in capsys.readouterr().out


def test_a_file_in_an_ignored_folder_fails_even_where_it_exists(repo):
    assert (repo / "tests/lab/artifacts/faults.json").is_file()
    write_doc(repo, "Raw numbers: `tests/lab/artifacts/faults.json` of that run.\nlogs: tmp/perf/run-1.log\n")
    assert found(repo) == [
        ("docs/perf.md", 1, "tests/lab/artifacts/faults.json", True),
        ("docs/perf.md", 2, "tmp/perf/run-1.log", True),
    ]


def test_an_untracked_file_beside_committed_ones_fails(repo):
    (repo / "benchmarks/results/new.json").write_text("{}\n")
    write_doc(repo, "see benchmarks/results/new.json.\n")
    assert [f[2] for f in found(repo)] == ["benchmarks/results/new.json"]


def test_readme_contributing_and_nested_docs_are_read(repo):
    write_doc(repo, "`docs/measurements/gone.md`\n", name="README.md")
    write_doc(repo, "`.cache/durations.json`\n", name="CONTRIBUTING.md")
    write_doc(repo, "`benchmarks/results/gone.csv`\n", name="docs/measurements/2026-12-05-noop.md")
    assert sorted(found(repo)) == [
        ("CONTRIBUTING.md", 1, ".cache/durations.json", True),
        ("README.md", 1, "docs/measurements/gone.md", False),
        ("docs/measurements/2026-12-05-noop.md", 1, "benchmarks/results/gone.csv", False),
    ]


def test_a_folder_reference_needs_a_tracked_file_in_it(repo):
    write_doc(repo, "in `docs/measurements/` and `benchmarks/results/old/`\n")
    assert [f[2] for f in found(repo)] == ["benchmarks/results/old/"]


def test_a_path_said_to_be_outside_git_passes(repo):
    write_doc(repo, "Raw numbers: `tests/lab/artifacts/faults.json` (not in git: that run's file was not kept).\n")
    assert found(repo) == []


def test_what_is_no_repository_result_path_is_left_alone(repo):
    write_doc(
        repo,
        "`reports/<fleet>/bench/<host>/<t>.json`, `RUN/cC.jsonl`, `/tmp/fr8_new.json`, ~/x/y.json,\n"
        "https://example.org/benchmarks/results/x.json, `templates/fleet-report.html.j2`, `roles/x/tasks/main.yml`,\n"
        "`docs/measurements/<date>-x.md`, `benchmarks/results/*.json`, docs/measurements/2026-...md, bare.json,\n"
        "`../other/x.json`, `$OUT/x.json`\n",
    )
    assert found(repo) == []


def test_make_lint_runs_the_check():
    makefile = (REPO / "Makefile").read_text()
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "python tools/check_cited_results.py" in lint
