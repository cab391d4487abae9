"""Cost model: hand-computed step prices, batch-grid interpolation, per-step overhead, KV bytes at the
model's dtype, and the physics property that moving layers to the CPU never makes anything faster."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalogue import catalogue, get_model
from sim.costs import ModelCosts
from sim.layer_costs import BatchCurve
from sim.profile import builtin_profile_names, load_profile, parse_profile

LAYER = {"source": "measured", "decode_base_s": 1e-3, "decode_per_seq_s": 1e-4, "decode_per_context_token_s": 1e-7,
         "prefill_base_s": 2e-3, "prefill_per_token_s": 1e-5, "prefill_per_token_sq_s": 1e-9}


def tiny_profile(model: str, **entry) -> dict:
    """A profile whose ``model`` entry has round numbers, so every price below can be worked out by hand."""
    link = {"source": "measured", "latency_s": 0.0, "bandwidth_bytes_per_s": 1e10}
    load = {"source": "measured", "fixed_s": 0.0, "bandwidth_bytes_per_s": 1e9}
    return {
        "schema_version": 1, "name": "hand", "hardware": {
            "gpu": {"source": "measured", "name": "G", "memory_bytes": 2**35},
            "cpu": {"source": "measured", "model": "C", "cores": 2}},
        "link": {"host_to_device": link, "device_to_host": link},
        "weights": {"from_disk": load, "from_host": load, "unload": {"source": "measured", "fixed_s": 0, "seconds_per_gib": 0}},
        "models": {model: {"dtype": "fp16", "gpu": LAYER, "cpu": LAYER | {"decode_base_s": 5e-3}, "head_gpu_s": 1e-3,
                           "head_gpu_per_seq_s": 1e-5, "head_cpu_s": 4e-3, **entry}},
    }


def costs_for(model: str = "qwen2.5-3b", **entry) -> ModelCosts:
    return ModelCosts(parse_profile(tiny_profile(model, **entry), "test"), get_model(model), "fp16")


def test_decode_step_by_hand():
    costs = costs_for()
    layers = 36  # qwen2.5-3b
    # 36 layers x (1 ms + 8 x 0.1 ms + 1e-7 x 4000) + head (1 ms + 8 x 10 us)
    assert costs.decode_step_s(8, 4000) == pytest.approx(36 * (1e-3 + 8e-4 + 4e-4) + 1e-3 + 8e-5, rel=1e-12)
    assert layers == costs.num_layers


def test_two_prefills_in_one_step_pay_attention_per_sequence():
    costs = costs_for()
    # Chunks of 300 tokens over 0 cached and 100 tokens over 500 cached: attention 300^2 + (100^2 + 2*100*500).
    quadratic = 300 * 300 + 100 * 100 + 2 * 100 * 500
    assert quadratic == 200_000  # not (300 + 100)^2 = 160_000 + the context term
    by_hand = 36 * (2e-3 + 1e-5 * 400 + 1e-9 * 200_000) + (1e-3 + 2 * 1e-5)  # head samples both sequences
    assert costs.mixed_step_s(0, 0, 400, quadratic, 2) == pytest.approx(by_hand, rel=1e-12)


def test_a_mixed_step_pays_the_fixed_costs_once():
    costs = costs_for()
    decodes = 36 * (1e-4 * 4 + 1e-7 * 2000) + 1e-5 * 4  # what 4 decodes add to a step
    prefill = 36 * (2e-3 + 1e-5 * 100 + 1e-9 * 100 * 100) + 1e-3 + 1e-5
    assert costs.mixed_step_s(4, 2000, 100, 100 * 100, 1) == pytest.approx(prefill + decodes, rel=1e-12)


def test_step_overhead_is_fixed_plus_per_sequence():
    overhead = {"source": "measured", "fixed_s": 2e-3, "per_seq_s": 1e-4}
    plain, with_overhead = costs_for(), costs_for(step_overhead=overhead)
    assert with_overhead.decode_step_s(8, 1000) - plain.decode_step_s(8, 1000) == pytest.approx(2e-3 + 8e-4, rel=1e-9)
    assert with_overhead.prefill_s(64) - plain.prefill_s(64) == pytest.approx(2e-3 + 1e-4, rel=1e-9)
    # A mixed step of 3 decodes and 2 prefills: one fixed part, five sequences.
    args = (3, 900, 200, 20_000, 2)
    assert with_overhead.mixed_step_s(*args) - plain.mixed_step_s(*args) == pytest.approx(2e-3 + 5e-4, rel=1e-9)


def test_profile_wide_overhead_applies_to_models_without_their_own():
    data = tiny_profile("qwen2.5-3b")
    data["step_overhead"] = {"source": "estimated", "fixed_s": 1e-3, "per_seq_s": 0.0}
    costs = ModelCosts(parse_profile(data, "test"), get_model("qwen2.5-3b"), "fp16")
    assert costs.decode_step_s(1, 0) - costs_for().decode_step_s(1, 0) == pytest.approx(1e-3, rel=1e-9)


def test_decode_grid_interpolates_between_measured_batches():
    grid = [{"batch": 1, "base_s": 2e-3, "per_context_token_s": 1e-7}, {"batch": 16, "base_s": 5e-3, "per_context_token_s": 4e-7}]
    head = [{"batch": 1, "seconds": 1e-3}, {"batch": 16, "seconds": 4e-3}]
    costs = costs_for(gpu=LAYER | {"decode_grid": grid}, head_gpu_grid=head)
    # Batch 6 is a third of the way from 1 to 16: base 3 ms, 2e-7 s per context token, head 2 ms.
    assert costs.decode_step_s(6, 1000) == pytest.approx(36 * (3e-3 + 2e-7 * 1000) + 2e-3, rel=1e-12)
    assert costs.decode_step_s(16, 0) == pytest.approx(36 * 5e-3 + 4e-3, rel=1e-12)
    # Past the grid: the last segment's slope (0.2 ms per sequence), still affine in context.
    assert costs.decode_step_s(31, 0) == pytest.approx(36 * 8e-3 + 7e-3, rel=1e-12)
    one, two = costs.step_coefficients(6), costs.decode_step_s(6, 2000) - costs.decode_step_s(6, 1000)
    assert two == pytest.approx(one.per_context_token_s * 1000, rel=1e-12)


def test_batch_curve_without_points_is_a_line():
    assert BatchCurve(1.0, 0.5, []).at(4) == 3.0
    assert BatchCurve(1.0, 0.5, [(2, 1.5), (4, 1.7)]).at(3) == pytest.approx(1.6)


def test_kv_bytes_follow_an_fp32_model():
    spec = get_model("qwen2.5-3b")
    profile = load_profile("h100-sxm")
    assert ModelCosts(profile, spec, "fp32").kv_bytes_per_token == 2 * 36 * 2 * 128 * 4
    assert ModelCosts(profile, spec, "fp16").kv_bytes_per_token == 36_864
    assert ModelCosts(profile, spec, "q4").kv_bytes_per_token == 36_864  # quantised weights keep a 16-bit cache


def test_repro_offload_prefill_no_longer_gets_faster():
    costs = ModelCosts(load_profile("paper-rtx5000"), get_model("qwen2.5-3b"), "fp16")
    ttft = [costs.prefill_s(1, share) for share in (1.0, 0.75, 0.5)]
    assert ttft[0] == pytest.approx(0.030479, abs=1e-6)  # the reproducer's figure at full residency
    assert ttft[0] < ttft[1] < ttft[2]


def test_a_measured_cheaper_cpu_is_believed():
    cheap = LAYER | {"decode_base_s": 1e-4}
    costs = costs_for(cpu=cheap, head_cpu_s=1e-3)
    assert costs.decode_step_s(1, 0, 0.5) < costs.decode_step_s(1, 0, 1.0)


PAIRS = [(p, m) for p in builtin_profile_names() for m in sorted(catalogue())]


@pytest.mark.parametrize("profile_name, model", PAIRS)
@settings(max_examples=25, deadline=None)
@given(batch=st.integers(0, 512), context=st.integers(0, 200_000), tokens=st.integers(1, 16_384),
       cached=st.integers(0, 32_768), share=st.floats(0.0, 1.0, allow_subnormal=False),
       lower=st.floats(0.0, 1.0, allow_subnormal=False))  # another suite module may have set flush-to-zero
def test_less_gpu_share_is_never_faster(profile_name, model, batch, context, tokens, cached, share, lower):
    profile = load_profile(profile_name)
    entry = profile.models.get(model)
    costs = ModelCosts(profile, get_model(model), entry.dtype if entry else "fp16")
    low = share * lower
    quadratic = tokens * tokens + 2 * tokens * cached
    slack = 1e-12  # float rounding of sums of a few dozen terms
    assert costs.decode_step_s(batch, context, low) >= costs.decode_step_s(batch, context, share) * (1 - slack)
    assert costs.prefill_s(tokens, low, cached) >= costs.prefill_s(tokens, share, cached) * (1 - slack)
    assert (costs.mixed_step_s(batch, context, tokens, quadratic, 1, low)
            >= costs.mixed_step_s(batch, context, tokens, quadratic, 1, share) * (1 - slack))
