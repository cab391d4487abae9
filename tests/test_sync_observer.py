"""Looking does not change what happens: a policy that syncs GPUs (``view.sync``, before reading their counters)
at extra moments gets the same run, bit for bit, as one that does not.

A sync applies the iterations a fast-forward window (or time-shared run) has finished by now. If it also moved
the window's time origin, every later boundary would be a sum from a different start, so how often a policy
looked would move results in their last bits and, at a near-tie, flip a decision. The reference here is each
built-in policy itself; the observed variant syncs every GPU at each hook, before and after the policy's own
work, and at timers every 0.37 s, mid-window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from sim.policies.registry import get_policy_class, policy_descriptions, register
from sim.scenario import load_scenario, parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import assert_same_times, scenario_dict, wall_clock_limit
from test_fleet_random import chunk as fleet_chunk, fleets
from test_policy_properties import SCENARIO, chunks, requests_strategy

ROOT = Path(__file__).resolve().parent.parent
BUILTINS = ("static", "fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware", "prefix-swap-aware")
TIMER_PERIOD_S = 0.37  # not a multiple of anything the scenarios use: lands inside decode windows


def sync_all(view) -> None:
    for gpu in view.gpus:
        view.sync(gpu)


def observed(name: str, timers: bool) -> str:
    """Register built-in ``name`` syncing every GPU around each of its hooks, and at timers if ``timers``; the new
    name."""
    base = get_policy_class(name)

    def around(hook: str):
        original = getattr(base, hook)

        def wrapped(self, *args):
            view = args[-1]
            sync_all(view)
            result = original(self, *args)
            sync_all(view)
            return result
        return wrapped

    def setup(self, view):
        base.setup(self, view)
        if not timers:
            return

        def tick(view):
            sync_all(view)
            if any(i.has_work or i.status != "ready" for i in view.instances()):  # else the run may be over
                view.call_at(view.now + TIMER_PERIOD_S, tick)
        view.call_at(TIMER_PERIOD_S, tick)

    hooks = {hook: around(hook) for hook in ("on_arrival", "on_finish", "on_instance_ready", "on_unloaded", "route")}
    suffix = "observed" if timers else "looked-at"
    cls = type(f"{base.__name__}_{suffix}", (base,), {"name": f"{name}-{suffix}", "setup": setup, **hooks})
    register(cls)
    return cls.name


OBSERVED = {name: observed(name, timers=True) for name in BUILTINS}
LOOKED_AT = {name: observed(name, timers=False) for name in BUILTINS}


def same_run(first, second, samples: bool = True) -> None:
    """The same requests, events and summary, and (``samples``) the same timeseries. A timer's event makes a still
    stretch (:mod:`sim.engine.stillness`) eventful: samples skipped over it are taken, so with timers that fire in
    one the timeseries differs by design."""
    for table in ("requests", "events") + (("timeseries",) if samples else ()):
        a, b = getattr(first, table), getattr(second, table)
        assert a.equals(b), f"{table} differ"
    for key, value in first.summary.items():
        if key != "policy" and "wall" not in key:  # the policy's name, and how long the run took
            assert second.summary.get(key) == value, key


def looked_at_and_timed(scenario, policy: str, requests) -> None:
    """``policy`` on ``scenario`` (``requests()``: its chunks) the same alone, synced around its hooks, and synced at
    timers too."""
    with wall_clock_limit(60):
        plain = simulate(scenario, policy=policy, params={}, chunks=requests())
        looked = simulate(scenario, policy=LOOKED_AT[policy], params={}, chunks=requests())
        timed = simulate(scenario, policy=OBSERVED[policy], params={}, chunks=requests())
    same_run(plain, looked)
    same_run(plain, timed, samples=False)


def test_every_builtin_is_observed():
    assert set(BUILTINS) <= set(policy_descriptions())


@pytest.mark.parametrize("scenario_name", ["mixed", "offload", "prefix-sharing"])
@pytest.mark.parametrize("policy", BUILTINS)
def test_syncing_more_changes_nothing_on_shipped_scenarios(scenario_name, policy):
    path = ROOT / "scenarios" / f"{scenario_name}.yaml"
    scenario = load_scenario(path)
    with wall_clock_limit(120):
        plain = simulate(scenario, base_dir=path.parent, policy=policy, params={})
        looked = simulate(scenario, base_dir=path.parent, policy=OBSERVED[policy], params={})
    same_run(plain, looked)


@pytest.mark.parametrize("scenario_name", ["large-models", "mixed-fleet"])
@pytest.mark.parametrize("policy", ["static", "swap-aware"])
def test_syncing_more_changes_nothing_on_parallel_deployments_and_fleets(scenario_name, policy):
    """Tensor-parallel instances (their KV on GPUs they do not step on) and node pools of two GPU types."""
    test_syncing_more_changes_nothing_on_shipped_scenarios(scenario_name, policy)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=requests_strategy)
@pytest.mark.parametrize("policy", BUILTINS)
def test_syncing_more_changes_nothing_on_random_workloads(policy, requests):
    looked_at_and_timed(SCENARIO, policy, lambda: chunks(requests))


def test_an_arrival_at_the_instant_a_window_ends_finishes_its_request_then():
    """An arrival syncs the GPU (its cut check): at the very instant a window ends, the sync once applied the last
    iteration too, and the window's end then finished nobody; the request it completed finished a step late (0.9%
    on this case). Now a sync leaves the last iteration to the window's end."""
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}],
                                            cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64}), "test")

    def rows(times, prompts, outputs):
        return [RequestChunk(np.array(times, float), np.array(["qwen2.5-3b"] * len(times), object),
                             np.array(prompts), np.array(outputs))]

    first = simulate(scenario, chunks=rows([0.0, 0.0], [200, 300], [50, 400])).requests
    window_end_s = float(first.loc[0, "finish_s"])  # the shorter request's finish ends the first window
    runs = {mode: simulate(scenario, mode=mode, chunks=rows([0.0, 0.0, window_end_s], [200, 300, 100], [50, 400, 30]))
            for mode in ("fast", "exact")}
    assert runs["fast"].requests.loc[0, "finish_s"] == window_end_s
    assert_same_times(runs["fast"].requests, runs["exact"].requests)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=fleets())
def test_syncing_more_changes_nothing_on_random_elastic_fleets(case):
    """Autoscaled pools with cold starts: the controller's decisions read counters it syncs itself."""
    scenario, rows, policy = case
    looked_at_and_timed(scenario, policy, lambda: fleet_chunk(rows))
