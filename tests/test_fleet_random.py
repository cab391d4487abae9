"""Random small elastic fleets under every built-in autoscaler (Hypothesis): each run ends by itself, accounts for
every request, never overfills a GPU, bills no more GPU-hours than its pools could hold, and fast-forward gives
the per-iteration reference's times."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk

from conftest import assert_same_times, simulate_within_memory, wall_clock_limit

AUTOSCALERS = ("utilisation", "queue-depth", "kv-utilisation", "predictive")
MODELS = ("qwen2.5-3b", "qwen3-8b", "llama-2-7b")
EXAMPLES = int(os.environ.get("MMSIM_RANDOM_EXAMPLES", "60"))
RUN_LIMIT_S = 60


@st.composite
def fleets(draw):
    models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True))
    pools = []
    for index in range(draw(st.integers(1, 2))):
        low = draw(st.integers(0, 1))
        high = draw(st.integers(max(low, 1), 3))
        pools.append({"name": f"p{index}", "profile": draw(st.sampled_from(["paper-rtx5000", "paper-a6000"])),
                      "min_nodes": low, "nodes": draw(st.integers(low, high)), "max_nodes": high,
                      "gpus_per_node": draw(st.integers(1, 2)), "host_memory_gb": 64})
    autoscaler = {"name": draw(st.sampled_from(AUTOSCALERS)), "interval_s": draw(st.sampled_from([1.0, 5.0])),
                  "min_replicas": draw(st.integers(0, 1)), "scale_down_window_s": draw(st.sampled_from([0.0, 10.0])),
                  "node_idle_s": draw(st.sampled_from([0.0, 5.0]))}
    if draw(st.booleans()):
        autoscaler["scale_to_zero_idle_s"] = draw(st.sampled_from([2.0, 20.0]))
    scenario = parse_scenario({
        "name": "random-fleet", "seed": 1, "profile": "paper-rtx5000",
        "cluster": {"placement": draw(st.sampled_from(["hardware-aware", "blind"])), "pools": pools},
        "models": [{"name": m} for m in models],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {m: 1.0 for m in models}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "slo": {"default": {"ttft_s": 2.0}},
        "engine": {"max_num_seqs": draw(st.sampled_from([1, 4, 16])), "max_num_batched_tokens": 1024},
        # Cold starts of seconds, not minutes: the same stages, in runs that stay short.
        "cold_start": {"provision_s": draw(st.sampled_from([0.0, 3.0])), "container_init_s": 0.5, "image_gb": 1.0,
                       "registry_gb_per_s": 1.0, "runtime_start_s": 0.5, "weight_fetch_gb_per_s": 50.0,
                       "deserialise_gb_per_s": 50.0, "warm_up_s": 0.5,
                       "lazy_pull": draw(st.booleans()), "weight_streaming": draw(st.booleans())},
        "autoscaler": autoscaler,
    }, "random")
    # Now and then a prompt that fits an A6000's KV room but not an RTX 5000's: with both pools, the deployment's
    # max_model_len (sized on the larger GPU) takes it, and an instance on the smaller one must not.
    prompts = st.one_of(st.integers(1, 800), st.sampled_from([100_000, 150_000])) if len(pools) > 1 else st.integers(1, 800)
    rows = draw(st.lists(st.tuples(st.integers(0, 2000).map(lambda centis: centis / 100), st.sampled_from(models),
                                   prompts, st.integers(1, 400)), min_size=1, max_size=25))
    return scenario, rows, draw(st.sampled_from(["static", "slo-aware"]))


def chunk(rows) -> list[RequestChunk]:
    gaps, models, prompts, outputs = zip(*rows)
    return [RequestChunk(np.cumsum(gaps), np.array(models), np.array(prompts), np.array(outputs))]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=fleets())
def test_random_fleets_end_account_for_every_request_and_agree_across_modes(case):
    scenario, rows, policy = case
    with wall_clock_limit(RUN_LIMIT_S):
        fast = simulate_within_memory(scenario, chunk(rows), policy, "fast")
        exact = simulate_within_memory(scenario, chunk(rows), policy, "exact")
    summary = fast.summary
    assert summary["requests_completed"] + summary["requests_dropped"] == len(rows)
    frame = fast.requests.set_index("id").sort_index()
    dropped = frame[frame["status"] == "dropped"]
    assert set(dropped["drop_reason"]) <= {"exceeds_max_model_len", "model_exceeds_gpu", "not_placed",
                                           "exceeds_instance_max_model_len"}
    blocked = set(fast.events.loc[fast.events["kind"] == "scale_blocked", "model"])
    # A request is left unplaced only where its model asked for a GPU the pools could not give it.
    assert set(dropped.loc[dropped["drop_reason"] == "not_placed", "model"]) <= blocked
    reference = exact.requests.set_index("id").sort_index()
    assert (frame["status"] == reference["status"]).all()
    assert_same_times(frame, reference, label=policy)
    fleet, end_s = summary["fleet"], summary["simulated_seconds"]
    most = sum(p["nodes_max"] * p["gpus_per_node"] for p in fleet["pools"].values()) * end_s / 3600
    assert 0 <= fleet["gpu_hours"] <= most + 1e-9


def test_requests_moved_to_a_new_instance_are_the_same_in_both_modes():
    """Found by the test above: slo-aware reorders its queues at each step, so the requests a new instance takes
    must be picked by arrival, not by their place in a queue (which depends on fast-forwarding)."""
    pools = [{"name": "p0", "profile": "paper-a6000", "nodes": 3, "min_nodes": 1, "max_nodes": 3, "gpus_per_node": 1},
             {"name": "p1", "profile": "paper-rtx5000", "nodes": 0, "min_nodes": 0, "max_nodes": 2, "gpus_per_node": 1}]
    models = ["qwen2.5-3b", "llama-2-7b"]
    scenario = parse_scenario({
        "name": "moved", "profile": "paper-rtx5000", "cluster": {"pools": pools}, "models": [{"name": m} for m in models],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {m: 1.0 for m in models}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "slo": {"default": {"ttft_s": 2.0}}, "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 1024},
        "cold_start": {"provision_s": 0.0, "container_init_s": 0.5, "image_gb": 1.0, "registry_gb_per_s": 1.0,
                       "runtime_start_s": 0.5, "weight_fetch_gb_per_s": 50.0, "deserialise_gb_per_s": 50.0, "warm_up_s": 0.5},
        "autoscaler": {"name": "utilisation", "interval_s": 1.0, "min_replicas": 0, "scale_down_window_s": 0.0,
                       "scale_to_zero_idle_s": 2.0, "node_idle_s": 0.0}}, "test")
    small = "qwen2.5-3b"
    rows = [(20.0, "llama-2-7b", 176, 277), (2.03, small, 754, 1), (1.78, small, 511, 313), (2.27, small, 524, 247),
            (4.87, "llama-2-7b", 21, 24), (2.76, small, 310, 217), (1.48, small, 677, 102), (6.29, small, 300, 122),
            (17.47, small, 313, 183), (2.51, small, 166, 264), (2.63, small, 438, 26), (16.98, small, 490, 1)]
    rows += [(0.0, small, 1, 1)] * 10
    with wall_clock_limit(RUN_LIMIT_S):
        fast, exact = (simulate_within_memory(scenario, chunk(rows), "slo-aware", mode) for mode in ("fast", "exact"))
    assert_same_times(fast.requests, exact.requests, ("finish_s",))
    assert (fast.requests["gpu"] == exact.requests["gpu"]).all()
