"""Fit mmsim's step-cost model to a real engine's step samples (``calibrate.vllm_probes.summarise``).

Each sample splits a step's wall time three ways, as the engine was timed:

- per-step CPU overhead = wall - executor time (scheduling, output processing): ``fixed + per_seq * S``;
- head = executor time - decoder forward (input preparation, LM head, sampling): per decode batch size
  (the grid) and ``intercept + slope * S`` over every step;
- decoder layers = forward / L: decode ``A(B) + K(B) * C`` per batch size (the grid) and
  ``a + b * B + c * C`` over all decode samples; prefill ``p0 + p1 * P + p2 * sum(P_i^2 + 2 P_i C_i)`` over
  prefill-only and mixed steps (less the mixed steps' decodes).

Every fit is non-negative least squares on relative error, weighted by 1/fitted time (:func:`mean_relative_nnls`):
a replay's latencies are sums of step times, so a fit must price a step at its mean. Samples more than
``OUTLIER_MADS`` robust standard deviations off the fit (a probe caught in another job's burst, which ran
the same steps up to twice as slow for tens of seconds) are left out and counted. Each term reports its
residuals (mean and largest relative error over the samples kept) and its outliers. The grids (decode
and head by batch size) are made non-decreasing in the batch, the closest such grid in weighted least squares:
measured means of neighbouring batch sizes can invert by noise, and mmsim's profiles refuse a grid that prices
more sequences below fewer; each term reports how many grid values were pooled.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from calibrate.fit import nnls, relative_nnls

REWEIGHTS = 4  # rounds of reweighting: two bring the coefficients within 0.1% of their limit, four within 1e-6
OUTLIER_MADS = 3.0  # the usual 3-sigma cut, with sigma estimated as 1.4826 x the median absolute deviation
ROBUST_MAD_SCALE = 1.4826  # MAD -> standard deviation of a normal distribution
MIN_SPREAD = 0.01  # relative: near-identical samples must not make ordinary 1-2% scatter an outlier
SPARE_ROWS = 3  # rows beyond the coefficients before a fit's residuals can single out an outlier


def residuals(columns: list[list[float]], times_s: list[float], coefficients, kept: np.ndarray | None = None) -> dict:
    """Mean and largest |fit - sample| / sample over the samples kept, the sample count and the outliers."""
    if not times_s:
        return {"samples": 0, "outliers": 0, "mean_abs_pct": None, "max_abs_pct": None}
    kept = np.ones(len(times_s), bool) if kept is None else kept
    fitted = np.asarray(columns, float).T @ np.asarray(coefficients, float)
    errors = (np.abs(fitted - np.asarray(times_s)) / np.maximum(np.asarray(times_s), 1e-12))[kept]
    return {"samples": len(times_s), "outliers": int((~kept).sum()), "mean_abs_pct": round(100 * float(errors.mean()), 2),
            "max_abs_pct": round(100 * float(errors.max()), 2)}


def inliers(relative_residuals: np.ndarray) -> np.ndarray:
    """The samples within ``OUTLIER_MADS`` robust standard deviations (at least ``MIN_SPREAD``) of the median
    residual; all of them when there are fewer than 5 to tell by."""
    r = np.asarray(relative_residuals, float)
    if len(r) < 5:
        return np.ones(len(r), bool)
    centre = float(np.median(r))
    spread = max(ROBUST_MAD_SCALE * float(np.median(np.abs(r - centre))), MIN_SPREAD)
    return np.abs(r - centre) <= OUTLIER_MADS * spread


def robust_mean(values: list[float]) -> float:
    """The mean of ``values`` without their outliers (see :func:`inliers`)."""
    v = np.asarray(values, float)
    return float(v[inliers(v / v.mean() - 1)].mean())


def non_decreasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares fit to ``values`` (in batch order) that never falls: pool adjacent violators.

    Noise of 10-20% between neighbouring batch sizes would otherwise price a bigger batch below a smaller one,
    and a step that admits a sequence would get cheaper."""
    blocks: list[list[float]] = []  # [weighted mean, weight, points pooled]
    for value, weight in zip(values, weights):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, n2), (m1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [mean for mean, _, count in blocks for _ in range(int(count))]


def _pooled(before: list[float], after: list[float]) -> int:
    return sum(a != b for a, b in zip(before, after))


def mean_relative_nnls(columns: list[list[float]], times_s: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """NNLS on relative error with rows weighted by 1/fitted time, iterated from the 1/sample weighting: the
    quasi-likelihood fit of times whose scatter is proportional to their size, which estimates their mean.

    Weights of 1/sample favour the samples that happened to run fast: a replay's steps on this shared 2-core
    machine (scattered by 10-20% by other processes), fitted that way, were priced 4.5-5.4% below the mean
    of the very steps fitted, and every simulated latency comes out short by as much. Weights from the
    fitted times keep the relative scaling (a 10 ms step counts as much as a 1 s one) without that bias.
    Returns the coefficients, fitted again without the outliers of the first fit, and the mask of the rows kept."""
    a = np.column_stack([np.asarray(c, float) for c in columns])
    y = np.asarray(times_s, float)
    coefficients = _quasi_likelihood(a, y)
    enough = len(y) >= a.shape[1] + SPARE_ROWS
    kept = inliers(y / np.maximum(a @ coefficients, 1e-12) - 1) if enough else np.ones(len(y), bool)
    if not kept.all():
        coefficients = _quasi_likelihood(a[kept], y[kept])
    return coefficients, kept


def _quasi_likelihood(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    coefficients = relative_nnls(list(a.T), list(y))
    floor_s = 1e-3 * max(float(y.min()), 1e-12)  # a fitted time near 0 must not take all the weight
    for _ in range(REWEIGHTS):
        weight = 1.0 / np.maximum(a @ coefficients, floor_s)
        coefficients = nnls(a * weight[:, None], y * weight)
    return coefficients


def _fit(columns: list[list[float]], times_s: list[float]) -> tuple[list[float], dict]:
    coefficients, kept = mean_relative_nnls(columns, times_s)
    values = [float(x) for x in coefficients]
    return values, residuals(columns, times_s, values, kept)


def quadratic(prefills: list[list[int]]) -> int:
    return sum(p * p + 2 * p * c for p, c in prefills)


def fit_overhead(samples: list[dict]) -> tuple[dict, dict]:
    sequences = [s["batch"] + len(s["prefills"]) for s in samples]
    times = [max(s["wall_s"] - s["execute_s"], 1e-7) for s in samples]
    (fixed, per_seq), report = _fit([[1.0] * len(times), sequences], times)
    return {"fixed_s": fixed, "per_seq_s": per_seq}, report


def fit_head(samples: list[dict]) -> tuple[dict, dict]:
    """Head seconds: a line over all steps by sequence count, and the mean at each decode batch size (without
    its outliers), made non-decreasing in the batch (:func:`non_decreasing`)."""
    rows = [s for s in samples if s["forward_s"] > 0]
    sequences = [s["batch"] + len(s["prefills"]) for s in rows]
    times = [max(s["execute_s"] - s["forward_s"], 1e-7) for s in rows]
    (intercept, slope), report = _fit([[1.0] * len(times), sequences], times)
    by_batch: dict[int, list[float]] = {}
    for s, t in zip(rows, times):
        if s["kind"] == "decode":
            by_batch.setdefault(s["batch"], []).append(t)
    batches = sorted(by_batch)
    means = [robust_mean(by_batch[b]) for b in batches]
    seconds = non_decreasing(means, [len(by_batch[b]) for b in batches])
    report["pooled_for_monotone"] = _pooled(means, seconds)
    grid = [{"batch": b, "seconds": s} for b, s in zip(batches, seconds)]
    return {"intercept_s": intercept, "per_seq_s": slope, "grid": grid}, report


def _layer_time(sample: dict, layers: int) -> float:
    """Seconds per decoder layer of a sample (the whole executor time when the forward pass was not timed apart)."""
    return (sample["forward_s"] or sample["execute_s"]) / layers


def fit_decode(samples: list[dict], layers: int) -> tuple[dict, dict]:
    """Per-layer decode: the affine fit over (B, C) and, at each batch size, ``A(B) + K(B) * C`` with A and K
    made non-decreasing in B (:func:`non_decreasing`)."""
    decode = [s for s in samples if s["kind"] == "decode"]
    times = [_layer_time(s, layers) for s in decode]
    columns = [[1.0] * len(decode), [float(s["batch"]) for s in decode], [s["context_tokens"] for s in decode]]
    (base, per_seq, per_context), report = _fit(columns, times)
    batches, per_batch = sorted({s["batch"] for s in decode}), {}
    bases: list[float] = []
    slopes: list[float] = []
    counts: list[int] = []
    for batch in batches:
        rows = [(s["context_tokens"], t) for s, t in zip(decode, times) if s["batch"] == batch]
        if len({c for c, _ in rows}) > 1:
            (a, k), per_batch[batch] = _fit([[1.0] * len(rows), [c for c, _ in rows]], [t for _, t in rows])
        else:  # one context only: the shared per-context slope
            k = per_context
            a = max(0.0, statistics.fmean(t - k * c for c, t in rows))
        bases.append(a)
        slopes.append(k)
        counts.append(len(rows))
    # Both terms must not fall as the batch grows: with a falling per-token term, one more sequence would make
    # a step over a long context cheaper.
    monotone_bases, monotone_slopes = non_decreasing(bases, counts), non_decreasing(slopes, counts)
    grid = [{"batch": b, "base_s": a, "per_context_token_s": k} for b, a, k in zip(batches, monotone_bases, monotone_slopes)]
    report["per_batch"] = {str(b): r for b, r in per_batch.items()}
    report["pooled_for_monotone"] = _pooled(bases, monotone_bases) + _pooled(slopes, monotone_slopes)
    return {"decode_base_s": base, "decode_per_seq_s": per_seq, "decode_per_context_token_s": per_context,
            "decode_grid": grid}, report


def fit_prefill(samples: list[dict], layers: int, decode: dict) -> tuple[dict, dict]:
    """Per-layer prefill over prefill-only steps and mixed steps, less the mixed steps' decodes as ``decode`` prices
    them (mmsim charges a mixed step prefill + decode(B, C) - decode(0, 0): the fixed cost once)."""
    from sim.layer_costs import BatchCurve

    grid = decode["decode_grid"]
    base = BatchCurve(decode["decode_base_s"], decode["decode_per_seq_s"], [(p["batch"], p["base_s"]) for p in grid])
    per_context = BatchCurve(decode["decode_per_context_token_s"], 0.0, [(p["batch"], p["per_context_token_s"]) for p in grid])
    rows = [s for s in samples if s["kind"] in ("prefill", "mixed")]
    times = []
    for s in rows:
        decodes = base.at(s["batch"]) + per_context.at(s["batch"]) * s["context_tokens"] - base.at(0) if s["batch"] else 0.0
        times.append(max(_layer_time(s, layers) - decodes, 1e-7))
    columns = [[1.0] * len(rows), [float(sum(p for p, _ in s["prefills"])) for s in rows],
               [float(quadratic(s["prefills"])) for s in rows]]
    (base_s, per_token, per_token_sq), report = _fit(columns, times)
    return {"prefill_base_s": base_s, "prefill_per_token_s": per_token, "prefill_per_token_sq_s": per_token_sq}, report


def fit_engine_samples(samples: list[dict], layers: int) -> dict:
    """Every term's coefficients and residuals from one model's step samples."""
    overhead, overhead_report = fit_overhead(samples)
    head, head_report = fit_head(samples)
    decode, decode_report = fit_decode(samples, layers)
    prefill, prefill_report = fit_prefill(samples, layers, decode)
    return {"overhead": overhead, "head": head, "layer": decode | prefill,
            "residuals": {"step_overhead": overhead_report, "head": head_report, "decode_layers": decode_report,
                          "prefill_layers": prefill_report}}


def whole_step_errors(samples: list[dict], predict) -> dict:
    """Per step kind: mean signed and mean absolute error (%) of ``predict(sample)`` against the wall time."""
    out = {}
    for kind in ("decode", "prefill", "mixed"):
        rows = [s for s in samples if s["kind"] == kind]
        if not rows:
            continue
        errors = [100 * (predict(s) - s["wall_s"]) / s["wall_s"] for s in rows]
        out[kind] = {"samples": len(rows), "mean_pct": round(statistics.fmean(errors), 2),
                     "mean_abs_pct": round(statistics.fmean(abs(e) for e in errors), 2),
                     "max_abs_pct": round(max(abs(e) for e in errors), 2)}
    return out
