"""Random small clusters under every built-in policy: each run ends by itself, loses no request without a
reason, never overfills a GPU, and fast-forward gives the per-iteration reference's times (Hypothesis).

The scenarios cover what the older property test never generated: KV swap preemption under KV pressure,
unchunked prefill, one-sequence batches, tight host RAM, outputs of one or two tokens, requests longer
than a deployment's ``max_model_len`` and shared prompt prefixes with and without prefix caching (whose
blocks and holder counts are checked after every step). Half the scenarios crowd two to four deployments
(the small model under several names) onto one GPU, with bursts of arrivals, so that co-resident instances
take turns decoding (time-shared runs) under KV pressure, loads, unloads and policy timers. Set
``MMSIM_RANDOM_EXAMPLES`` for a longer hunt.
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.catalogue import get_model
from sim.costs import ModelCosts
from sim.engine.memory import reserve_bytes
from sim.profile import load_profile
from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk

from conftest import assert_same_times, simulate_within_memory, wall_clock_limit

POLICIES = ("static", "fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware")
MODELS = ("qwen2.5-3b", "qwen3-8b", "mistral-7b", "llama-2-7b")
SMALL = ("qwen2.5-3b", "small-b", "small-c", "small-d", "mistral-7b")
"""Deployments of a crowded GPU: the small model under four names (up to four fit one GPU), and a 7B."""
EXAMPLES = int(os.environ.get("MMSIM_RANDOM_EXAMPLES", "150"))
RUN_LIMIT_S = 60
"""Wall-clock bound of one example (three runs); a hang fails the test instead of stalling CI."""


def engine_sections():
    """Engine limits from the edges that matter: one-sequence batches, small token budgets and blocks, unchunked
    prefill, both preemption modes, prefix caching on and off."""
    return st.fixed_dictionaries({
        "max_num_seqs": st.sampled_from([1, 2, 4, 16]),
        "max_num_batched_tokens": st.sampled_from([256, 1024, 4096]),
        "block_size": st.sampled_from([8, 16, 32]),
        "chunked_prefill": st.booleans(),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "prefix_caching": st.booleans(),
    })


@st.composite
def cases(draw):
    crowded = draw(st.booleans())  # one GPU that two to four models share
    if crowded:
        count = draw(st.sampled_from([2, 3, 4, 4]))
        models = draw(st.lists(st.sampled_from(SMALL), min_size=count, max_size=count, unique=True))
        gpus = 1
    else:
        models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True))
        gpus, memory_gb = draw(st.integers(1, 2)), draw(st.sampled_from([4, 9, 12, 18, 24]))
    engine = draw(engine_sections())
    gaps = st.integers(0, 50) if crowded else st.integers(0, 500)  # a crowded GPU's requests come in bursts
    rows = draw(st.lists(st.tuples(gaps.map(lambda centis: centis / 100),
                                   st.sampled_from(models),
                                   st.one_of(st.integers(1, 600), st.integers(600, 30_000)),
                                   st.one_of(st.integers(1, 3), st.integers(1, 600)),
                                   # shared prompt prefixes: a tenant's id, then a few ids from a small set
                                   st.one_of(st.just(()), st.tuples(st.integers(0, 1), st.lists(st.integers(0, 1), max_size=6))
                                             .map(lambda ids: (ids[0], *ids[1])))),
                         min_size=2 * len(models) if crowded else 1, max_size=14))
    if crowded:
        # Room for all of them, and KV room beside them from just one request's at its longest to ample. (With less,
        # every instance can hold a request no room is left for while nothing runs, and the swapping policies then
        # unload and load models for ever: their bug, which the progress guard stops.)
        room = (1 + draw(st.one_of(st.integers(0, 100), st.integers(0, 1000), st.integers(1000, 20_000)))) * 2**20
        memory_gb = (footprint_bytes(models, engine) + request_bytes(rows, engine["block_size"]) + room) / 0.9 / 2**30
    policy = draw(st.sampled_from(POLICIES))
    # offload-aware's partial copies keep layers on the CPU, in host RAM: it gets room for every copy it may load.
    host_memory_gb = 512 if policy == "offload-aware" else draw(st.sampled_from([0.05, 1, 64]))
    scenario = parse_scenario({
        "name": "random", "seed": 1, "profile": "paper-rtx5000",
        "cluster": {"nodes": 1, "gpus_per_node": gpus, "gpu_memory_gb": memory_gb, "host_memory_gb": host_memory_gb},
        "models": [{"name": m} if m in MODELS else {"name": "qwen2.5-3b", "alias": m} for m in models],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {m: 1.0 for m in models}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}},
                     "output_length_error": draw(st.sampled_from([0.0, 0.5])),
                     "prefix_block_tokens": draw(st.sampled_from([8, 64, 512]))},
        "slo": {"default": {"ttft_s": 2.0}},
        "engine": engine,
    }, "random")
    return scenario, rows, policy


def footprint_bytes(models, engine) -> int:
    """GPU memory the weights and reserves of ``models`` take together (as :mod:`sim.engine.memory` counts them)."""
    profile = load_profile("paper-rtx5000")
    total = 0
    for name in models:
        spec = get_model(name if name in MODELS else "qwen2.5-3b")
        total += (ModelCosts(profile, spec).gpu_weight_bytes()
                  + reserve_bytes(spec, engine["max_num_batched_tokens"], engine["max_num_seqs"]))
    return total


def request_bytes(rows, block_size: int) -> int:
    """KV memory the blocks of the longest request take, prompt and output (what a recompute needs at most)."""
    profile = load_profile("paper-rtx5000")
    return max(-(-(prompt + output + 1) // block_size) * block_size
               * ModelCosts(profile, get_model(model if model in MODELS else "qwen2.5-3b")).kv_bytes_per_token
               for _, model, prompt, output, _ in rows)


def chunk(rows) -> list[RequestChunk]:
    gaps, models, prompts, outputs, prefix_ids = zip(*rows)
    ids = np.empty(len(rows), object)
    ids[:] = prefix_ids
    return [RequestChunk(np.cumsum(gaps), np.array(models), np.array(prompts), np.array(outputs), prefix_ids=ids)]


def run(scenario, rows, policy: str, mode: str):
    return simulate_within_memory(scenario, chunk(rows), policy, mode)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_random_runs_end_account_for_every_request_and_agree_across_modes(case):
    scenario, rows, policy = case
    with wall_clock_limit(RUN_LIMIT_S):
        fast = run(scenario, rows, policy, "fast")
        exact = run(scenario, rows, policy, "exact")
    summary = fast.summary
    assert summary["requests_completed"] + summary["requests_dropped"] == len(rows)
    frame = fast.requests.set_index("id").sort_index()
    reasons = set(frame.loc[frame["status"] == "dropped", "drop_reason"])
    # A request that fits its deployment is served: the only drops are the ones no placement can avoid.
    # A static placement may leave a model out (its requests are ``not_placed``); a swapping policy may not.
    unavoidable = {"exceeds_max_model_len", "model_exceeds_gpu"} | ({"not_placed"} if policy == "static" else set())
    assert reasons <= unavoidable, (policy, reasons)
    reference = exact.requests.set_index("id").sort_index()
    assert (frame["status"] == reference["status"]).all()
    assert (frame["cached_prompt_tokens"] == reference["cached_prompt_tokens"]).all()
    assert_same_times(frame, reference, label=policy)


def test_an_unload_ending_during_a_time_shared_run_frees_memory_after_the_iterations_before_it():
    """Found by the hunt above (fcfs-swap, four deployments on one GPU, prefix caching): mistral-7b's unload ended
    while the other two took turns, and freed its memory before the iterations that had ended earlier were applied,
    so one of them allocated a block without evicting an idle cached prefix block, which a later prompt then hit.
    Exact mode evicted it: cached prompt tokens and times differed between the modes."""
    rows = [(0.0, "mistral-7b", 1, 1, ()), (0.0, "mistral-7b", 1, 1, ()), (0.0, "mistral-7b", 340, 1, ()),
            (0.0, "qwen2.5-3b", 335, 3, ()), (0.0, "qwen2.5-3b", 8857, 175, ()), (0.0, "small-b", 9, 1, (1,)),
            (0.0, "small-c", 1, 1, ()), (0.0, "small-b", 3203, 2, (1,)), (0.0, "mistral-7b", 430, 148, ()),
            (0.0, "small-b", 600, 3, ())]
    models = ["mistral-7b", "qwen2.5-3b", "small-b", "small-c"]
    scenario = parse_scenario({
        "name": "random", "seed": 1, "profile": "paper-rtx5000",
        "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 35.50299909379747, "host_memory_gb": 0.05},
        "models": [{"name": m} if m in MODELS else {"name": "qwen2.5-3b", "alias": m} for m in models],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {m: 1.0 for m in models}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}, "prefix_block_tokens": 8},
        "slo": {"default": {"ttft_s": 2.0}},
        "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 256, "block_size": 8, "chunked_prefill": False,
                   "preemption_mode": "recompute", "prefix_caching": True},
    }, "random")
    fast, exact = (run(scenario, rows, "fcfs-swap", mode).requests.set_index("id").sort_index() for mode in ("fast", "exact"))
    assert list(fast["cached_prompt_tokens"]) == list(exact["cached_prompt_tokens"])
    assert_same_times(fast, exact, columns=("first_scheduled_s", "first_token_s", "finish_s"))


def test_offload_aware_leaves_its_partial_copy_room_for_the_request_it_was_loaded_for():
    """Found by the hunt above: offload-aware loaded qwen2.5-3b with 5/6 of its layers beside qwen3-8b, keeping
    4,096 tokens of KV room, for a 7,116-token prompt; the prompt could not start, the stuck copy was unloaded to
    make room, and loaded again in the same place, 1,000 times, until the progress guard stopped the run."""
    rows = [(0.0, "qwen3-8b", 1, 1, ())] * 5 + [(0.64, "qwen3-8b", 1, 440, ()), (1.25, "qwen3-8b", 1, 1, ()),
            (1.71, "qwen3-8b", 1, 1, ()), (4.35, "qwen2.5-3b", 7116, 1, ())] + [(0.0, "qwen3-8b", 1, 1, ())] * 4 + [
            (0.0, "qwen3-8b", 1208, 1, ())]
    models = ["qwen3-8b", "qwen2.5-3b"]
    scenario = parse_scenario({
        "name": "random", "seed": 1, "profile": "paper-rtx5000",
        # Host RAM for the partial copy's CPU layers (1/6 of Qwen2.5-3B), which take it since 2026-12-07.
        "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 24.0, "host_memory_gb": 64},
        "models": [{"name": m} for m in models],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {m: 1.0 for m in models}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "slo": {"default": {"ttft_s": 2.0}},
        "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 4096, "block_size": 8, "chunked_prefill": False,
                   "preemption_mode": "recompute", "prefix_caching": False},
    }, "random")
    with wall_clock_limit(RUN_LIMIT_S):
        fast, exact = (run(scenario, rows, "offload-aware", mode) for mode in ("fast", "exact"))
    assert (fast.requests["status"] == "completed").all() and fast.summary["loads"] < 10
    assert_same_times(fast.requests, exact.requests)
