"""Routing rules: a repeated prefix goes back to the instance that holds it (prefix-aware), where round-robin
and least-loaded send it elsewhere; worked out by hand on two replicas of one model."""

from __future__ import annotations

import numpy as np
import pytest

from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk
from tests.conftest import scenario_dict

MODEL = "qwen2.5-3b"
A, B = (1, 2, 3), (7, 8, 9)  # two tenants' prompt prefixes: 3 ids x 64 tokens = 12 blocks of 16


def simulate_tenants(rule: str, policy: str | None = None, replicas: int | None = 2):
    """A1 and B1 at once; long after both finish, B2 then A2: the requests' frame, in id order."""
    model = {"name": MODEL} if replicas is None else {"name": MODEL, "replicas": replicas}
    scenario = parse_scenario(scenario_dict(
        cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 24}, models=[model],
        engine={"block_size": 16}, routing={"rule": rule},
        workload={"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                "mix": {MODEL: 1.0}, "prompt_tokens": {"dist": "constant", "value": 10},
                                "output_tokens": {"dist": "constant", "value": 10}}, "prefix_block_tokens": 64}),
        "test")
    ids = np.empty(4, object)
    ids[:] = [A, B, B, A]
    chunk = RequestChunk(np.array([0.0, 0.0, 60.0, 60.01]), np.array([MODEL] * 4, object),
                         np.array([250, 250, 250, 250], np.int64), np.array([4, 4, 4, 4], np.int64), prefix_ids=ids)
    return simulate(scenario, policy=policy, chunks=[chunk]).requests.sort_values("id")


def run(rule: str):
    frame = simulate_tenants(rule)
    return list(frame["gpu"]), list(frame["cached_prompt_tokens"])


def test_prefix_aware_sends_each_tenant_back_to_its_cache():
    # A1 -> GPU 0 (all equal: the oldest); B1 -> GPU 1 (GPU 0's queue holds A1); B2 and A2 follow their prefixes.
    assert run("prefix-aware") == ([0, 1, 1, 0], [0, 0, 192, 192])


def test_round_robin_and_least_loaded_miss_the_cache():
    assert run("round-robin") == ([0, 1, 0, 1], [0, 0, 0, 0])
    # Both idle when B2 arrives: the oldest (GPU 0, A's cache); A2 then finds GPU 0 busy with B2.
    assert run("least-loaded") == ([0, 1, 0, 1], [0, 0, 0, 0])


def test_unknown_rule_is_refused():
    from sim.errors import MmsimError

    with pytest.raises((MmsimError, ValueError)):
        parse_scenario(scenario_dict(routing={"rule": "random"}), "test")


def test_prefix_swap_aware_routes_by_prefix_whatever_the_scenario_says():
    from sim.policies.registry import get_policy_class

    policy = get_policy_class("prefix-swap-aware")()
    assert policy.router.rule == "prefix-aware" and policy.keeps_prefix_cache
    frame = simulate_tenants("round-robin", policy="prefix-swap-aware", replicas=None)
    assert list(frame["cached_prompt_tokens"]) == [0, 0, 192, 192]
