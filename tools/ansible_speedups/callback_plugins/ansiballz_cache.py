"""Callback plugin (opt-in controller tooling, not part of the collection): ansible-core's AnsiballZ module builds kept
from one ansible-playbook run to the next. It depends on ansible-core's module build format and on CPython's import
internals, so it runs only on the ansible-core minor version it was tested with (TESTED_ANSIBLE_CORE) and turns itself
off with a warning on any other. Enable it with `. tools/ansible_speedups/env.sh` (docs/performance.md).

ansible-core builds each module it sends (the module and every module_utils file it imports, found by parsing their
sources, zipped) once per run, in the run's own temporary folder, and deletes it at the end: about 0.3 CPU s per
distinct module per run on this project's controllers (docs/measurements/2026-12-03-controller-cpu.md, "Module builds").
A no-op deploy_server.yml on one lab host builds 12 modules; the project's test suite starts hundreds of runs.

At the start of a run this plugin copies the builds of earlier runs into the run's cache folder, where ansible-core
looks first; at the end it keeps the run's new builds. The builds are kept under a digest of everything a build is
made from: the ansible-core and Python versions and the path, size and modification time of every file under the
module and module_utils folders of ansible-core and of every collection on the collections path. Any change there
(a module edited, a collection installed) starts a new, empty set. Modules found outside those folders (a role's
``library``, ``ansible.legacy`` names) are never kept. The folder is the controller user's (0700), like ansible-core's
own temporary folder, since a build is a pickle that ansible-core loads.

A kept build also carries the bytecode of every Python file of its zip (hash-based ``.pyc`` beside each ``.py``, checked
against the source, compiled by the controller's Python). The module runs from that zip on the managed host (zipimport),
and Python compiles every module it imports from a zip again in every run, since it cannot write a cache there:
importing ansible's ``module_utils.basic`` and a module cost 0.35-0.39 CPU s from the plain zip and 0.23 s with the
bytecode (docs/measurements/2026-12-03-controller-cpu.md). A host whose Python is of another minor version finds the
bytecode's magic number wrong and compiles the sources as before (zipimport's fallback).
"""

from __future__ import annotations

import _imp
import base64
import dataclasses
import hashlib
import importlib._bootstrap_external as bootstrap_external
import io
import os
import pickle
import platform
import shutil
import tempfile
import zipfile

import ansible
from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.release import __version__ as ANSIBLE_CORE_VERSION
from ansible.utils.collection_loader import AnsibleCollectionConfig

DOCUMENTATION = """
    name: ansiballz_cache
    type: aggregate
    short_description: Keep ansible-core's AnsiballZ module builds from one run to the next
    description:
        - Copies the module builds of earlier runs into the run's AnsiballZ cache folder at the start, and keeps the
          run's new builds at the end, under a digest of the ansible-core and Python versions and of every file of the
          module and module_utils folders of ansible-core and the collections (path, size, modification time).
        - Builds of modules outside those folders (ansible.legacy names, a role's library) are never kept.
        - A kept build carries the bytecode of its Python files (hash-based .pyc, checked against the source), which a
          managed host's Python of the controller's minor version imports instead of compiling the sources.
    version_added: "0.1.0"
    author: gpufleet maintainers
    requirements:
        - enabled in callbacks_enabled
    options:
      folder:
        description: Where the builds are kept (one sub-folder per digest; created 0700).
        default: ~/.ansible/gpufleet/ansiballz
        type: path
        env:
          - name: GPUFLEET_ANSIBALLZ_CACHE
        ini:
          - section: gpufleet
            key: ansiballz_cache
      keep:
        description: How many digests' folders are kept (the most recently used).
        default: 4
        type: int
        env:
          - name: GPUFLEET_ANSIBALLZ_CACHE_KEEP
        ini:
          - section: gpufleet
            key: ansiballz_cache_keep
"""

# The ansible-core minor version whose module build format and run cache this plugin was written against and tested on.
TESTED_ANSIBLE_CORE = "2.19."


def supported(version: str | None = None) -> bool:
    return (ANSIBLE_CORE_VERSION if version is None else version).startswith(TESTED_ANSIBLE_CORE)


# ansible-core's run cache: <local tmp of the run>/ansiballz_cache/<module fqn>-<compression>-<extensions>
RUN_CACHE = "ansiballz_cache"
# Builds of these names come only from the folders the digest covers.
KEPT_PREFIXES = ("ansible.modules.", "ansible_collections.")


def source_folders(collection_paths) -> list[str]:
    """Every folder a kept build's sources can come from."""
    core = os.path.dirname(ansible.__file__)
    folders = [os.path.join(core, "modules"), os.path.join(core, "module_utils")]
    for root in collection_paths:
        base = os.path.join(root, "ansible_collections")
        if not os.path.isdir(base):
            continue
        for namespace in sorted(os.listdir(base)):
            if not os.path.isdir(os.path.join(base, namespace)):
                continue
            for name in sorted(os.listdir(os.path.join(base, namespace))):
                for kind in ("modules", "module_utils"):
                    folder = os.path.join(base, namespace, name, "plugins", kind)
                    if os.path.isdir(folder):
                        folders.append(folder)
    return folders


def sources_digest(folders: list[str]) -> str:
    """sha256 of the versions and of every file's real path, size and mtime under the folders."""
    digest = hashlib.sha256(f"{ansible.__version__}\0{platform.python_version()}\0".encode())
    for folder in folders:
        for path, dirs, files in os.walk(os.path.realpath(folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                full = os.path.join(path, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                digest.update(f"{full}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def kept(name: str) -> bool:
    return name.startswith(KEPT_PREFIXES) and not name.endswith((".lock", "-part"))


def seed(store: str, run_cache: str) -> set[str]:
    """Copy the kept builds into the run's cache folder; the names copied."""
    if not os.path.isdir(store):
        return set()
    os.makedirs(run_cache, exist_ok=True)
    seeded = set()
    for name in os.listdir(store):
        if kept(name) and not os.path.exists(os.path.join(run_cache, name)):
            # ansible-core never writes a build in place (a new one is renamed over it), so a link is safe
            try:
                os.link(os.path.join(store, name), os.path.join(run_cache, name))
            except OSError:
                shutil.copyfile(os.path.join(store, name), os.path.join(run_cache, name))
            seeded.add(name)
    return seeded


def keep(run_cache: str, store: str, seeded: set[str]) -> list[str]:
    """Copy the run's new builds into the store (each through a temporary file and a rename); the names kept."""
    if not os.path.isdir(run_cache):
        return []
    os.makedirs(store, mode=0o700, exist_ok=True)
    added = []
    for name in sorted(os.listdir(run_cache)):
        if not kept(name) or name in seeded or os.path.exists(os.path.join(store, name)):
            continue
        fd, tmp = tempfile.mkstemp(dir=store, prefix=".part-")
        os.close(fd)
        if not keep_with_bytecode(os.path.join(run_cache, name), tmp):
            shutil.copyfile(os.path.join(run_cache, name), tmp)
        os.replace(tmp, os.path.join(store, name))
        added.append(name)
    return added


def with_bytecode(zip_data: bytes) -> bytes:
    """The zip with a hash-based, source-checked .pyc beside each .py that has none (the controller Python's)."""
    source = zipfile.ZipFile(io.BytesIO(zip_data))
    names = set(source.namelist())
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, data)
            if not info.filename.endswith(".py") or info.filename + "c" in names:
                continue
            code = compile(data, info.filename, "exec", dont_inherit=True)
            pyc = bootstrap_external._code_to_hash_pyc(
                code, _imp.source_hash(bootstrap_external._RAW_MAGIC_NUMBER, data), checked=True
            )
            compiled = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
            compiled.compress_type = info.compress_type
            target.writestr(compiled, pyc)
    return out.getvalue()


def keep_with_bytecode(build: str, target: str) -> bool:
    """Write the build with its bytecode to target; False (nothing written) when the build is not one this
    ansible-core's AnsiballZ cache format (a pickled object with base64 ``zip_data``) or a file fails to compile."""
    try:
        with open(build, "rb") as handle:
            cached = pickle.load(handle)  # noqa: S301 - ansible-core's own build, which it loads the same way
        zip_data = with_bytecode(base64.b64decode(cached.zip_data, validate=True))
        cached = dataclasses.replace(cached, zip_data=base64.b64encode(zip_data))
    except (AttributeError, TypeError, ValueError, SyntaxError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError):
        return False
    with open(target, "wb") as handle:
        pickle.dump(cached, handle)
    return True


def prune(root: str, current: str, keep_count: int) -> None:
    """Remove all but the keep_count most recently used digest folders (never the current one)."""
    folders = [os.path.join(root, d) for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))]
    folders.sort(key=os.path.getmtime, reverse=True)
    for folder in folders[max(keep_count, 1) :]:
        if os.path.realpath(folder) != os.path.realpath(current):
            shutil.rmtree(folder, ignore_errors=True)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super().__init__(display=display)
        self._store = ""
        self._run_cache = ""
        self._seeded: set[str] = set()
        self._on = False

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self._on = supported()
        if not self._on:
            self._display.warning(
                f"ansiballz_cache (tools/ansible_speedups) is off: written for ansible-core {TESTED_ANSIBLE_CORE}x, "
                f"this is {ANSIBLE_CORE_VERSION}; runs are as without it"
            )
            return
        root = self.get_option("folder")
        os.makedirs(root, mode=0o700, exist_ok=True)
        os.chmod(root, 0o700)
        self._root = root
        self._store = os.path.join(root, sources_digest(source_folders(AnsibleCollectionConfig.collection_paths)))
        self._run_cache = os.path.join(C.DEFAULT_LOCAL_TMP, RUN_CACHE)
        self._seeded = seed(self._store, self._run_cache)
        if os.path.isdir(self._store):
            os.utime(self._store)  # most recently used

    def v2_playbook_on_stats(self, stats):
        if not self._on:
            return
        added = keep(self._run_cache, self._store, self._seeded)
        if added:
            prune(self._root, self._store, self.get_option("keep"))
        self._display.vvv(f"ansiballz_cache: {len(self._seeded)} builds reused, {len(added)} kept in {self._store}")
