"""swap-aware's plan takes shortcuts (each instance's disk reload priced once, the drain's longest remaining output
read by the instance in one pass, a swap that cannot pay settled before its reload is priced): at every decision of
a run under KV and memory pressure, each shortcut must give what its definition gives, in both modes."""

from __future__ import annotations

import pytest

from sim.parallel import parallel_load_s
from sim.policies import registry
from sim.policies.swap_aware import SwapAwarePolicy, load_s
from sim.scenario import parse_scenario
from sim.simulation import simulate

from conftest import wall_clock_limit

SCENARIO = {
    "name": "shortcuts", "seed": 3, "profile": "paper-rtx5000",
    "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 24},
    "models": [{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}, {"name": "mistral-7b"}, {"name": "llama-2-7b"}],
    "workload": {"generator": {"duration_s": 120, "arrivals": {"process": "gamma", "rate_per_s": 3.0, "cv": 3.0},
                               "mix": {"qwen2.5-3b": 0.4, "qwen3-8b": 0.3, "mistral-7b": 0.2, "llama-2-7b": 0.1},
                               "prompt_tokens": {"dist": "lognormal", "mean": 800, "cv": 1.0, "max": 3000},
                               "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 1.0, "max": 1500}},
                 "output_length_error": 0.3},
    "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 4096},
    "policy": {"name": "swap-aware", "params": {"benefit_ratio": 2.0}},  # low: some swaps pay, most do not
}


class Checked(SwapAwarePolicy):
    """swap-aware, comparing each shortcut with its definition whenever the plan uses it."""

    name = "checked-swap-aware"
    checks: dict[str, int] = {}

    def victim_reload_s(self, view, victim):
        answer = super().victim_reload_s(view, victim)
        nodes = [g.node for g in victim.shards or [victim.gpu]]
        assert answer == parallel_load_s(victim.costs.reload_s(victim.gpu_share, False), nodes, False)
        self._count("reload")
        return answer

    def pays_for(self, view, model, victims, victims_cost_s):
        answer = super().pays_for(view, model, victims, victims_cost_s)
        cost_s = load_s(view, model, victims[0].gpu) * view.pending_count(model) + victims_cost_s
        assert answer == (self.gain_s(view, model) >= self.benefit_ratio * cost_s)
        self._count("pays" if answer else "does_not_pay")
        return answer

    def on_finish(self, request, instance, view):
        for held in view.instances():
            view.sync(held.gpu)
            queues = (held.running, held.prefilling, held.waiting, held.swapped)
            longest = max([1] + [r.predicted_output_tokens - held.generated(r) for queue in queues for r in queue])
            assert held.most_predicted_left() == longest
            self._count("drain")
        super().on_finish(request, instance, view)

    def _count(self, what: str) -> None:
        self.checks[what] = self.checks.get(what, 0) + 1


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_each_shortcut_gives_what_its_definition_gives(mode):
    Checked.checks = {}
    registry._REGISTRY[Checked.name] = Checked
    try:
        with wall_clock_limit(120):
            scenario = parse_scenario(SCENARIO, "test")
            result = simulate(scenario, policy=Checked.name, params=scenario.policy.params, mode=mode)
    finally:
        del registry._REGISTRY[Checked.name]
    assert result.summary["requests_completed"] > 100
    # The run must have exercised every shortcut, or the comparison proved nothing.
    assert all(Checked.checks.get(what, 0) > 10 for what in ("reload", "pays", "does_not_pay")), Checked.checks
    assert Checked.checks.get("drain", 0) > 100, Checked.checks
