"""tools/ansible_test_sanity.py (`make lint`): the tree ansible-test sanity checks is the collection as it ships, at
a real ansible_collections/gpufleet/fleet path, and the pip bootstrap stand-in never replaces a real get-pip.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

import ansible_test_sanity as sanity  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (Path(sys.executable).parent / "ansible-galaxy").exists(), reason="needs the project's venv (make venv)"
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return sanity.build_tree(REPO, tmp_path_factory.mktemp("sanity"))


def test_the_tree_is_the_built_collection_at_a_real_path(tree):
    assert tree.parts[-3:] == ("ansible_collections", "gpufleet", "fleet") and not tree.is_symlink()
    assert (tree / "MANIFEST.json").is_file() and (tree / "plugins" / "modules" / "gpu_facts.py").is_file()
    # galaxy.yml's build_ignore: nothing of the checkout's equipment is checked as if it shipped
    for left_out in ("lab", "tools", "benchmarks", "molecule", "roles/sglang_server/molecule", "tests/unit"):
        assert not (tree / left_out).exists(), left_out
    # the ignore file (tests/ does not ship) is beside it, and the collections it imports from
    assert (tree / "tests" / "sanity" / "ignore-2.19.txt").read_text() == (
        REPO / "tests" / "sanity" / "ignore-2.19.txt"
    ).read_text()
    assert (tree.parents[1] / "community" / "proxmox" / "plugins").is_dir()


def test_every_ignore_entry_says_why():
    for line in (REPO / "tests" / "sanity" / "ignore-2.19.txt").read_text().splitlines():
        entry, _sep, reason = line.partition("  # ")
        assert len(entry.split(" ")) == 2 and len(reason) > 20, line


def test_the_stand_in_never_replaces_a_real_bootstrap_script(tmp_path):
    sanity.write_stand_in(tmp_path)
    (script,) = (tmp_path / ".ansible" / "test" / "cache").glob("get_pip_*.py")
    assert "ensurepip" in script.read_text()
    compile(script.read_text(), str(script), "exec")
    script.write_text("# the real get-pip.py\n")
    sanity.write_stand_in(tmp_path)
    assert script.read_text() == "# the real get-pip.py\n"
