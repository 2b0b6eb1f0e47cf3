#!/usr/bin/python
"""Free a server host's disk of the ml-env releases and model revisions nothing uses (module_utils/disk_prune)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: disk_prune
short_description: Remove the old ml-env releases and model revisions that nothing uses, until the disk has room
author: gpufleet maintainers (!UNKNOWN)
description:
  - A candidate is a folder under one of I(roots) (its children, or with C(depth=2) its grandchildren, such as
    C(/srv/models/<name>/<revision>)); links are never candidates.
  - A candidate is kept when it is, holds or lies inside the target of one of I(keep_links) (ml_env's C(current) and
    C(previous)), when one of I(keep_files) names it (the server's unit, its last-known-good and previous-good
    manifests), or when it changed within I(min_age_s) (a release or a download being written).
  - The others are removed oldest first (modification time), each only while its filesystem has less than
    I(free_ratio) of its size free; a disk with room loses nothing. Check mode removes nothing and says what would go.
options:
  roots:
    type: list
    elements: dict
    required: true
    description: Folders whose children (C(depth) 1, the default) or grandchildren (C(depth) 2) are candidates;
      each C({path, depth}).
  keep_links:
    type: list
    elements: path
    default: []
    description: Links whose targets are in use (a missing link is skipped).
  keep_files:
    type: list
    elements: path
    default: []
    description: Files whose text names the paths in use (a missing file is skipped).
  free_ratio:
    type: float
    default: 0.2
    description: The free share of a filesystem's size to reach; above it nothing is removed.
  min_age_s:
    type: int
    default: 3600
    description: A candidate changed more recently than this is kept.
attributes:
  check_mode:
    support: full
    description: Says what would be removed; removes nothing.
  diff_mode:
    support: none
    description: No diff.
"""

EXAMPLES = r"""
- name: Prune until a tenth is free again
  gpufleet.fleet.disk_prune:
    roots:
      - {path: /opt/ml-env/releases, depth: 1}
      - {path: /srv/models, depth: 2}
    keep_links: [/opt/ml-env/current, /opt/ml-env/previous]
    keep_files: [/etc/systemd/system/sglang-server.service, /var/lib/gpufleet/sglang-server/last-good/manifest.json]
    free_ratio: 0.2
"""

RETURN = r"""
removed:
  type: list
  elements: dict
  returned: always
  description: The folders removed (or, in check mode, that would be), C({path, bytes}), oldest first.
kept:
  type: list
  elements: str
  returned: always
  description: The candidates kept because something uses them or they are new.
freed_bytes:
  type: int
  returned: always
  description: Bytes of the removed folders.
free_ratio_before:
  type: float
  returned: always
  description: The lowest free share of the candidates' filesystems before (null without a candidate).
free_ratio_after:
  type: float
  returned: always
  description: The same after (in check mode, as if the folders were removed).
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.disk_prune import prune


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "roots": {"type": "list", "elements": "dict", "required": True},
            "keep_links": {"type": "list", "elements": "path", "default": []},
            "keep_files": {"type": "list", "elements": "path", "default": []},
            "free_ratio": {"type": "float", "default": 0.2},
            "min_age_s": {"type": "int", "default": 3600},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not 0 < p["free_ratio"] <= 1:
        module.fail_json(msg=f"free_ratio must be above 0 and at most 1, got {p['free_ratio']}")
    for root in p["roots"]:
        if not str(root.get("path", "")).startswith("/") or int(root.get("depth", 1)) not in (1, 2):
            module.fail_json(msg=f"each root needs an absolute path and depth 1 or 2, got {root}")
    result = prune(
        p["roots"], p["keep_links"], p["keep_files"], p["free_ratio"], p["min_age_s"], remove=not module.check_mode
    )
    module.exit_json(changed=bool(result["removed"]), **result)


if __name__ == "__main__":
    main()
