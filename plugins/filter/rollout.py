"""Filters of the rollout role (playbooks/rollout.yml): the batch plan of a
rolling deploy (Ansible's own `serial` arithmetic) and the capacity guard (disruption budget)."""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.filter.fleet_router import multinode_nodes


def _pct_to_int(value, total: int) -> int:
    """ansible.utils.helpers.pct_to_int, as the playbook executor uses it for `serial`."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return int((int(value.strip()[:-1]) / 100.0) * total) or 1
    return int(value)


def rollout_batches(hosts: list, serial) -> list[list]:
    """The batches Ansible makes from `serial` (PlaybookExecutor._get_serialized_batches): each item is a
    count or a percentage of all hosts, the last item repeats, a value <= 0 takes every remaining host."""
    items = serial if isinstance(serial, list) else [serial]
    items = items or [-1]
    remaining, total, batches, index = list(hosts), len(hosts), [], 0
    while remaining:
        size = _pct_to_int(items[index], total)
        if size <= 0:
            batches.append(remaining)
            break
        batches.append(remaining[:size])
        remaining = remaining[size:]
        index = min(index + 1, len(items) - 1)
    return batches


def rollout_worker_models(hosts: list, hostvars) -> dict:
    """{host: model} for the capacity guard: rollout_model of the host, else the served-model-name of its
    sglang_server_args_model, else "default"."""
    models = {}
    for host in hosts:
        hv = hostvars[host]
        model = hv.get("rollout_model") or (hv.get("sglang_server_args_model") or {}).get("served-model-name")
        models[host] = str(model or "default")
    return models


def rollout_hostvar(hosts: list, hostvars, name: str, default=None) -> dict:
    """{host: hostvars[host][name]} with a default for hosts that lack it (an unreachable host never set it)."""
    return {h: hostvars[h].get(name, default) if h in hostvars else default for h in hosts}


def rollout_engine_time(timings: dict) -> float:
    """The engine's own time on a host's restart path, from its deploy report's ``timings``: the stop (``systemctl
    stop``: SGLang drains on SIGTERM, and 0.5.9's sigterm_watchdog looks every 5 s, so even an idle engine takes
    0-5 s) plus the start to ready (weights, KV cache, CUDA graphs). 0 for a host that did not restart."""
    timings = timings or {}
    stop, warm_up = timings.get("deploy_stop_s"), timings.get("deploy_engine_start_to_ready_s")
    return round(float(stop or 0) + float(warm_up or 0), 3)


def rollout_setting_differences(hosts: list, hostvars, names: list) -> list[str]:
    """The rollout settings (``names``) whose value is not the same on every host of the run, one sentence each: a
    rollout is one run (its batches, budget, locks, drain and report are the run's), so its settings are read once,
    from the first host, and a host that sets another value would be ignored without this refusal."""
    problems = []
    for name in names:
        values = {h: hostvars[h].get(name) for h in hosts}
        distinct = {repr(v) for v in values.values()}
        if len(distinct) > 1:
            first = hosts[0]
            others = [h for h in hosts if repr(values[h]) != repr(values[first])]

            def shown(value):  # a host that does not set it gets the role's default
                return "the role default" if value is None else repr(value)

            problems.append(
                f"{name} differs between hosts ({first}: {shown(values[first])}; {', '.join(others[:5])}"
                f"{' and others' if len(others) > 5 else ''}: {shown(values[others[0]])}): it is a setting of the "
                "whole rollout; set it once (group_vars of every server, or -e)"
            )
    return problems


def rollout_decisions(hosts: list, hostvars, pipeline: str, staged: list) -> dict:
    """What the plays before the batches found on each worker of the rollout: {"restart": [...], "unchanged": [...],
    "refused": {host: why}}, hosts in the order given.

    pipeline server: the converged check ran on every host (registered sglang_server_converged); a host it proved
    in place (converged, and not in ``staged``, the hosts the server stage ran on) was proven by a generation where
    it runs and never leaves the router. The server stage ran with sglang_server_restart_deferred on the staged
    hosts at once: a host whose result is `deferred` must restart (in its batch), one whose result is `unchanged`
    was proven where it runs; a host whose role failed there (fact rollout_plan_refusal) or that gave no result
    (unreachable) refuses the whole rollout. pipeline full: the earlier stages run in the batches and can change
    what the server runs, so every host takes its turn."""
    decided: dict = {"restart": [], "unchanged": [], "refused": {}}
    for name in hosts:
        if pipeline != "server":
            decided["restart"].append(name)
            continue
        hv = hostvars.get(name, {})
        if name not in staged:
            check = hv.get("sglang_server_converged") or {}
            if check.get("converged") is True:
                decided["unchanged"].append(name)
            else:
                decided["refused"][name] = "no answer from the converged check (unreachable?)"
            continue
        refusal = hv.get("rollout_plan_refusal")
        result = str(hv.get("sglang_server_result", ""))
        if refusal is not None:
            decided["refused"][name] = str(refusal) or "the server stage failed"
        elif result == "deferred":
            decided["restart"].append(name)
        elif result == "unchanged":
            decided["unchanged"].append(name)
        else:
            decided["refused"][name] = f"no decision from the server stage (result {result or 'none'}: unreachable?)"
    return decided


def _max_unavailable(value, total: int) -> int:
    if isinstance(value, str) and value.strip().endswith("%"):
        return max(1, int(int(value.strip()[:-1]) / 100.0 * total))
    return int(value)


def rollout_min_in_router(total: int, max_unavailable) -> int:
    """Workers of ``total`` that stay in the router while a rollout takes out at most ``max_unavailable`` (a
    count or a percentage, rollout_max_unavailable), at least 1 while there is a worker: the floor the monitor's
    critical alert on a gateway's healthy workers watches."""
    total = int(total)
    if total < 1:
        return 0
    return max(1, total - _max_unavailable(max_unavailable, total))


def rollout_capacity_problems(batches: list, models: dict, in_router: list, max_unavailable) -> list[str]:
    """Problems of a batch plan against the disruption budget, one sentence each (empty: the plan is safe).

    batches: the planned batches (host names); models: {host: model} for every worker of the fleet (also
    hosts outside this run); in_router: hosts healthy in the router now; max_unavailable: a count or a
    percentage of a model's workers. During a batch a model's unavailable workers are those not healthy in
    the router now plus the batch's hosts; they must stay <= max_unavailable, and at least one healthy
    worker of the model must stay in the router."""
    problems = []
    by_model: dict[str, list] = {}
    for host, model in models.items():
        by_model.setdefault(model, []).append(host)
    healthy = set(in_router)
    for number, batch in enumerate(batches, start=1):
        for model, workers in sorted(by_model.items()):
            budget = _max_unavailable(max_unavailable, len(workers))
            out = {h for h in workers if h not in healthy} | {h for h in batch if models.get(h) == model}
            left = [h for h in workers if h not in out]
            if not left:
                problems.append(
                    f"batch {number} ({', '.join(batch)}) would take the last healthy worker of model {model!r} "
                    f"out of the router (workers: {', '.join(workers)}; healthy in the router now: "
                    f"{', '.join(sorted(healthy & set(workers))) or 'none'})"
                )
            elif len(out) > budget:
                problems.append(
                    f"batch {number} ({', '.join(batch)}) would have {len(out)} workers of model {model!r} out of "
                    f"the router ({', '.join(sorted(out))}), more than rollout_max_unavailable={max_unavailable} "
                    f"({budget} of {len(workers)})"
                )
    return problems


def rollout_multinode_problems(hosts: list, hostvars, groups) -> list[str]:
    """One sentence per multi-node server among the rollout's hosts (empty: none). Serial batches cannot keep a
    server's nodes together and its non-zero ranks serve no HTTP to drain: playbooks/deploy_server.yml restarts
    such servers (its restart plan takes a server's nodes in one batch)."""
    servers = []
    for host in hosts:
        group = hostvars[host].get("sglang_server_multinode_group")
        nodes = multinode_nodes(host, group, groups)
        if len(nodes) > 1 and (nodes, group) not in servers:
            servers.append((nodes, group))
    return [
        f"{', '.join(nodes)} are one multi-node server (sglang_server_multinode_group={group}), whose nodes must "
        "restart together, which rollout.yml's serial batches cannot guarantee: restart it with "
        "playbooks/deploy_server.yml (its restart plan takes a server's nodes in one batch) and roll the other "
        f"hosts with -l '!{group}'"
        for nodes, group in servers
    ]


# Why a host of the run is out of the router at the end, by its rollout state (roles/rollout tasks/host.yml).
_OUT_WHY = {
    "failed": "its restart failed and it was not proven healthy again",
    "rolled_back": "rolled back, but its /health did not answer 200 at the add-back",
    "refused": "refused before its restart, and its /health did not answer 200 at the add-back",
    "not_readded": "deployed, but the router did not take it back",
    "gate_failed": "its deploy report did not pass the gate",
    "untouched": "it was out of the router before this run reached it",
    "unchanged": "it was out of the router and this run did not put it back",
    "updated": "deployed, but out of the router at the end",
    "bench_gate_failed": "deployed, but out of the router at the end",
}


def rollout_router_account(states: dict, urls: dict, healthy_urls: list) -> dict:
    """Where every host of the run is at the end, from the gateways' own lists (not from what the run meant to do;
    ``healthy_urls``: the worker URLs healthy in every gateway, rollout_gateway_view's ``healthy``):
    ``{"in": [hosts healthy in the router], "out": {host: why}}``; ``why`` follows the host's rollout state (a host
    out of the router that the run did not take out says so)."""
    healthy = {str(u).rstrip("/") for u in healthy_urls or []}
    account = {"in": [], "out": {}}
    for host in sorted(states):
        if str(urls.get(host, "")).rstrip("/") in healthy:
            account["in"].append(host)
        else:
            state = str(states[host])
            account["out"][host] = f"{state}: {_OUT_WHY.get(state, 'out of the router at the end')}"
    return account


def rollout_gateway_view(results) -> dict:
    """One view of the fleet's gateways from a fleet_router_workers task looped over them (its registered
    ``results``, one per gateway, ``item`` the gateway host). A worker counts as in the router only when every
    gateway lists it healthy (a client may reach any of them); ``in_router_urls`` likewise (added back everywhere);
    ``left_out`` and ``drain`` are the union (the drain runs on the last gateway, once the worker left every one);
    ``invocations`` maps each gateway to its router unit's systemd InvocationID; ``failed`` each gateway that could
    not be read (its message), ``failed_text`` the same as one line (``gw: message; ...``) for a refusal or a report."""
    results = [r for r in (results or []) if isinstance(r, dict) and not r.get("skipped")]

    def common(sets: list) -> list:
        return sorted(set.intersection(*sets)) if sets else []

    healthy, in_router, by_gateway, invocations = [], [], {}, {}
    left_out, drain, failed = {}, {}, {}
    for r in results:
        gateway = str(r.get("item", ""))
        urls = {str(w.get("url", "")).rstrip("/") for w in r.get("workers") or [] if w.get("is_healthy")}
        healthy.append(urls)
        by_gateway[gateway] = sorted(urls)
        in_router.append(set(r.get("in_router_urls") or []))
        invocations[gateway] = r.get("router_invocation", "")
        left_out.update(r.get("left_out") or {})
        drain.update(r.get("drain") or {})
        if r.get("failed") or r.get("unreachable"):
            failed[gateway] = str(r.get("msg", "")) or ("unreachable" if r.get("unreachable") else "failed")
    return {
        "healthy": common(healthy),
        "in_router_urls": common(in_router),
        "by_gateway": by_gateway,
        "invocations": invocations,
        "left_out": left_out,
        "drain": drain,
        "failed": failed,
        "failed_text": "; ".join(f"{gateway}: {msg}" for gateway, msg in failed.items()),
        "unavailable_s": max((float(r.get("router_unavailable_s") or 0) for r in results), default=0.0),
    }


class FilterModule:
    def filters(self):
        return {
            "rollout_min_in_router": rollout_min_in_router,
            "rollout_batches": rollout_batches,
            "rollout_capacity_problems": rollout_capacity_problems,
            "rollout_worker_models": rollout_worker_models,
            "rollout_hostvar": rollout_hostvar,
            "rollout_engine_time": rollout_engine_time,
            "rollout_decisions": rollout_decisions,
            "rollout_multinode_problems": rollout_multinode_problems,
            "rollout_setting_differences": rollout_setting_differences,
            "rollout_router_account": rollout_router_account,
            "rollout_gateway_view": rollout_gateway_view,
        }
