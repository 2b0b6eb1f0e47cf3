"""Make the checkout importable as the collection gpufleet.fleet for every test.

`make setup` links collections/ansible_collections/gpufleet/fleet to the root (tools/install_collections.py),
so tests import product code exactly as Ansible does:
``from ansible_collections.gpufleet.fleet.plugins.module_utils import sglang_server_systemd``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / "collections"
if not (COLLECTIONS / "ansible_collections" / "gpufleet" / "fleet" / "galaxy.yml").exists():
    raise RuntimeError(f"{COLLECTIONS}/ansible_collections/gpufleet/fleet is missing: run `make collections`")
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
SUPPORT = REPO / "tests" / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
