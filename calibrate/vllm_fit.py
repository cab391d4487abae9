"""Fit mmsim's step-cost model to a real engine's step samples (``calibrate.vllm_probes.summarise``).

Each sample splits a step's wall time three ways, as the engine was timed:

- per-step CPU overhead = wall - executor time (scheduling, output processing): ``fixed + per_seq * S``;
- head = executor time - decoder forward (input preparation, LM head, sampling): per decode batch size
  (the grid) and ``intercept + slope * S`` over every step;
- decoder layers = forward / L: decode ``A(B) + K(B) * C`` per batch size (the grid) and
  ``a + b * B + c * C`` over all decode samples; prefill ``p0 + p1 * P + p2 * sum(P_i^2 + 2 P_i C_i)`` over
  prefill-only and mixed steps (less the mixed steps' decodes).

Every fit is non-negative least squares weighted by 1/time (``calibrate.fit.relative_nnls``); each term
reports its residuals (mean and largest relative error over its samples).
"""

from __future__ import annotations

import statistics

import numpy as np

from calibrate.fit import relative_nnls


def residuals(columns: list[list[float]], times_s: list[float], coefficients) -> dict:
    """Mean and largest |fit - sample| / sample, and the sample count."""
    if not times_s:
        return {"samples": 0, "mean_abs_pct": None, "max_abs_pct": None}
    fitted = np.asarray(columns, float).T @ np.asarray(coefficients, float)
    errors = np.abs(fitted - np.asarray(times_s)) / np.maximum(np.asarray(times_s), 1e-12)
    return {"samples": len(times_s), "mean_abs_pct": round(100 * float(errors.mean()), 2),
            "max_abs_pct": round(100 * float(errors.max()), 2)}


def _fit(columns: list[list[float]], times_s: list[float]) -> tuple[list[float], dict]:
    coefficients = [float(x) for x in relative_nnls(columns, times_s)]
    return coefficients, residuals(columns, times_s, coefficients)


def quadratic(prefills: list[list[int]]) -> int:
    return sum(p * p + 2 * p * c for p, c in prefills)


def fit_overhead(samples: list[dict]) -> tuple[dict, dict]:
    sequences = [s["batch"] + len(s["prefills"]) for s in samples]
    times = [max(s["wall_s"] - s["execute_s"], 1e-7) for s in samples]
    (fixed, per_seq), report = _fit([[1.0] * len(times), sequences], times)
    return {"fixed_s": fixed, "per_seq_s": per_seq}, report


def fit_head(samples: list[dict]) -> tuple[dict, dict]:
    """Head seconds: a line over all steps by sequence count, and the median at each decode batch size."""
    rows = [s for s in samples if s["forward_s"] > 0]
    sequences = [s["batch"] + len(s["prefills"]) for s in rows]
    times = [max(s["execute_s"] - s["forward_s"], 1e-7) for s in rows]
    (intercept, slope), report = _fit([[1.0] * len(times), sequences], times)
    by_batch: dict[int, list[float]] = {}
    for s, t in zip(rows, times):
        if s["kind"] == "decode":
            by_batch.setdefault(s["batch"], []).append(t)
    grid = [{"batch": b, "seconds": statistics.median(v)} for b, v in sorted(by_batch.items())]
    return {"intercept_s": intercept, "per_seq_s": slope, "grid": grid}, report


def _layer_time(sample: dict, layers: int) -> float:
    """Seconds per decoder layer of a sample (the whole executor time when the forward pass was not timed apart)."""
    return (sample["forward_s"] or sample["execute_s"]) / layers


def fit_decode(samples: list[dict], layers: int) -> tuple[dict, dict]:
    """Per-layer decode: the affine fit over (B, C) and, at each batch size, ``A(B) + K(B) * C``."""
    decode = [s for s in samples if s["kind"] == "decode"]
    times = [_layer_time(s, layers) for s in decode]
    columns = [[1.0] * len(decode), [float(s["batch"]) for s in decode], [s["context_tokens"] for s in decode]]
    (base, per_seq, per_context), report = _fit(columns, times)
    grid, per_batch = [], {}
    for batch in sorted({s["batch"] for s in decode}):
        rows = [(s["context_tokens"], t) for s, t in zip(decode, times) if s["batch"] == batch]
        if len({c for c, _ in rows}) > 1:
            (a, k), per_batch[batch] = _fit([[1.0] * len(rows), [c for c, _ in rows]], [t for _, t in rows])
        else:  # one context only: the shared per-context slope
            k = per_context
            a = max(0.0, statistics.fmean(t - k * c for c, t in rows))
        grid.append({"batch": batch, "base_s": a, "per_context_token_s": k})
    report["per_batch"] = {str(b): r for b, r in per_batch.items()}
    return {"decode_base_s": base, "decode_per_seq_s": per_seq, "decode_per_context_token_s": per_context,
            "decode_grid": grid}, report


def fit_prefill(samples: list[dict], layers: int, decode: dict) -> tuple[dict, dict]:
    """Per-layer prefill over prefill-only steps and mixed steps, less the mixed steps' decodes as ``decode`` prices
    them (mmsim charges a mixed step prefill + decode(B, C) - decode(0, 0): the fixed cost once)."""
    from sim.costs import BatchCurve

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
