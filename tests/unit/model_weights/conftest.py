"""Fixtures for the model_weights tests: the lab test hub on loopback and the staging module's code.

The hub tests use the real ``huggingface_hub`` client (pinned in the project's dev dependencies) against
lab/testhub on 127.0.0.1; they are skipped when it is not installed. Nothing reaches the real hub:
HF_ENDPOINT points at the test hub and every call passes it explicitly.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import socket
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "lab"))
MODULE_PATH = REPO / "plugins" / "modules" / "model_weights_stage.py"

from testhub.model import REPO_ID, generate  # noqa: E402
from testhub.server import make_server  # noqa: E402

GOOD = "hf_unit_good_token_0123456789"
NOACCESS = "hf_unit_noaccess_token_0123456789"


def load_stage_module():
    """The module's code: the thin module file loads (its imports resolve), and the staging logic it runs."""
    spec = importlib.util.spec_from_file_location("model_weights_stage", MODULE_PATH)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return importlib.import_module("ansible_collections.gpufleet.fleet.plugins.module_utils.model_weights_stager")


@pytest.fixture(scope="session")
def stage_mod():
    return load_stage_module()


@pytest.fixture(scope="session")
def hub_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("hub")
    desc = generate(data)
    return data, desc


class Hub:
    def __init__(self, server, data, desc):
        self.server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self.data = data
        self.desc = desc
        self.state = server.RequestHandlerClass.state
        self.refs = desc["repos"][REPO_ID]["refs"]

    def faults(self, **faults):
        with self.state.lock:
            self.state.faults.update(faults)

    def log(self):
        with self.state.lock:
            return list(self.state.log)

    def manifest(self, commit):
        files = self.server.RequestHandlerClass.hub.files(REPO_ID, commit)
        return {name: e["sha256"] for name, e in files.items()}


@pytest.fixture
def hub(hub_data, monkeypatch):
    data, desc = hub_data
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server("127.0.0.1", port, data, {GOOD: [REPO_ID], NOACCESS: []})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    h = Hub(server, data, desc)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    # The project runs tests with HF_HUB_OFFLINE=1 (nothing may reach the real hub). These tests talk to
    # the loopback test hub only, so they lift it; huggingface_hub reads it once at import, hence both.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        import huggingface_hub.constants as hf_constants
    except ImportError:
        pass
    else:
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(data / "hf-home"))
    yield h
    server.shutdown()
    server.server_close()


@pytest.fixture
def token_file(tmp_path):
    def make(token):
        path = tmp_path / f"token-{abs(hash(token))}"
        path.write_text(token + "\n")
        os.chmod(path, 0o600)
        return str(path)

    return make


def params(**overrides):
    base = {
        "source": "hf",
        "dest": None,
        "repo_id": REPO_ID,
        "revision": "main",
        "endpoint": None,
        "token_file": None,
        "allow_patterns": None,
        "ignore_patterns": None,
        "mirror_url": None,
        "manifest_url": None,
        "manifest": None,
        "source_path": None,
        "headroom_bytes": 0,
        "headroom_ratio": 0.0,
        "verify": "quick",
        "max_workers": 2,
        "retries": 2,
        "disable_xet": True,
        "timeout": 10,
        "progress_file": None,
        "headers": {},
    }
    base.update(overrides)
    return base


def dump(obj) -> str:
    return json.dumps(obj, indent=2, default=str)
