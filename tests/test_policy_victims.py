"""The choose_victim contract: a policy of one's own must name a request running or prefilling on the instance, and
a preemption mode; anything else stops the run in one line naming the hook."""

from __future__ import annotations

import numpy as np
import pytest

from sim.policies import registry
from sim.policies.contract import PolicyContractError
from sim.policies.static import StaticPolicy
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import wall_clock_limit


class _Victims(StaticPolicy):
    """Static placement whose choose_victim gives what ``answer(instance)`` makes of the instance."""

    name = "victims"
    answer = staticmethod(lambda instance: (instance.running[-1], "swap"))

    def choose_victim(self, instance, view):
        return type(self).answer(instance)


def kv_pressure_run(answer):
    """Eight long requests at once on a GPU with KV room for about three: the engine must ask for victims."""
    scenario = parse_scenario({
        "name": "pressure", "seed": 1, "profile": "paper-rtx5000",
        "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 8.5},
        "models": [{"name": "qwen2.5-3b"}],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {"qwen2.5-3b": 1.0}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 4096},
    }, "test")
    chunks = [RequestChunk(np.zeros(8), np.array(["qwen2.5-3b"] * 8, object), np.full(8, 3000), np.full(8, 2000))]
    policy_class = type("Victims", (_Victims,), {"answer": staticmethod(answer)})
    registry._REGISTRY["victims"] = lambda **_: policy_class()
    try:
        return simulate(scenario, policy="victims", chunks=chunks)
    finally:
        del registry._REGISTRY["victims"]


def test_a_fair_victim_is_taken():
    assert kv_pressure_run(lambda instance: (instance.running[-1], "swap")).summary["preemptions"] > 0


@pytest.mark.parametrize("answer, problem", [
    (lambda instance: (instance.waiting[0] if instance.waiting else None, "swap"), "which is not running or prefilling on it"),
    (lambda instance: (None, "swap"), "named None, which is not running or prefilling on it"),
    (lambda instance: (5, "recompute"), "named 5, which is not running or prefilling on it"),
    (lambda instance: instance.running[-1], "not a pair"),
    (lambda instance: (instance.running[-1], "banana"), "gave the mode 'banana'"),
])
def test_a_victim_that_is_not_running_there_stops_the_run_in_one_line(answer, problem):
    """A waiting request looped for ever, None or a number was a traceback, and an unknown mode ran as recompute."""
    with wall_clock_limit(60), pytest.raises(PolicyContractError) as stopped:
        kv_pressure_run(answer)
    message = str(stopped.value)
    assert "broke the policy contract" in message and "its choose_victim on qwen2.5-3b" in message, message
    assert problem in message and "it must return (a request of instance.running or instance.prefilling" in message
