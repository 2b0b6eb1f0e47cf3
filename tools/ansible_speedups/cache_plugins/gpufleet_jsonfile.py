"""Cache plugin (opt-in controller tooling, not part of the collection): ansible.builtin.jsonfile's fact files, each
host's document decoded once per run. It uses ansible-core's private cache encoder (``ansible._internal``), so it runs
only on the ansible-core minor version it was tested with (TESTED_ANSIBLE_CORE); on any other it warns and is exactly
ansible.builtin.jsonfile. Enable it with `. tools/ansible_speedups/env.sh` (docs/performance.md).

ansible-core 2.19 wraps every persistent cache plugin in an interposer (``ansible._internal._plugins._cache``) that
JSON-decodes the host's whole cached document on every read, and the variable manager reads it for every task and host.
With gpufleet's facts (gpu_facts, the derived NCCL settings, the preflight, the setup facts of the stage playbooks:
about 35 KB a host) that was 13 ms of the controller's single main process per task and host, before a worker is even
forked: cProfile of one forced restart by ``playbooks/deploy_server.yml`` on a lab host, 123 decodes for 111 task
results (docs/measurements/2026-12-03-controller-cpu.md, "The fact cache"). In a rollout batch that cost is paid once
per task and host of the batch, one after the other.

This plugin reads and writes exactly what ansible.builtin.jsonfile does (the same file names, schema prefix and
payload, through ansible-core's own cache encoder and decoder), so either plugin reads what the other wrote; it keeps
each document decoded in memory for the rest of the run, as the memory plugin keeps its values. It declares itself
not persistent to the plugin loader only so that the loader does not wrap it again.
"""

from __future__ import annotations

import json

from ansible.plugins.cache.jsonfile import CacheModule as JsonFileCacheModule
from ansible.release import __version__ as ANSIBLE_CORE_VERSION
from ansible.utils.display import Display

# The ansible-core minor version whose cache interposer and private encoder this plugin was written against and tested.
TESTED_ANSIBLE_CORE = "2.19."
SUPPORTED = ANSIBLE_CORE_VERSION.startswith(TESTED_ANSIBLE_CORE)
if SUPPORTED:
    # ansible-core's own encoder and decoder of persisted cache data (tags, vaulted values): its interposer's.
    from ansible._internal._json._profiles import _cache_persistence

DOCUMENTATION = """
    name: gpufleet_jsonfile
    short_description: JSON files, as ansible.builtin.jsonfile writes them, each decoded once per run
    description:
        - Saves each host's facts in a JSON file, the same file and format as C(ansible.builtin.jsonfile), so the two
          plugins can be swapped and read each other's files.
        - Unlike C(ansible.builtin.jsonfile) under ansible-core 2.19, a host's file is decoded once per run and kept
          in memory, not decoded again for every task and host.
    version_added: "0.1.0"
    author: gpufleet maintainers
    options:
      _uri:
        required: True
        description:
          - Path in which the cache plugin will save the JSON files
        env:
          - name: ANSIBLE_CACHE_PLUGIN_CONNECTION
        ini:
          - key: fact_caching_connection
            section: defaults
        type: path
      _prefix:
        description:
          - User defined prefix to use when creating the JSON files
          - Empty by default (ansible.builtin.jsonfile has no default, and its list of keys fails without a prefix).
        default: ""
        env:
          - name: ANSIBLE_CACHE_PLUGIN_PREFIX
        ini:
          - key: fact_caching_prefix
            section: defaults
      _timeout:
        default: 86400
        description: Expiration timeout for the cache plugin data
        env:
          - name: ANSIBLE_CACHE_PLUGIN_TIMEOUT
        ini:
          - key: fact_caching_timeout
            section: defaults
        type: integer
"""

PAYLOAD_KEY = "__payload__"


def file_key(key: str) -> str:
    """The key ansible-core stores a host under: the cache schema's prefix, then the host."""
    return f"s{_cache_persistence._Profile.schema_id}_{key}"


def host_key(stored: str) -> str | None:
    prefix = file_key("")
    return stored[len(prefix) :] if stored.startswith(prefix) else None


# The loader names a plugin's type after its class (CacheModule -> cache): one class of that name, chosen by version.
if SUPPORTED:

    class CacheModule(JsonFileCacheModule):  # noqa: F811 (one of two, by version)
        # The plugin loader wraps persistent plugins in the interposer that decodes on every read; this plugin encodes
        # and decodes itself (BaseCacheModule: "Plugins that do not persist data between runs can set False to bypass
        # schema-version key munging and JSON serialization wrapper").
        _persistent = False

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._decoded: dict[str, dict] = {}

        def get(self, key):
            if key not in self._decoded:
                stored = super().get(file_key(key))  # KeyError when absent or expired, as jsonfile
                self._decoded[key] = json.loads(stored[PAYLOAD_KEY], cls=_cache_persistence.Decoder)
            return self._decoded[key]

        def set(self, key, value):
            self._decoded[key] = value
            super().set(file_key(key), {PAYLOAD_KEY: json.dumps(value, cls=_cache_persistence.Encoder)})

        def keys(self):
            stored_keys = super().keys()
            return [k for k in (host_key(stored) for stored in stored_keys) if k is not None]

        def contains(self, key):
            return key in self._decoded or super().contains(file_key(key))

        def delete(self, key):
            self._decoded.pop(key, None)
            super().delete(file_key(key))

        def flush(self):
            self._decoded = {}
            super().flush()

else:

    class CacheModule(JsonFileCacheModule):
        """ansible.builtin.jsonfile as it is (an ansible-core this plugin was not tested with)."""

        def __init__(self, *args, **kwargs):
            Display().warning(
                f"gpufleet_jsonfile (tools/ansible_speedups) is ansible.builtin.jsonfile here: written for "
                f"ansible-core {TESTED_ANSIBLE_CORE}x, this is {ANSIBLE_CORE_VERSION}"
            )
            super().__init__(*args, **kwargs)
