"""The AnsiballZ build cache (tools/ansible_speedups/callback_plugins/ansiballz_cache.py, opt-in with
tools/ansible_speedups/env.sh): a run reuses the module builds of earlier runs while no module or module_utils file
changed, and never keeps what it cannot key; on an ansible-core it was not tested with it warns and keeps nothing."""

from __future__ import annotations

import base64
import io
import os
import pickle
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from ansible_speedups import load_plugin, speedups_env  # tests/support

cache = load_plugin("callback", "ansiballz_cache")

REPO = Path(__file__).resolve().parents[3]
PLAY = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: A builtin module
      ansible.builtin.command: echo built
      changed_when: false
    - name: A module of the collection
      gpufleet.fleet.file_checksums:
        paths: [/etc/hostname]
"""


def run(tmp_path: Path, store: Path, *extra: str) -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               GPUFLEET_ANSIBALLZ_CACHE=str(store),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))  # fmt: skip
    env = speedups_env(env)  # the opt-in: . tools/ansible_speedups/env.sh
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local", "-vvv", str(play),
         "-e", f"ansible_python_interpreter={sys.executable}", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_a_second_run_reuses_the_first_runs_builds(tmp_path):
    store = tmp_path / "store"
    first = run(tmp_path, store)
    assert "ansiballz_cache: 0 builds reused, 2 kept" in first.stdout
    [digest] = list(store.iterdir())
    assert oct(store.stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in digest.iterdir()) == [
        "ansible.modules.command-ZIP_DEFLATED-none",
        "ansible_collections.gpufleet.fleet.plugins.modules.file_checksums-ZIP_DEFLATED-none",
    ]
    second = run(tmp_path, store)
    assert "ansiballz_cache: 2 builds reused, 0 kept" in second.stdout
    assert "built" in second.stdout  # the reused command module ran


def test_a_kept_build_carries_the_bytecode_that_the_host_imports_instead_of_compiling(tmp_path):
    store = tmp_path / "store"
    run(tmp_path, store)
    [digest] = list(store.iterdir())
    build = digest / "ansible_collections.gpufleet.fleet.plugins.modules.file_checksums-ZIP_DEFLATED-none"
    with build.open("rb") as handle:
        cached = pickle.load(handle)
    payload = zipfile.ZipFile(io.BytesIO(base64.b64decode(cached.zip_data)))
    sources = {n for n in payload.namelist() if n.endswith(".py")}
    assert "ansible/module_utils/basic.py" in sources
    assert {n for n in payload.namelist() if n.endswith(".pyc")} == {n + "c" for n in sources}
    # the module runs from the kept build (the second run) and what Python imports is the bytecode
    assert "built" in run(tmp_path, store).stdout
    payload_zip = tmp_path / "payload.zip"
    payload_zip.write_bytes(base64.b64decode(cached.zip_data))
    imported = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(payload_zip)!r}); "
         "import ansible.module_utils.basic as b; print(b.__file__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert imported.stdout.strip() == f"{payload_zip}/ansible/module_utils/basic.pyc"


def test_a_build_it_cannot_read_is_kept_as_it_is(tmp_path):
    build = tmp_path / "ansible.modules.command-ZIP_DEFLATED-none"
    build.write_bytes(b"not a pickle")
    assert not cache.keep_with_bytecode(str(build), str(tmp_path / "target"))
    assert cache.keep(str(tmp_path), str(tmp_path / "store"), set()) == [build.name]
    assert (tmp_path / "store" / build.name).read_bytes() == b"not a pickle"


def test_a_changed_module_utils_file_starts_a_new_set(tmp_path):
    folders = [str(tmp_path / "modules"), str(tmp_path / "module_utils")]
    for folder in folders:
        os.makedirs(folder)
    util = Path(folders[1]) / "helper.py"
    util.write_text("VALUE = 1\n")
    before = cache.sources_digest(folders)
    assert cache.sources_digest(folders) == before
    util.write_text("VALUE = 2\n")
    os.utime(util, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert cache.sources_digest(folders) != before
    (Path(folders[0]) / "new_module.py").write_text("")
    assert len({before, cache.sources_digest(folders)}) == 2


def test_the_digest_covers_the_collections_modules_and_module_utils():
    folders = cache.source_folders([str(REPO / "collections")])
    assert str(REPO / "collections/ansible_collections/gpufleet/fleet/plugins/module_utils") in folders
    assert str(REPO / "collections/ansible_collections/gpufleet/fleet/plugins/modules") in folders
    assert any(f.endswith("ansible/module_utils") for f in folders)


def test_builds_it_cannot_key_are_never_kept(tmp_path):
    run_cache, store = tmp_path / "run", tmp_path / "store"
    run_cache.mkdir()
    for name in ("ansible.legacy.my_role_module-ZIP_DEFLATED-none", "ansible.modules.copy-ZIP_DEFLATED-none.lock",
                 "ansible.modules.copy-ZIP_DEFLATED-none-part", "ansible.modules.copy-ZIP_DEFLATED-none"):  # fmt: skip
        (run_cache / name).write_text(name)
    assert cache.keep(str(run_cache), str(store), set()) == ["ansible.modules.copy-ZIP_DEFLATED-none"]
    fresh = tmp_path / "fresh"
    assert cache.seed(str(store), str(fresh)) == {"ansible.modules.copy-ZIP_DEFLATED-none"}
    assert (fresh / "ansible.modules.copy-ZIP_DEFLATED-none").read_text() == "ansible.modules.copy-ZIP_DEFLATED-none"


def test_only_the_most_recent_sets_are_kept(tmp_path):
    for age, name in enumerate(("newest", "mid", "old", "oldest")):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (time.time() - age * 100, time.time() - age * 100))
    cache.prune(str(tmp_path), str(tmp_path / "oldest"), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mid", "newest", "oldest"]  # the current one stays


def test_on_another_ansible_core_it_warns_and_keeps_nothing(tmp_path, monkeypatch):
    """It depends on ansible-core 2.19's build format: on another version it turns itself off, saying so."""
    assert cache.supported("2.19.4") and not cache.supported("2.20.0")
    monkeypatch.setattr(cache, "ANSIBLE_CORE_VERSION", "2.20.0")
    warnings = []
    plugin = cache.CallbackModule()
    monkeypatch.setattr(plugin._display, "warning", lambda text, *a, **k: warnings.append(text))
    plugin.set_options(direct={"folder": str(tmp_path / "store")})
    plugin.v2_playbook_on_stats(None)
    assert warnings and "is off: written for ansible-core 2.19.x, this is 2.20.0" in warnings[0]
    assert not (tmp_path / "store").exists()


def test_the_collection_and_the_default_config_use_no_private_api():
    """The shipped collection (plugins/) imports nothing of ansible._internal, and ansible.cfg enables neither
    speed-up (they are opt-in: tools/ansible_speedups/env.sh)."""
    private = [
        str(p.relative_to(REPO)) for p in (REPO / "plugins").rglob("*.py") if "ansible._internal" in p.read_text()
    ]
    assert private == []
    config = (REPO / "ansible.cfg").read_text()
    assert "ansiballz_cache" not in config and "gpufleet_jsonfile" not in config
