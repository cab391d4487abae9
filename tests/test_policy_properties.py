"""Properties every built-in policy must keep on small random workloads (Hypothesis)."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk

from conftest import simulate_within_memory

POLICIES = ("static", "fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware")
MODELS = ("qwen2.5-3b", "qwen3-8b", "mistral-7b")

SCENARIO = parse_scenario({
    "name": "properties", "seed": 3, "profile": "paper-rtx5000",
    # Two 20 GB GPUs for three models (~37 GB of weights): every swapping policy has to swap.
    "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 20},
    "models": [{"name": m} for m in MODELS],
    "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                               "mix": {m: 1.0 for m in MODELS}, "prompt_tokens": {"dist": "constant", "value": 100},
                               "output_tokens": {"dist": "constant", "value": 100}},
                 "output_length_error": 0.5},
    "slo": {"default": {"ttft_s": 3.0, "tpot_s": 0.1}},
    "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 2048},
}, "test")

# Gaps in hundredths of a second: integer-based, so the strategy does not depend on the FPU's
# subnormal mode (which an earlier import of a native library may have changed).
requests_strategy = st.lists(
    st.tuples(st.integers(0, 800).map(lambda centis: centis / 100), st.integers(0, len(MODELS) - 1), st.integers(1, 2500), st.integers(1, 400)),
    min_size=1, max_size=25)


def chunks(rows):
    gaps, models, prompts, outputs = zip(*rows)
    return [RequestChunk(np.cumsum(gaps), np.array([MODELS[m] for m in models]), np.array(prompts), np.array(outputs))]


def run(policy: str, rows, mode: str = "fast"):
    return simulate_within_memory(SCENARIO, chunks(rows), policy, mode)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=requests_strategy)
def test_policy_properties(policy, rows):
    fast = run(policy, rows)
    frame = fast.requests
    summary = fast.summary

    # Every request is accounted for.
    assert summary["requests_total"] == len(rows)
    assert summary["requests_completed"] + summary["requests_dropped"] == len(rows)

    # Per-request times are monotone.
    done = frame[frame["status"] == "completed"]
    assert (done["arrival_s"] <= done["first_scheduled_s"]).all()
    assert (done["first_scheduled_s"] <= done["first_token_s"]).all()
    assert (done["first_token_s"] <= done["finish_s"]).all()

    # Deterministic for a seed.
    again = run(policy, rows)
    pd.testing.assert_frame_equal(frame, again.requests)

    # Fast-forward gives the per-iteration reference's times.
    exact = run(policy, rows, mode="exact").requests.set_index("id").sort_index()
    ordered = frame.set_index("id").sort_index()
    assert (ordered["status"] == exact["status"]).all()
    for column in ("first_token_s", "finish_s"):
        a, b = ordered[column].to_numpy(), exact[column].to_numpy()
        both = ~np.isnan(a) & ~np.isnan(b)
        assert (np.isnan(a) == np.isnan(b)).all()
        assert (np.abs(a[both] - b[both]) <= 1e-9 * np.maximum(1.0, np.abs(b[both]))).all(), column
