"""The fleet benchmark's CPU accounting (benchmarks/suite/fleet_rollout.py): each rollout batch's window is charged
to the controller, the gateway host, and the server hosts split into their engines and the rest, from cgroup
counters sampled every 0.2 s, where an engine's cgroup goes away and comes back with every restart."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("fleet_rollout", REPO / "benchmarks/suite/fleet_rollout.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_a_counter_that_only_grows_is_charged_its_growth():
    assert bench.counter_increase([1.0, 1.5, 2.0]) == pytest.approx(1.0)


def test_a_restarted_engine_is_charged_before_its_stop_and_from_zero_after_its_start():
    # the old engine's cgroup at 3.0 s, then 3.5 s; stopped (no cgroup); the new one counts 0.2 s, then 0.9 s
    assert bench.counter_increase([3.0, 3.5, None, 0.2, 0.9]) == pytest.approx(0.5 + 0.9)


def test_an_engine_restarted_between_two_samples_is_seen_by_its_count_going_down():
    assert bench.counter_increase([3.0, 3.5, 0.3, 0.8]) == pytest.approx(0.5 + 0.8)


def test_an_engine_started_inside_the_window_is_charged_all_of_its_count():
    assert bench.counter_increase([None, 0.4, 1.0]) == pytest.approx(1.0)
    assert bench.counter_increase([None]) == 0.0


def test_a_batch_window_splits_the_server_hosts_into_engines_and_the_rest():
    sampler = bench.CpuSampler()
    # (time, controller main, controller all, {host: (host cgroup, engine cgroup)})
    # (..., the machine's busy CPU seconds)
    sampler.samples = [
        (10.0, 1.0, 2.0, {"lab-01": (5.0, 4.0), "lab-02": (6.0, 4.5), "lab-router-01": (1.0, None)}, 100.0),
        (10.2, 1.2, 2.5, {"lab-01": (5.5, None), "lab-02": (6.5, 4.9), "lab-router-01": (1.1, None)}, 100.3),
        (10.4, 1.3, 2.9, {"lab-01": (7.0, 1.2), "lab-02": (7.0, 5.2), "lab-router-01": (1.3, None)}, 100.6),
        (99.0, 9.0, 9.0, {"lab-01": (99.0, 99.0), "lab-02": (99.0, 99.0), "lab-router-01": (99.0, None)}, 999.0),
    ]
    assert sampler.window(10.0, 10.5) == {
        "controller_main_s": 0.3,
        "controller_s": 0.9,
        "gateway_s": 0.3,
        "server_hosts_s": 3.0,
        # lab-01: its engine stopped (no cgroup), then the new one counted 1.2 s; lab-02's grew 0.7 s
        "server_engines_s": 1.9,
        "server_hosts_without_engines_s": 1.1,
        "sampled_s": 0.4,
        # 0.6 busy CPU seconds in 0.4 s: one and a half cores on average
        "machine_busy_s": 0.6,
        "machine_cores_busy": 1.5,
    }


def test_the_machines_busy_time_counts_every_state_but_idle_and_iowait():
    # /proc/stat: cpu user nice system idle iowait irq softirq steal guest guest_nice (USER_HZ ticks)
    ticks = bench.CLK_TCK
    stat = f"cpu  {3 * ticks} {ticks} {2 * ticks} {50 * ticks} {7 * ticks} 0 {ticks} 0 {ticks} 0\ncpu0 1 2 3\n"
    assert bench.machine_busy_s(stat) == pytest.approx(3 + 1 + 2 + 1)


def _run(first: float, last: float, last_hosts: int = 5) -> dict:
    """A rollout's batch_timings: a one-host batch and a last batch, with their rollout's own overhead."""

    def batch(hosts: int, own: float) -> dict:
        return {"hosts": [f"h{i}" for i in range(hosts)], "overhead_s": own + 1, "own_overhead_s": own,
                "cpu_s": {"controller_main_s": hosts * 0.5, "sampled_s": 10}}  # fmt: skip

    return {"batch_timings": [batch(1, first), batch(last_hosts, last)]}


def test_the_cost_per_added_host_comes_from_the_medians_of_the_runs_not_from_one_lucky_or_unlucky_run():
    # one run's slowest engine stop (0-5 s) moved its last batch by 4 s: the median leaves it out
    runs = [_run(7.0, 9.0), _run(7.2, 13.0), _run(6.8, 9.4)]
    figures = bench.per_added_host(runs)
    assert figures["own_overhead_per_added_host_s"] == round((9.4 - 7.0) / 4, 2)
    assert figures["overhead_per_added_host_s"] == round((10.4 - 8.0) / 4, 2)
    assert figures["cpu_per_added_host_s"] == {"controller_main_s": 0.5}  # the window's length is no cost


def test_a_rollout_in_one_batch_has_no_cost_per_added_host():
    assert bench.per_added_host([{"batch_timings": [_run(7.0, 9.0)["batch_timings"][0]]}]) == {}


def test_a_rollout_of_the_value_the_servers_run_is_followed_by_one_of_the_other_value(monkeypatch):
    # the A/B and the cores benchmark alternate the flag on a kept lab that may already run the first value
    calls = []

    def rollout(sizes, value):
        calls.append(value)
        return {"batch_timings": [] if value == 2048 else [{"hosts": ["h1"]}]}

    monkeypatch.setattr(bench, "real_rollout", rollout)
    run, value = bench.changing_rollout([1, 4], 2048)
    assert (calls, value, run["batch_timings"]) == ([2048, 4096], 4096, [{"hosts": ["h1"]}])
    calls.clear()
    assert bench.changing_rollout([1, 4], 4096)[1] == 4096 and calls == [4096]


def test_a_comparison_takes_medians_per_batch_and_the_median_growth_per_added_host():
    # benchmarks/results/rollout_cores.json: three rollouts per side in batches [1, 4], as the benchmark saved them
    saved = json.loads((REPO / "benchmarks/results/rollout_cores.json").read_text())
    for key, cores in (("one_core", 1), ("two_cores", 2)):
        rows = [r for r in saved["rollouts"] if r["cores"] == cores]
        assert {"cores": cores, **bench.compared(rows)} == saved[key]
    one = bench.compared([r for r in saved["rollouts"] if r["cores"] == 1])
    assert one["own_overhead_s"] == [7.681, 18.169] and one["own_overhead_per_added_host_s"] == 3.17
