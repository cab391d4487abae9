"""Physics never inverts: more work never costs less, on every built-in profile and model, one GPU or split
tensor- and pipeline-parallel, and on a profile fitted from noisy engine steps (Hypothesis).

More work means: one more sequence in a decode step (with any context of its own), more context, a longer
prompt chunk or more cached tokens before it, a prefill chunk added to a decode step, more KV tokens moved,
more layers on the GPU to load or unload.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.vllm_engine import StepRecord
from calibrate.vllm_fit import fit_engine_samples
from calibrate.vllm_probes import summarise
from sim.catalogue import catalogue, get_model
from sim.costs import ModelCosts
from sim.errors import MmsimError
from sim.profile import builtin_profile_names, load_profile, parse_profile

from test_calibrate_vllm_fit import LAYERS, steps
from test_costs import LAYER, tiny_profile

SLACK = 1e-12
"""Relative float rounding allowed in sums of a few dozen terms."""

PAIRS = [(p, m) for p in builtin_profile_names() for m in sorted(catalogue())]
SPLITS = [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)]


def model_costs(profile_name: str, model: str, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> ModelCosts:
    profile = load_profile(profile_name)
    entry = profile.models.get(model)
    return ModelCosts(profile, get_model(model), entry.dtype if entry else "fp16",
                      tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel)


def at_least(more: float, less: float) -> bool:
    return more >= less * (1 - SLACK)


def assert_more_work_never_costs_less(costs: ModelCosts, split: tuple[int, int], batch: int, context: int,
                                      added_context: int, tokens: int, added_tokens: int, cached: int, chunks: int):
    context = min(context, batch * 32_768)  # at most a long context per sequence
    step = costs.decode_step_s(batch, context)
    if split[1] > 1 and batch:
        # A pipeline's step is its largest micro-batch's pass, priced with an even share of the context (the
        # engine tracks only the total): a newcomer shorter than the mean moves context out of it on paper.
        added_context = max(added_context, -(-context // batch))
    assert at_least(costs.decode_step_s(batch + 1, context + added_context), step), "one more sequence"
    assert at_least(costs.decode_step_s(batch, context + added_context), step), "more context"
    prefill = costs.prefill_s(tokens, 1.0, cached)
    assert at_least(costs.prefill_s(tokens + added_tokens, 1.0, cached), prefill), "a longer chunk"
    assert at_least(costs.prefill_s(tokens, 1.0, cached + added_context), prefill), "more cached tokens before it"
    quadratic = tokens * tokens + 2 * tokens * cached
    if batch:  # (the engine never runs an empty decode step)
        assert at_least(costs.mixed_step_s(batch, context, tokens, quadratic, chunks), step), "a prefill chunk added"


WORK = dict(batch=st.integers(0, 512), context=st.integers(0, 500_000), added_context=st.integers(0, 32_768),
            tokens=st.integers(1, 16_384), added_tokens=st.integers(0, 4096), cached=st.integers(0, 32_768),
            chunks=st.integers(1, 8))


@pytest.mark.parametrize("profile_name, model", PAIRS)
@settings(max_examples=30, deadline=None)
@given(split=st.sampled_from(SPLITS), **WORK)
def test_more_work_never_costs_less(profile_name, model, split, **work):
    assert_more_work_never_costs_less(model_costs(profile_name, model, *split), split, **work)


def noisy_engine_profile(seed: int, noise: float) -> dict:
    """A profile fitted (as ``calibrate --engine vllm`` fits) from synthetic engine steps whose per-layer decode
    costs are shuffled between batch sizes and every step's time scattered by up to ``noise``."""
    rng = np.random.default_rng(seed)
    costs = [(1e-3, 1e-8), (1.2e-3, 2e-8), (1.6e-3, 2.5e-8), (2.5e-3, 3e-8)]
    decode = dict(zip((1, 2, 4, 16), (costs[i] for i in rng.permutation(len(costs)))))
    scattered = [(label, StepRecord(*(t * f for t in (step.wall_s, step.execute_s, step.forward_s)),
                                    step.decode_contexts, step.prefills))
                 for (label, step), f in zip(steps(decode), rng.uniform(1 - noise, 1 + noise, 10_000))]
    fit = fit_engine_samples(summarise(scattered), LAYERS)
    head = fit["head"]
    return tiny_profile("qwen2.5-3b", gpu={"source": "measured", **fit["layer"]}, cpu=None,
                        head_gpu_s=head["intercept_s"], head_gpu_per_seq_s=head["per_seq_s"], head_gpu_grid=head["grid"],
                        step_overhead={"source": "measured", **fit["overhead"]})


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), noise=st.sampled_from([0.0, 0.1, 0.2]), split=st.sampled_from(SPLITS), **WORK)
def test_a_profile_fitted_from_noisy_engine_steps_never_prices_more_work_lower(seed, noise, split, **work):
    profile = parse_profile(noisy_engine_profile(seed, noise), "fitted")
    costs = ModelCosts(profile, get_model("qwen2.5-3b"), "fp16", tensor_parallel=split[0], pipeline_parallel=split[1])
    assert_more_work_never_costs_less(costs, split, **work)


def test_a_chunk_fitted_cheaper_than_an_empty_decode_step_does_not_make_a_decode_step_cheaper():
    # Shuffled this way, the fit's prefill fixed cost (1.5 ms a layer) is below its decode step at batch 0
    # (1.567 ms): chunk + decodes - empty step came to 60.39 ms for a decode step of 60.99 ms alone.
    costs = ModelCosts(parse_profile(noisy_engine_profile(40135276, 0.0), "fitted"), get_model("qwen2.5-3b"), "fp16")
    assert costs.prefill_s(1) < costs.decode_step_s(0, 0)
    assert costs.mixed_step_s(1, 100, 1, 1, 1) == costs.decode_step_s(1, 100)


def test_a_profile_whose_grid_falls_is_refused_naming_it():
    falling = tiny_profile("qwen2.5-3b", gpu=LAYER | {"decode_grid": [
        {"batch": 1, "base_s": 1e-3, "per_context_token_s": 2e-7}, {"batch": 8, "base_s": 2e-3, "per_context_token_s": 1e-7}]})
    with pytest.raises(MmsimError, match=r"models\.qwen2\.5-3b\.gpu.*decode_grid: per_context_token_s falls from 2e-07 "
                                         r"at batch 1 to 1e-07 at batch 8"):
        parse_profile(falling, "falling")
    with pytest.raises(MmsimError, match="head_gpu_grid: seconds falls"):
        parse_profile(tiny_profile("qwen2.5-3b", head_gpu_grid=[{"batch": 1, "seconds": 2e-3}, {"batch": 4, "seconds": 1e-3}]),
                      "falling")


@pytest.mark.parametrize("profile_name, model", PAIRS)
@settings(max_examples=15, deadline=None)
@given(tokens=st.integers(0, 1_000_000), added=st.integers(0, 100_000), share=st.floats(0.0, 1.0),
       lower=st.floats(0.0, 1.0))
def test_moving_more_costs_more(profile_name, model, tokens, added, share, lower):
    costs = model_costs(profile_name, model)
    for direction in ("device_to_host", "host_to_device"):
        assert at_least(costs.kv_transfer_s(tokens + added, direction), costs.kv_transfer_s(tokens, direction))
    for from_host in (False, True):
        assert at_least(costs.reload_s(share, from_host), costs.reload_s(share * lower, from_host))
    assert at_least(costs.unload_s(share), costs.unload_s(share * lower))
