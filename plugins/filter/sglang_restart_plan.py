"""Filter sglang_restart_plan: which hosts restart, in which order and batches (playbooks/deploy_server.yml).

Hosts that need no restart are done in the parallel plan play and never wait in line; the others restart
in batches of at most ``serial`` hosts, each multi-node server (its nodes restart together) whole in one
batch. Pure Python, unit-tested in tests/unit/sglang_server/test_restart_plan.py.
"""

from __future__ import annotations

import math


class RestartPlanError(ValueError):
    pass


def _batch_limit(serial, total: int) -> int:
    text = str(serial).strip()
    try:
        if text.endswith("%"):
            return max(1, math.floor(total * float(text[:-1]) / 100))
        limit = int(text)
    except ValueError as exc:
        raise RestartPlanError(
            f"sglang_server_serial must be a positive integer or a percentage, got {serial!r}"
        ) from exc
    if limit < 1:
        raise RestartPlanError(f"sglang_server_serial must be a positive integer or a percentage, got {serial!r}")
    return limit


def sglang_restart_plan(hosts, serial=1):
    restarting = {h["name"] for h in hosts if h.get("restart")}
    units: list[list[str]] = []
    seen: set[str] = set()
    for h in hosts:
        name = h["name"]
        if name not in restarting or name in seen:
            continue
        nodes = list(h.get("nodes") or [name])
        if len(nodes) > 1:
            missing = [n for n in nodes if n not in restarting]
            if missing:
                raise RestartPlanError(
                    f"multi-node server {', '.join(nodes)}: {', '.join(missing)} would not restart with {name}"
                )
            unit = nodes
        else:
            unit = [name]
        seen.update(unit)
        units.append(unit)
    limit = _batch_limit(serial, max(1, len(restarting)))
    batches: list[int] = []
    current = 0
    for unit in units:
        if current and current + len(unit) > limit:
            batches.append(current)
            current = 0
        current += len(unit)
    if current:
        batches.append(current)
    return {"order": [n for unit in units for n in unit], "batches": batches, "units": units}


def sglang_restart_hosts(names, hostvars):
    """The input of sglang_restart_plan from the plan play's hosts: restart = result `deferred`."""
    out = []
    for name in names:
        hv = hostvars[name]
        out.append(
            {
                "name": name,
                "restart": str(hv.get("sglang_server_result", "")) == "deferred",
                "nodes": list(hv.get("sglang_server_nodes") or [name]),
            }
        )
    return out


def sglang_unconverged_hosts(names, hostvars, groups):
    """The hosts a deploy.yml runs every stage on: those the converged check did not prove (its
    ``sglang_server_converged.converged``), and every node of a multi-node server (the hosts of its
    ``sglang_server_multinode_group``) of which one node was not proven, since its nodes restart together."""
    proven = {n for n in names if (hostvars[n].get("sglang_server_converged") or {}).get("converged") is True}
    out = []
    for name in names:
        group = str(hostvars[name].get("sglang_server_multinode_group") or "")
        nodes = [n for n in (groups.get(group) or []) if n in names] if group else [name]
        if not all(n in proven for n in nodes or [name]):
            out.append(name)
    return out


def sglang_converged_summary(names, hostvars, deploy_hosts):
    """One line per host of the converged check: proven in place (by a generation, with its seconds, or through its
    rank 0), or why every stage runs on it."""
    lines = []
    for name in names:
        check = hostvars[name].get("sglang_server_converged") or {}
        if name not in deploy_hosts:
            seconds = (check.get("health") or {}).get("seconds", "")
            how = f" by a generation ({seconds} s)" if str(seconds) else " (rank 0 answered for the server)"
            lines.append(
                f"{name}: converged, proven in place{how}; every stage skipped "
                "(sglang_server_converged_fast_path=false runs them)"
            )
        else:
            reasons = list(check.get("reasons") or []) or ["a node of its multi-node server differs"]
            lines.append(f"{name}: every stage runs: {'; '.join(reasons)}")
    return lines


class FilterModule:
    def filters(self):
        return {
            "sglang_restart_plan": sglang_restart_plan,
            "sglang_restart_hosts": sglang_restart_hosts,
            "sglang_unconverged_hosts": sglang_unconverged_hosts,
            "sglang_converged_summary": sglang_converged_summary,
        }
