#!/usr/bin/python3
"""gpufleet: the gateway's worker record as metrics for node-exporter's textfile collector (roles/fleet_router).

The record (JSON ``{"workers": [<url>, ...]}``, kept by gpufleet.fleet.fleet_router_workers at every add and removal
through the product) is the intent: the workers this gateway should serve; the router's launcher starts smg with them.
systemd runs this script (gpufleet-router-record.service) whenever gpufleet-router-record.path sees the record change,
and the role runs it once at each install. It writes, atomically, a ``*.prom`` file that node-exporter serves:

  gpufleet_router_recorded_workers 3
  gpufleet_router_recorded_worker{worker="http://10.0.0.2:8000"} 1

The monitor compares them with smg's own list (``smg_worker_health``, -1 for a worker removed from it): a worker
removed or added through smg's API and not through the product (whose removal a restart would undo) fires
GpufleetRouterRecordDrift (docs/fleet-router.md, "The record is the intent").

  gpufleet_router_record_metrics.py <record.json> <output.prom>

Prints ``written`` or ``unchanged``; exit 1 when the record is not a worker record (the file then says
``gpufleet_router_record_readable 0``). Standard library only (the host's python3).
"""

from __future__ import annotations

import json
import os
import sys


def render(urls: list[str] | None) -> str:
    """The metrics of a record (None: a record that could not be read)."""
    lines = [
        "# HELP gpufleet_router_record_readable Whether the gateway's worker record could be read (1) or not (0).",
        "# TYPE gpufleet_router_record_readable gauge",
        f"gpufleet_router_record_readable {0 if urls is None else 1}",
    ]
    if urls is not None:
        lines += [
            "# HELP gpufleet_router_recorded_workers Workers in the gateway's record (the workers it should serve).",
            "# TYPE gpufleet_router_recorded_workers gauge",
            f"gpufleet_router_recorded_workers {len(urls)}",
            "# HELP gpufleet_router_recorded_worker A worker URL in the gateway's record.",
            "# TYPE gpufleet_router_recorded_worker gauge",
        ]
        lines += [f'gpufleet_router_recorded_worker{{worker="{url}"}} 1' for url in sorted(set(urls))]
    return "\n".join(lines) + "\n"


def read_record(path: str) -> list[str] | None:
    try:
        with open(path, encoding="utf-8") as f:
            urls = json.load(f)["workers"]
    except FileNotFoundError:
        return []  # no record yet: no worker should be served (the router's first start)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(urls, list) or not all(isinstance(u, str) and u.startswith("http") for u in urls):
        return None
    if any('"' in u or "\\" in u or "\n" in u for u in urls):
        return None  # not a URL a label can hold as written
    return [u.rstrip("/") for u in urls]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: gpufleet_router_record_metrics.py <record.json> <output.prom>", file=sys.stderr)
        return 2
    record, output = argv[1], argv[2]
    urls = read_record(record)
    text = render(urls)
    try:
        with open(output, encoding="utf-8") as f:
            same = f.read() == text
    except OSError:
        same = False
    if not same:
        os.makedirs(os.path.dirname(os.path.abspath(output)), mode=0o755, exist_ok=True)
        tmp = f"{output}.tmp"  # node-exporter reads only *.prom: never half a file
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    print("unchanged" if same else "written")
    if urls is None:
        print(f'{record} is not a worker record ({{"workers": [...]}})', file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
