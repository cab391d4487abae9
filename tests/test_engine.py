"""Engine: closed-form single request, fast-forward == per-iteration, conservation and memory invariants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.catalogue import get_model
from sim.costs import ModelCosts
from sim.profile import load_profile
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk
from tests.conftest import scenario_dict


def chunk_of(arrivals, models, prompts, outputs) -> list[RequestChunk]:
    return [RequestChunk(np.asarray(arrivals, float), np.asarray(models, object), np.asarray(prompts, np.int64),
                         np.asarray(outputs, np.int64))]


def random_chunks(n, models, rate, seed, prompt_max=1500, output_max=400):
    rng = np.random.default_rng(seed)
    return chunk_of(np.cumsum(rng.exponential(1 / rate, n)), rng.choice(models, n), rng.integers(1, prompt_max, n),
                    rng.integers(1, output_max, n))


def test_single_request_matches_closed_form():
    # The paper ran Hugging Face transformers without vLLM's 90% memory cap.
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-14b"}], engine={"gpu_memory_utilization": 1.0}), "test")
    prompt, output, arrival = 71, 7000, 100.0
    result = simulate(scenario, chunks=chunk_of([arrival], ["qwen2.5-14b"], [prompt], [output]))
    row = result.requests.iloc[0]
    costs = ModelCosts(load_profile("paper-rtx5000"), get_model("qwen2.5-14b"))
    prefill = costs.prefill_s(prompt)
    decode = costs.step_coefficients(1).steps_s(prompt + 1, 1, output - 1)
    assert row["first_token_s"] == pytest.approx(arrival + prefill, rel=1e-12)
    assert row["finish_s"] == pytest.approx(arrival + prefill + decode, rel=1e-12)
    # The paper's uninterrupted 7000-token job took 417 s on the RTX 5000.
    assert row["e2e_s"] == pytest.approx(417.0, rel=0.01)


def test_request_before_load_waits_for_reload():
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-14b"}]), "test")
    result = simulate(scenario, chunks=chunk_of([0.0], ["qwen2.5-14b"], [100], [10]))
    assert result.requests.iloc[0]["first_scheduled_s"] == pytest.approx(6.70)


def _compare_modes(scenario, chunks_factory):
    fast = simulate(scenario, mode="fast", chunks=chunks_factory()).requests
    exact = simulate(scenario, mode="exact", chunks=chunks_factory()).requests
    assert list(fast["status"]) == list(exact["status"])
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        a, b = fast[column].to_numpy(), exact[column].to_numpy()
        assert np.array_equal(np.isnan(a), np.isnan(b))
        ok = ~np.isnan(a)
        assert np.all(np.abs(a[ok] - b[ok]) <= 1e-9 * np.maximum(1.0, np.abs(b[ok])))
    assert list(fast["preemptions"]) == list(exact["preemptions"])
    return fast


@pytest.mark.parametrize("variant", [
    {},
    {"engine": {"max_num_seqs": 256, "chunked_prefill": False}},
    {"cluster": {"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 32}},  # both models co-resident: time-sliced
    {"cluster": {"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 20}, "engine": {"max_num_seqs": 256, "preemption_mode": "swap"}},
])
def test_fast_forward_equals_per_iteration(variant):
    scenario = parse_scenario(scenario_dict(**variant), "test")
    fast = _compare_modes(scenario, lambda: random_chunks(400, ["qwen2.5-3b", "qwen3-8b"], 8.0, seed=1))
    assert fast["status"].eq("completed").all()


def test_reordering_policy_is_not_fast_forwarded_past_a_new_head():
    # slo-aware reorders its queue by deadline at every boundary: with whole (unchunked) prompts over the token
    # budget, another request reaches the head mid-window and starts (found by a fast==exact stress run).
    models = ["qwen2.5-3b", "qwen3-8b", "mistral-7b"]
    scenario = parse_scenario(scenario_dict(
        policy={"name": "slo-aware"}, models=[{"name": m} for m in models],
        cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 14},
        engine={"max_num_seqs": 4, "chunked_prefill": False, "max_num_batched_tokens": 512}), "test")
    fast = _compare_modes(scenario, lambda: random_chunks(105, models, 72.4, seed=1962, prompt_max=3000))
    assert fast["status"].eq("completed").sum() > 20


def test_kv_pressure_preempts_and_modes_agree():
    scenario = parse_scenario(scenario_dict(cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 20},
                                            engine={"max_num_seqs": 256}), "test")
    fast = _compare_modes(scenario, lambda: random_chunks(600, ["qwen2.5-3b", "qwen3-8b"], 30.0, seed=2, prompt_max=4000))
    assert fast["preemptions"].sum() > 0
    assert (fast.loc[fast["preemptions"] > 0, "lost_recompute_s"] > 0).all()


def test_deterministic_for_seed():
    scenario = parse_scenario(scenario_dict(), "test")
    a = simulate(scenario).requests
    b = simulate(scenario).requests
    pd.testing.assert_frame_equal(a, b)
    c = simulate(scenario, seed=99).requests
    assert len(c) != len(a) or not a["arrival_s"].equals(c["arrival_s"])


def _check_invariants(result, n):
    frame = result.requests
    assert len(frame) == n and frame["id"].is_unique
    done = frame[frame["status"].eq("completed")]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    assert (done["arrival_s"] <= done["first_scheduled_s"]).all()
    assert (done["first_scheduled_s"] <= done["first_token_s"]).all()
    assert (done["first_token_s"] <= done["finish_s"]).all()
    series = result.timeseries[result.timeseries["gpu"] >= 0]
    used = series.groupby(["time_s", "gpu"])[["weight_bytes", "kv_bytes"]].sum().sum(axis=1)
    assert (used <= 20 * 2**30 * 0.9 + 1).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 120), rate=st.floats(0.5, 60), seed=st.integers(0, 10_000), chunked=st.booleans(),
       max_seqs=st.integers(1, 64), output_max=st.sampled_from([3, 400]))
def test_invariants_hold_for_random_workloads(n, rate, seed, chunked, max_seqs, output_max):
    # Short outputs (1-2 tokens) make requests finish on their first token or right after it, the edge of a
    # prefill iteration and the decode window fast-forward joins to it.
    scenario = parse_scenario(scenario_dict(cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 20},
                                            engine={"max_num_seqs": max_seqs, "chunked_prefill": chunked,
                                                    "max_num_batched_tokens": 1024}, sample_interval_s=0.5), "test")
    workload = lambda: random_chunks(n, ["qwen2.5-3b", "qwen3-8b"], rate, seed, prompt_max=3000,  # noqa: E731
                                     output_max=output_max)
    result = simulate(scenario, chunks=workload())
    _check_invariants(result, n)
    assert result.summary["requests_completed"] + result.summary["requests_dropped"] == n
    _compare_modes(scenario, workload)


def test_weights_kept_on_host_reload_from_ram(monkeypatch):
    from sim.policies import Policy

    class Bounce(Policy):
        """Load model 0, evict it (keeping its weights in RAM) at 20 s, load it again when memory is free."""

        name = "bounce"

        def setup(self, view):
            self.first = view.load(0, view.gpus[0])
            view.call_at(20.0, lambda v: v.unload(self.first, mode="swap", keep_on_host=True))

        def on_unloaded(self, instance, view):
            assert view.host_cached(0, instance.gpu.node)
            view.load(0, view.gpus[0])

    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-14b"}]), "test")
    import sim.policies.registry as registry
    monkeypatch.setitem(registry._REGISTRY, "bounce", Bounce)
    result = simulate(scenario, policy="bounce", chunks=chunk_of([10.0, 30.0], ["qwen2.5-14b"] * 2, [100, 100], [5, 5]))
    loads = result.events[result.events["kind"] == "load"]
    assert list(loads["detail"]) == ["share=1 from=disk", "share=1 from=host"]
    costs = ModelCosts(load_profile("paper-rtx5000"), get_model("qwen2.5-14b"))
    assert loads["duration_s"].iloc[1] == pytest.approx(costs.reload_s(from_host=True))
    assert costs.reload_s(from_host=True) < costs.reload_s() / 3
    assert result.requests["status"].eq("completed").all()


def test_a_swapped_request_placed_on_a_fast_forwarding_instance_comes_back_at_its_next_boundary(monkeypatch):
    from sim.policies import Policy

    class MoveSwapped(Policy):
        """Test policy: the model on both GPUs of one node; the first request on GPU 0, the second on GPU 1. At 30 s
        GPU 0's instance is unloaded, its request's KV swapped to the node's RAM, and the request goes to GPU 1,
        whose instance is decoding alone (one fast-forward window): it swaps back in at the window's next
        boundary, as per-iteration mode has it, not when the window would have ended."""

        name = "move-swapped"

        def setup(self, view):
            self.first, self.second = view.load(0, view.gpus[0]), view.load(0, view.gpus[1])
            self.routed = 0
            view.call_at(30.0, lambda v: v.unload(self.first, mode="swap"))

        def route(self, request, view):
            self.routed += 1
            return self.first if self.routed == 1 else self.second

        def on_evicted(self, instance, requests, view):
            for request in requests:
                view.assign(request, self.second)

    import sim.policies.registry as registry
    monkeypatch.setitem(registry._REGISTRY, "move-swapped", MoveSwapped)
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}], policy={"name": "move-swapped"}), "test")
    fast = _compare_modes(scenario, lambda: chunk_of([20.0, 20.5], ["qwen2.5-3b"] * 2, [100, 100], [2000, 3000]))
    assert list(fast["preemptions"]) == [1, 0] and fast["lost_kv_in_s"].iloc[0] > 0
