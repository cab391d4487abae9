"""offload-aware finds the most whole layers of a model that fit a GPU's free gap by bisection
(``OffloadAwarePolicy.best_partial_share``). The reference is the definition, one layer count at a time from the
most a partial copy may hold down: every request and event of a run must be the same either way, on the shipped
scenarios that load partial copies and on small random workloads (Hypothesis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from sim.policies.offload_aware import OffloadAwarePolicy
from sim.policies.registry import register
from sim.scenario import load_scenario
from sim.simulation import simulate

from conftest import wall_clock_limit
from test_plan_shortcut import same_run
from test_policy_properties import SCENARIO, chunks, requests_strategy

ROOT = Path(__file__).resolve().parent.parent
SHARES: list[float] = []


class LayerByLayer(OffloadAwarePolicy):
    """offload-aware trying each layer count in turn, most first, and noting the shares it finds."""

    name = "offload-aware-layer-by-layer"

    def best_partial_share(self, view, model):
        costs = view.costs(model)
        reserve = self.kv_reserve_bytes(view, model)
        layers = costs.num_layers
        best_share, best_gpu = 0.0, None
        for gpu in view.gpus:
            view.sync(gpu)
            room = gpu.free_bytes() - gpu.in_flight_bytes() - reserve
            for gpu_layers in range(costs.gpu_layers(view.deployment_share(model)) - 1, 0, -1):
                share = gpu_layers / layers
                if share < self.min_gpu_share or share <= best_share:
                    break
                if view.footprint_bytes(model, share) <= room:
                    best_share, best_gpu = share, gpu
                    break
        if best_gpu is not None:
            SHARES.append(best_share)
        return best_share, best_gpu


register(LayerByLayer)


# Seeds on which the search finds partial copies (on offload's own seed, 5, it finds none at either slowdown).
@pytest.mark.parametrize("name, params, seed", [("offload", None, 2), ("offload", {"max_slowdown": 2.0}, 1),
                                                ("mixed", None, None)])
def test_bisection_finds_what_a_scan_finds_on_shipped_scenarios(name, params, seed):
    path = ROOT / "scenarios" / f"{name}.yaml"
    scenario = load_scenario(path)
    SHARES.clear()
    with wall_clock_limit(120):
        scanned = simulate(scenario, base_dir=path.parent, policy=LayerByLayer.name, params=params, seed=seed)
        bisected = simulate(scenario, base_dir=path.parent, policy="offload-aware", params=params, seed=seed)
    same_run(scanned, bisected)
    assert SHARES, "no partial copy found to test the search"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=requests_strategy)
def test_bisection_finds_what_a_scan_finds_on_random_workloads(rows):
    with wall_clock_limit(60):
        scanned = simulate(SCENARIO, policy=LayerByLayer.name, chunks=chunks(rows))
        bisected = simulate(SCENARIO, policy="offload-aware", chunks=chunks(rows))
    same_run(scanned, bisected)
