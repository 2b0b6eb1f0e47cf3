"""The fact cache of the project's ansible.cfg (plugins/cache/jsonfile.py, gpufleet.fleet.jsonfile): the files of
ansible.builtin.jsonfile, each host's document decoded once per run instead of once per task and host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from ansible._internal._json._profiles import _cache_persistence
from ansible.plugins.loader import cache_loader, init_plugin_loader

REPO = Path(__file__).resolve().parents[3]
FACTS = {
    "gpu_facts": {"gpu_count": 8, "gpus": [{"index": i, "uuid": f"GPU-{i}", "memory_mib": 97887} for i in range(8)]},
    "model_weights_path": "/srv/models/org--model/0123456789abcdef0123456789abcdef01234567",
    "ratio": 0.85,
    "driver_loaded": True,
}


@pytest.fixture(scope="module", autouse=True)
def collection_loader():
    """Plugins found by their FQCN, as ansible-playbook finds them (ansible.cfg's collections_path)."""
    init_plugin_loader([str(REPO / "collections")])


def ours(folder: Path):
    """gpufleet.fleet.jsonfile as ansible-core hands it to the variable manager."""
    return cache_loader.get("gpufleet.fleet.jsonfile", _uri=str(folder))


def builtin(folder: Path):
    """ansible.builtin.jsonfile as ansible-core hands it to the variable manager (wrapped by its interposer)."""
    return cache_loader.get("ansible.builtin.jsonfile", _uri=str(folder))


def count_decodes(monkeypatch) -> list:
    """Decodes of a host's document (its payload, through ansible-core's cache decoder)."""
    calls = []
    loads = json.loads

    def counting(text, *args, **kwargs):
        if kwargs.get("cls") is _cache_persistence.Decoder:
            calls.append(len(text))
        return loads(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    return calls


def test_what_it_writes_ansible_builtin_jsonfile_reads(tmp_path):
    ours(tmp_path).set("gpu-01", FACTS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s1_gpu-01"]  # the builtin plugin's file name
    assert builtin(tmp_path).get("gpu-01") == FACTS


def test_it_reads_what_ansible_builtin_jsonfile_wrote(tmp_path):
    builtin(tmp_path).set("gpu-01", FACTS)
    cache = ours(tmp_path)
    assert cache.keys() == ["gpu-01"]
    assert cache.contains("gpu-01") and not cache.contains("gpu-02")
    assert cache.get("gpu-01") == FACTS
    with pytest.raises(KeyError):
        cache.get("gpu-02")


def test_a_host_is_decoded_once_per_run(tmp_path, monkeypatch):
    builtin(tmp_path).set("gpu-01", FACTS)
    cache = ours(tmp_path)
    assert type(cache).__module__ == "ansible_collections.gpufleet.fleet.plugins.cache.jsonfile"  # not wrapped
    decodes = count_decodes(monkeypatch)
    first = cache.get("gpu-01")
    for _ in range(50):  # the variable manager reads the host's facts for every task
        assert cache.get("gpu-01") is first
    assert len(decodes) == 1


def test_facts_set_during_the_run_are_read_back_without_decoding(tmp_path, monkeypatch):
    cache = ours(tmp_path)
    decodes = count_decodes(monkeypatch)
    cache.set("gpu-01", FACTS)
    assert cache.get("gpu-01") is FACTS
    assert decodes == []
    assert ours(tmp_path).get("gpu-01") == FACTS  # the next run reads the file


def test_delete_and_flush_remove_the_files(tmp_path):
    cache = ours(tmp_path)
    cache.set("gpu-01", FACTS)
    cache.set("gpu-02", FACTS)
    cache.delete("gpu-01")
    assert not cache.contains("gpu-01") and cache.keys() == ["gpu-02"]
    cache.flush()
    assert cache.keys() == [] and list(tmp_path.iterdir()) == []


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
    assert builtin(tmp_path / "facts").get("localhost")["staged_path"] == "/srv/models/m/rev"
