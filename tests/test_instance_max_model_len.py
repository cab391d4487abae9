"""An instance's max_model_len is sized beside the other models resident on its GPU, again whenever they come and go.

Before, it was sized on the GPU alone: a 400k-token prompt within Qwen2.5-3B's limit on an empty 32 GB GPU, beside
Qwen3-8B's weights, sat at the head of its queue for good under static placement, and the two 100-token requests
behind it were dropped as ``not_scheduled`` when the run ended. Expected outcomes are worked by hand from the
catalogue's model shapes and the GPU's memory (below), not from the engine's sizing code."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import assert_same_times, scenario_dict, wall_clock_limit

GIB = 2**30
# Qwen2.5-3B: 36 layers, 2 KV heads of 128 dims, fp16 K and V: 36 * 2 * 2 * 128 * 2 bytes a token.
QWEN_3B_KV_BYTES_PER_TOKEN = 36 * 2 * 2 * 128 * 2

POLICIES = textwrap.dedent('''
    from sim.policies.base import Policy
    from sim.policies.static import StaticPolicy


    class MyStatic(StaticPolicy):
        """A user's static placement: it may unload in hooks of its own, so it keeps no promise it did not make."""
        name = "my-static"


    class EightBLater(Policy):
        """Qwen2.5-3B at t=0; Qwen3-8B beside it on the same GPU at t=5; neither ever unloaded."""
        name = "eight-b-later"
        keeps_placement = True

        def setup(self, view):
            view.load(0, view.gpus[0])
            view.call_at(5.0, lambda v: v.load(1, v.gpus[0]))
''')


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):  # the defect was a queue blocked for good
        yield


def scenario():
    return parse_scenario(scenario_dict(
        models=[{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}],
        cluster={"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 32, "host_memory_gb": 256},
        engine={"max_num_seqs": 16, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.95}), "test")


def chunks(rows):
    arrivals, models, prompts, outputs = zip(*rows)
    return [RequestChunk(np.array(arrivals, float), np.array(models, object), np.array(prompts), np.array(outputs))]


def by_id(result):
    return result.requests.set_index("id").sort_index()


def test_the_kv_room_beside_a_neighbour_holds_fewer_tokens_than_the_prompt():
    """The hand check the other tests rest on: 400k tokens fit the GPU alone, not beside Qwen3-8B."""
    result = simulate(scenario(), policy="static", chunks=chunks([(1.0, "qwen2.5-3b", 100, 10)]))
    memory = result.timeseries
    three_b = memory[memory["model"] == "qwen2.5-3b"]["weight_bytes"].max()
    eight_b = memory[memory["model"] == "qwen3-8b"]["weight_bytes"].max()
    capacity = 32 * GIB * 0.95
    alone = (capacity - three_b) / QWEN_3B_KV_BYTES_PER_TOKEN
    beside = (capacity - three_b - eight_b) / QWEN_3B_KV_BYTES_PER_TOKEN
    assert beside < 400_000 < alone, (beside, alone)


BESIDE = [(1.0, "qwen3-8b", 100, 50), (2.0, "qwen2.5-3b", 400_000, 10), (3.0, "qwen2.5-3b", 100, 20),
          (30.0, "qwen2.5-3b", 100, 20)]
"""The reported case: a 400k-token prompt for Qwen2.5-3B, which static placement puts beside Qwen3-8B."""


def test_static_placement_refuses_at_arrival_what_the_room_beside_its_neighbour_cannot_hold():
    frame = by_id(simulate(scenario(), policy="static", chunks=chunks(BESIDE)))
    assert list(frame["status"]) == ["completed", "dropped", "completed", "completed"]
    assert frame.loc[1, "drop_reason"] == "exceeds_instance_max_model_len"


@pytest.mark.parametrize("policy", ["swap-aware", "time-slice"])
def test_a_policy_that_moves_models_keeps_the_request_until_its_neighbour_goes(policy):
    frame = by_id(simulate(scenario(), policy=policy, chunks=chunks(BESIDE)))
    assert list(frame["status"]) == ["completed"] * 4


def test_a_users_subclass_of_static_does_not_inherit_the_promise(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(POLICIES)
    frame = by_id(simulate(scenario(), policy=f"{path}:MyStatic", chunks=chunks(BESIDE)))
    assert frame.loc[1, "drop_reason"] == "not_scheduled"  # queued behind a neighbour nothing unloads


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_a_neighbour_loaded_later_refuses_what_it_leaves_no_room_for(tmp_path, mode):
    """The 400k prompt is prefilling when Qwen3-8B loads beside it at t=5: it is refused when the KV it grows
    into runs out and it is preempted; the 250k one, waiting or prefilling then, is refused too. Neither blocks
    the 100-token requests, which complete, nor the 8B's own."""
    path = tmp_path / "later.py"
    path.write_text(POLICIES)
    rows = [(1.0, "qwen2.5-3b", 400_000, 10), (2.0, "qwen2.5-3b", 250_000, 10), (3.0, "qwen2.5-3b", 100, 20),
            (6.0, "qwen2.5-3b", 100, 20), (7.0, "qwen3-8b", 100, 20)]
    result = simulate(scenario(), policy=f"{path}:EightBLater", chunks=chunks(rows), mode=mode)
    frame = by_id(result)
    assert list(frame["status"]) == ["dropped", "dropped", "completed", "completed", "completed"]
    assert set(frame.loc[[0, 1], "drop_reason"]) == {"exceeds_instance_max_model_len"}
    loads = result.events[result.events["kind"] == "load"]
    assert list(loads["time_s"]) == [0.0, 5.0]
    assert (frame.loc[[2, 3, 4], "first_token_s"] > 5.0).all()
    if mode == "exact":
        fast = by_id(simulate(scenario(), policy=f"{path}:EightBLater", chunks=chunks(rows), mode="fast"))
        assert_same_times(fast, frame, label="neighbour loaded later")


@pytest.mark.parametrize("rule", ["least-loaded", "round-robin", "prefix-aware"])
def test_a_request_goes_to_a_replica_that_can_hold_it(rule):
    """Qwen2.5-3B on GPU 0 beside Qwen3-8B and alone on GPU 1: the 400k prompt was routed by the rule's tie-break to
    GPU 0 and refused there, while GPU 1 serves it."""
    data = scenario_dict(
        models=[{"name": "qwen3-8b", "gpus": [0]}, {"name": "qwen2.5-3b", "gpus": [0, 1]}],
        cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 32, "host_memory_gb": 256},
        engine={"max_num_seqs": 16, "gpu_memory_utilization": 0.95}, routing={"rule": rule})
    rows = [(1.0, "qwen2.5-3b", 400_000, 10), (3.0, "qwen2.5-3b", 100, 20), (4.0, "qwen2.5-3b", 100, 20)]
    frame = by_id(simulate(parse_scenario(data, "test"), policy="static", chunks=chunks(rows)))
    assert list(frame["status"]) == ["completed"] * 3
    assert frame.loc[0, "gpu"] == 1
