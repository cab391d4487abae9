"""The engine-step fit (``calibrate.vllm_fit``) on synthetic steps made from known coefficients: it must give
them back, price noisy steps at their mean, and the probe summary must classify and group steps as the
scheduler composed them; the probe plan's sizes, by hand. No vLLM needed."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.fit import relative_nnls
from calibrate.vllm_engine import EngineLimits, StepRecord
from calibrate.vllm_fit import fit_engine_samples, mean_relative_nnls, non_decreasing, quadratic
from calibrate.vllm_probes import QUICK, kind_of, plan_for, summarise, sweep_output_tokens

LAYERS = 4
OVERHEAD = (5e-4, 2e-5)  # fixed, per sequence
HEAD = {1: 4e-3, 4: 5e-3, 16: 9e-3}  # measured head seconds by decode batch (not a straight line)
DECODE = {1: (1e-3, 1e-8), 4: (1.2e-3, 2e-8), 16: (2.5e-3, 3e-8)}  # per layer: base, per context token
PREFILL = (1.5e-3, 4e-5, 2e-9)  # per layer: base, per token, per P^2 + 2PC


def head_s(sequences: int) -> float:
    return HEAD.get(sequences, 4e-3 + 3.3e-4 * sequences)


def synthetic_step(decode_contexts: list[int], prefills: list[tuple[int, int]], decode: dict = DECODE) -> StepRecord:
    """A step timed as the engine would time it, from the coefficients above (``decode``: per-layer decode costs)."""
    batch = len(decode_contexts)
    forward = 0.0
    if batch:
        base, per_context = decode[batch]
        forward += LAYERS * (base + per_context * sum(decode_contexts))
    if prefills:
        base, per_token, per_sq = PREFILL
        forward += LAYERS * (base + per_token * sum(p for p, _ in prefills)
                             + per_sq * quadratic([list(p) for p in prefills]))
    sequences = batch + len(prefills)
    execute = forward + head_s(sequences)
    wall = execute + OVERHEAD[0] + OVERHEAD[1] * sequences
    return StepRecord(wall, execute, forward, list(decode_contexts), list(prefills))


def steps(decode: dict = DECODE) -> list[tuple[str, StepRecord]]:
    out = []
    for batch in decode:
        for context in (64, 512, 1536):
            label = f"decode B={batch} ctx={context}"
            out += [(label, synthetic_step([context + i] * batch, [], decode)) for i in range(6)]
    for prompt in (16, 256, 1024, 2048):
        out.append((f"prefill P={prompt}", synthetic_step([], [(prompt, 0)])))
    out.append(("prefill P=3000", synthetic_step([], [(952, 2048)])))
    return out


def test_a_decode_step_is_told_apart_from_prefill_and_mixed():
    assert kind_of(StepRecord(1.0, 1.0, 1.0, [10, 20], [])) == "decode"
    assert kind_of(StepRecord(1.0, 1.0, 1.0, [], [(5, 0)])) == "prefill"
    assert kind_of(StepRecord(1.0, 1.0, 1.0, [10], [(5, 0)])) == "mixed"


def test_summary_drops_the_first_decode_steps_of_each_probe_and_takes_means():
    samples = summarise(steps())
    decode = [s for s in samples if s["kind"] == "decode"]
    assert len(decode) == 9 and all(s["steps"] == 4 for s in decode)  # 6 steps, 2 warm-up steps left out
    first = next(s for s in decode if s["probe"] == "decode B=4 ctx=64")
    assert first["context_tokens"] == pytest.approx(4 * (64 + 3.5))  # contexts 66..69, their mean
    # One step of four taken three times as long (another process had the core): a latency pays it, so the
    # sample does too: (10 + 10 + 10 + 30) / 4 ms, where the median said 10 ms.
    walls = [0.010, 0.010, 0.010, 0.010, 0.010, 0.030]
    noisy = summarise([("decode B=1 ctx=64", StepRecord(w, w, w, [64 + i], [])) for i, w in enumerate(walls)])
    assert noisy[0]["wall_s"] == pytest.approx(0.015) and noisy[0]["wall_max_s"] == 0.030


def test_the_fit_prices_noisy_steps_at_their_mean():
    # A constant cost sampled as 1, 1, 1 and 2 s: weighting rows by 1/sample minimises sum((c - y)/y)^2, so
    # c = sum(1/y) / sum(1/y^2) = 3.5 / 3.25 s, 14% below the mean the samples' sum is made of.
    ones, times = [[1.0] * 4], [1.0, 1.0, 1.0, 2.0]
    assert relative_nnls(ones, times)[0] == pytest.approx(3.5 / 3.25)
    assert mean_relative_nnls(ones, times)[0] == pytest.approx([1.25])  # too few samples to call 2 s an outlier
    # A line a + b x under relative noise of +-30%, each x sampled once high and once low: its mean is the
    # line itself, and the fit gives the line back; the 1/sample weighting scales it by
    # (1.3 + 0.7) * 1.3 * 0.7 / (1.3^2 + 0.7^2) = 0.835, the constant case's formula at each x.
    x = np.repeat(np.arange(1.0, 17.0), 2)
    line = 2e-3 + 5e-4 * x
    noisy = line * np.tile([1.3, 0.7], 16)
    columns = [[1.0] * len(x), list(x)]
    fitted, kept = mean_relative_nnls(columns, list(noisy))
    assert fitted == pytest.approx([2e-3, 5e-4], rel=1e-6) and kept.all()
    low = relative_nnls(columns, list(noisy))
    assert np.column_stack(columns) @ low == pytest.approx(line * 2.0 * 1.3 * 0.7 / (1.3**2 + 0.7**2), rel=1e-6)


def test_a_probe_caught_in_another_jobs_burst_is_left_out():
    # 21 samples of a line scattered by up to +-5%, and one taken twice as long: 3 robust standard deviations
    # of the residuals are about 15%, so the slow one is left out and the line comes back as if it were not
    # there.
    x = np.arange(1.0, 22.0)
    times = (1e-2 + 1e-3 * x) * (1 + 0.05 * np.sin(3 * x))
    times[7] *= 2
    fitted, kept = mean_relative_nnls([[1.0] * len(x), list(x)], list(times))
    assert list(np.flatnonzero(~kept)) == [7]
    clean = np.delete(np.arange(len(x)), 7)
    assert fitted == pytest.approx(mean_relative_nnls([[1.0] * 20, list(x[clean])], list(times[clean]))[0], rel=1e-9)
    assert fitted == pytest.approx([1e-2, 1e-3], rel=0.02)


def test_a_decode_sweep_outlasts_its_prefills_and_every_phase():
    plan = plan_for(True, EngineLimits(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=1024))
    assert plan.decode_batches == tuple(range(1, 17)) and QUICK.decode_steps == 10
    # 16 prompts of 1536 tokens through a 2048-token budget less one token per decoding request: at most
    # ceil(24576 / 2032) = 13 steps of prefill, then 16 phases of 10 + 2 decode steps; the token of the
    # prefill step itself and one to spare.
    assert sweep_output_tokens(plan, 1536, 2048) == 13 + 16 * 12 + 2
    # 512 + ceil(8192 / 2032) + 2 + 192 = 711 tokens fit a 1024-token model length; 1536 + ... does not
    assert plan.decode_contexts == (64, 512)
    assert max(plan.prefill_prompts) == 1000 and all(p < 1023 for _, p in plan.mixed)


def test_the_fit_gives_back_the_coefficients_it_was_made_from():
    fit = fit_engine_samples(summarise(steps()), LAYERS)
    assert fit["overhead"]["fixed_s"] == pytest.approx(OVERHEAD[0], rel=1e-3)
    assert fit["overhead"]["per_seq_s"] == pytest.approx(OVERHEAD[1], rel=1e-3)
    grid = {point["batch"]: point for point in fit["layer"]["decode_grid"]}
    for batch, (base, per_context) in DECODE.items():
        assert grid[batch]["base_s"] == pytest.approx(base, rel=1e-6)
        assert grid[batch]["per_context_token_s"] == pytest.approx(per_context, rel=1e-6)
    assert {p["batch"]: p["seconds"] for p in fit["head"]["grid"]} == pytest.approx(HEAD, rel=1e-9)
    layer = fit["layer"]
    assert (layer["prefill_base_s"], layer["prefill_per_token_s"], layer["prefill_per_token_sq_s"]) == pytest.approx(
        PREFILL, rel=1e-4)
    assert fit["residuals"]["prefill_layers"]["max_abs_pct"] < 0.1
    assert fit["residuals"]["step_overhead"]["samples"] == len(summarise(steps()))


def test_a_grid_that_falls_is_pooled_to_the_closest_one_that_does_not():
    # By hand: 5 (weight 1) above 4 (weight 3) pool to (5 + 12) / 4; a falling run pools to its mean.
    assert non_decreasing([3.0, 5.0, 4.0, 6.0], [1, 1, 3, 1]) == [3.0, 4.25, 4.25, 6.0]
    assert non_decreasing([5.0, 4.0, 3.0], [1, 1, 1]) == [4.0, 4.0, 4.0]
    assert non_decreasing([1.0, 2.0], [1, 1]) == [1.0, 2.0]


def test_decode_measured_faster_at_a_bigger_batch_is_priced_no_cheaper_than_the_smaller():
    # Batch 4 measured below batch 1 in both terms (noise between neighbouring sizes): the grid pools the two,
    # each batch size weighing its 3 contexts' samples alike: (1.2 + 1.0) / 2 ms and (2 + 1) / 2 x 1e-8.
    inverted = {1: (1.2e-3, 2e-8), 4: (1.0e-3, 1e-8), 16: (2.5e-3, 3e-8)}
    fit = fit_engine_samples(summarise(steps(inverted)), LAYERS)
    grid = {point["batch"]: point for point in fit["layer"]["decode_grid"]}
    for batch in (1, 4):
        assert grid[batch]["base_s"] == pytest.approx(1.1e-3, rel=1e-6)
        assert grid[batch]["per_context_token_s"] == pytest.approx(1.5e-8, rel=1e-6)
    assert grid[16]["base_s"] == pytest.approx(2.5e-3, rel=1e-6)
    assert fit["residuals"]["decode_layers"]["pooled_for_monotone"] == 4
