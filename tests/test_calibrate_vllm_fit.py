"""The engine-step fit (``calibrate.vllm_fit``) on synthetic steps made from known coefficients: it must give
them back, and the probe summary must classify and group steps as the scheduler composed them. No vLLM needed."""

from __future__ import annotations

import pytest

from calibrate.vllm_engine import StepRecord
from calibrate.vllm_fit import fit_engine_samples, quadratic
from calibrate.vllm_probes import kind_of, summarise

LAYERS = 4
OVERHEAD = (5e-4, 2e-5)  # fixed, per sequence
HEAD = {1: 4e-3, 4: 5e-3, 16: 9e-3}  # measured head seconds by decode batch (not a straight line)
DECODE = {1: (1e-3, 1e-8), 4: (1.2e-3, 2e-8), 16: (2.5e-3, 3e-8)}  # per layer: base, per context token
PREFILL = (1.5e-3, 4e-5, 2e-9)  # per layer: base, per token, per P^2 + 2PC


def head_s(sequences: int) -> float:
    return HEAD.get(sequences, 4e-3 + 3.3e-4 * sequences)


def synthetic_step(decode_contexts: list[int], prefills: list[tuple[int, int]]) -> StepRecord:
    """A step timed as the engine would time it, from the coefficients above."""
    batch = len(decode_contexts)
    forward = 0.0
    if batch:
        base, per_context = DECODE[batch]
        forward += LAYERS * (base + per_context * sum(decode_contexts))
    if prefills:
        base, per_token, per_sq = PREFILL
        forward += LAYERS * (base + per_token * sum(p for p, _ in prefills)
                             + per_sq * quadratic([list(p) for p in prefills]))
    sequences = batch + len(prefills)
    execute = forward + head_s(sequences)
    wall = execute + OVERHEAD[0] + OVERHEAD[1] * sequences
    return StepRecord(wall, execute, forward, list(decode_contexts), list(prefills))


def steps() -> list[tuple[str, StepRecord]]:
    out = []
    for batch in DECODE:
        for context in (64, 512, 1536):
            label = f"decode B={batch} ctx={context}"
            out += [(label, synthetic_step([context + i] * batch, [])) for i in range(6)]
    for prompt in (16, 256, 1024, 2048):
        out.append((f"prefill P={prompt}", synthetic_step([], [(prompt, 0)])))
    out.append(("prefill P=3000", synthetic_step([], [(952, 2048)])))
    return out


def test_a_decode_step_is_told_apart_from_prefill_and_mixed():
    assert kind_of(StepRecord(1.0, 1.0, 1.0, [10, 20], [])) == "decode"
    assert kind_of(StepRecord(1.0, 1.0, 1.0, [], [(5, 0)])) == "prefill"
    assert kind_of(StepRecord(1.0, 1.0, 1.0, [10], [(5, 0)])) == "mixed"


def test_summary_drops_the_first_decode_steps_of_each_probe_and_takes_medians():
    samples = summarise(steps())
    decode = [s for s in samples if s["kind"] == "decode"]
    assert len(decode) == 9 and all(s["steps"] == 4 for s in decode)  # 6 steps, 2 warm-up steps left out
    first = next(s for s in decode if s["probe"] == "decode B=4 ctx=64")
    assert first["context_tokens"] == pytest.approx(4 * (64 + 3.5))  # contexts 66..69, their mean


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
