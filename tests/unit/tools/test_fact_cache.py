"""The opt-in fact cache (tools/ansible_speedups/cache_plugins/gpufleet_jsonfile.py, `. tools/ansible_speedups/env.sh`):
the files of ansible.builtin.jsonfile, each host's document decoded once per run instead of once per task and host;
on an ansible-core it was not tested with, exactly ansible.builtin.jsonfile, with a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FACTS = {
    "gpu_facts": {"gpu_count": 8, "gpus": [{"index": i, "uuid": f"GPU-{i}", "memory_mib": 97887} for i in range(8)]},
    "model_weights_path": "/srv/models/org--model/0123456789abcdef0123456789abcdef01234567",
    "ratio": 0.85,
    "driver_loaded": True,
}
SPEEDUPS = REPO / "tools" / "ansible_speedups" / "cache_plugins"
# Each check runs in a fresh Python that finds plugins as ansible-playbook does with the opt-in environment (its cache
# plugin folder added to the loader, the plugin asked for by name).
PRELUDE = """
import json, sys
from ansible._internal._json._profiles import _cache_persistence
from ansible.plugins.loader import cache_loader, init_plugin_loader
init_plugin_loader([sys.argv[1]])
cache_loader.add_directory(sys.argv[4])
FOLDER, FACTS = sys.argv[2], json.loads(sys.argv[3])
ours = lambda: cache_loader.get("gpufleet_jsonfile", _uri=FOLDER)  # as the variable manager gets it
builtin = lambda: cache_loader.get("ansible.builtin.jsonfile", _uri=FOLDER)  # wrapped by ansible-core's interposer
decodes = []
loads = json.loads
def counting(text, *args, **kwargs):  # decodes of a host's document (its payload, through the cache decoder)
    if kwargs.get("cls") is _cache_persistence.Decoder:
        decodes.append(len(text))
    return loads(text, *args, **kwargs)
json.loads = counting
out = {}
"""


def check(folder: Path, code: str) -> dict:
    """Run code after PRELUDE in a fresh Python; the dict it leaves in ``out``."""
    script = PRELUDE + textwrap.dedent(code) + "\nprint(json.dumps(out, default=str))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(REPO / "collections"), str(folder), json.dumps(FACTS), str(SPEEDUPS)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_what_it_writes_ansible_builtin_jsonfile_reads(tmp_path):
    out = check(tmp_path, """
        ours().set("gpu-01", FACTS)
        out["read"] = builtin().get("gpu-01")
    """)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s1_gpu-01"]  # the builtin plugin's file name
    assert out["read"] == FACTS


def test_it_reads_what_ansible_builtin_jsonfile_wrote(tmp_path):
    out = check(tmp_path, """
        builtin().set("gpu-01", FACTS)
        cache = ours()
        out.update(keys=cache.keys(), has=cache.contains("gpu-01"), has_other=cache.contains("gpu-02"),
                   read=cache.get("gpu-01"))
        try:
            cache.get("gpu-02")
        except KeyError:
            out["missing"] = "KeyError"
    """)  # fmt: skip
    assert out == {"keys": ["gpu-01"], "has": True, "has_other": False, "read": FACTS, "missing": "KeyError"}


def test_a_host_is_decoded_once_per_run(tmp_path):
    out = check(tmp_path, """
        builtin().set("gpu-01", FACTS)
        cache = ours()
        out["plugin"] = type(cache).__module__  # the loader did not wrap it in the interposer
        decodes.clear()
        first = cache.get("gpu-01")
        out["same"] = all(cache.get("gpu-01") is first for _ in range(50))  # read for every task and host
        out["decodes"] = len(decodes)
        wrapped = builtin()
        decodes.clear()
        for _ in range(3):
            wrapped.get("gpu-01")
        out["builtin_decodes"] = len(decodes)
    """)  # fmt: skip
    assert out["plugin"].endswith("gpufleet_jsonfile")
    assert out["same"] is True and out["decodes"] == 1
    assert out["builtin_decodes"] == 3  # why the plugin exists: ansible.builtin.jsonfile decodes on every read


def test_facts_set_during_the_run_are_read_back_without_decoding(tmp_path):
    out = check(tmp_path, """
        cache = ours()
        decodes.clear()
        cache.set("gpu-01", FACTS)
        out["same"] = cache.get("gpu-01") is FACTS
        out["decodes"] = len(decodes)
        out["next_run"] = ours().get("gpu-01")  # a new plugin object reads the file
    """)  # fmt: skip
    assert out == {"same": True, "decodes": 0, "next_run": FACTS}


def test_delete_and_flush_remove_the_files(tmp_path):
    out = check(tmp_path, """
        cache = ours()
        cache.set("gpu-01", FACTS)
        cache.set("gpu-02", FACTS)
        cache.delete("gpu-01")
        out["after_delete"] = [cache.contains("gpu-01"), cache.keys()]
        cache.flush()
        out["after_flush"] = cache.keys()
    """)  # fmt: skip
    assert out == {"after_delete": [False, ["gpu-02"]], "after_flush": []}
    assert list(tmp_path.iterdir()) == []


def test_the_project_config_keeps_a_fact_from_one_run_for_the_next(tmp_path):
    """ansible-playbook with the project's ansible.cfg: a cacheable fact of one run is a variable of the next (as
    model_weights_path is for restart.yml after deploy.yml), and the file is ansible.builtin.jsonfile's."""
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.set_fact: {cacheable: true, staged_path: /srv/models/m/rev}\n"
        "      when: step == 'write'\n"
        "    - ansible.builtin.debug: {msg: 'read back {{ staged_path }}'}\n"
        "      when: step == 'read'\n"
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))  # fmt: skip
    for step in ("write", "read"):
        proc = subprocess.run(
            [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local", str(play), f"-estep={step}"],
            cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "read back /srv/models/m/rev" in proc.stdout
    out = check(tmp_path / "facts", 'out["staged"] = builtin().get("localhost")["staged_path"]')
    assert out["staged"] == "/srv/models/m/rev"


def test_on_another_ansible_core_it_is_ansible_builtin_jsonfile_with_a_warning(tmp_path, monkeypatch):
    """It uses ansible-core 2.19's private cache encoder: on another version it never imports it and is the builtin
    plugin as it is, saying so."""
    import ansible.release
    from ansible.plugins.cache.jsonfile import CacheModule as Builtin
    from ansible.utils.display import Display
    from ansible_speedups import load_plugin  # tests/support

    monkeypatch.setattr(ansible.release, "__version__", "2.20.0")
    warnings = []
    monkeypatch.setattr(Display, "warning", lambda self, text, *a, **k: warnings.append(text))
    module = load_plugin("cache", "gpufleet_jsonfile", "gpufleet_jsonfile_on_2_20")
    assert module.SUPPORTED is False and "_cache_persistence" not in vars(module)
    assert (
        module.CacheModule.__mro__[1] is Builtin
        and not hasattr(module.CacheModule, "_persistent")
        or (module.CacheModule._persistent is Builtin._persistent)
    )
    module.CacheModule(_uri=str(tmp_path))
    assert (
        warnings and "is ansible.builtin.jsonfile here: written for ansible-core 2.19.x, this is 2.20.0" in warnings[0]
    )
