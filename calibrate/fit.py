"""Least-squares fits that turn timing samples into the profile's cost curves.

Every fit is non-negative least squares (a cost coefficient below zero is
noise, not physics) on rows weighted by 1/time, so a 1 MB copy counts as much
as a 1 GB one: the fit minimises relative, not absolute, error. NNLS is
Lawson-Hanson's active-set method in numpy (scipy is not a dependency).

Samples are the dicts the benchmarks record; each has ``typical_s`` (see ``calibrate.timing``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

GIB = 2**30


def nnls(a: np.ndarray, b: np.ndarray, max_iterations: int = 100) -> np.ndarray:
    """``x >= 0`` minimising ``|a x - b|``: Lawson-Hanson active set, on unit-norm columns for conditioning."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    scaled = a / norms
    n = scaled.shape[1]
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    tolerance = 1e-12 * max(1.0, float(np.abs(scaled.T @ b).max(initial=0.0)))
    for _ in range(max_iterations):
        gradient = scaled.T @ (b - scaled @ x)
        if passive.all() or gradient[~passive].max() <= tolerance:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            trial = np.zeros(n)
            trial[passive] = np.linalg.lstsq(scaled[:, passive], b, rcond=None)[0]
            if (trial[passive] > 0).all():
                x = trial
                break
            # step back towards the last feasible point until one coefficient reaches zero, then drop it
            blocking = passive & (trial <= 0)
            step = np.min(x[blocking] / (x[blocking] - trial[blocking]))
            x = x + step * (trial - x)
            passive &= x > tolerance
            x[~passive] = 0.0
            if not passive.any():
                break
    return x / norms


def relative_nnls(columns: Sequence[Sequence[float]], times_s: Sequence[float]) -> np.ndarray:
    """NNLS of ``times_s`` on ``columns`` (one list per coefficient), rows weighted by 1/time."""
    y = np.asarray(times_s, float)
    a = np.column_stack([np.asarray(c, float) for c in columns])
    weight = 1.0 / np.maximum(y, 1e-12)
    return nnls(a * weight[:, None], y * weight)


def max_relative_error(columns: Sequence[Sequence[float]], times_s: Sequence[float],
                       coefficients: Sequence[float] | np.ndarray) -> float:
    """Largest |fit - sample| / sample over the samples: how well the curve explains them."""
    y = np.asarray(times_s, float)
    predicted = np.column_stack([np.asarray(c, float) for c in columns]) @ coefficients
    return float(np.max(np.abs(predicted - y) / np.maximum(y, 1e-12)))


def _times(samples: Sequence[dict]) -> list[float]:
    return [s["typical_s"] for s in samples]


def fit_decode(samples: Sequence[dict]) -> tuple[dict, float]:
    """Per-layer decode ``t = a + b*B + c*C`` (B sequences, C cached tokens in total); coefficients and max error."""
    columns = [[1.0] * len(samples), [s["batch"] for s in samples], [s["context_tokens"] for s in samples]]
    coef = relative_nnls(columns, _times(samples))
    fields = {"decode_base_s": coef[0], "decode_per_seq_s": coef[1], "decode_per_context_token_s": coef[2]}
    return {k: float(v) for k, v in fields.items()}, max_relative_error(columns, _times(samples), coef)


def fit_prefill(samples: Sequence[dict]) -> tuple[dict, float]:
    """Per-layer prefill ``t = a + b*P + c*P^2`` of one P-token prompt; coefficients and max error."""
    tokens = [float(s["prompt_tokens"]) for s in samples]
    columns = [[1.0] * len(samples), tokens, [p * p for p in tokens]]
    coef = relative_nnls(columns, _times(samples))
    fields = {"prefill_base_s": coef[0], "prefill_per_token_s": coef[1], "prefill_per_token_sq_s": coef[2]}
    return {k: float(v) for k, v in fields.items()}, max_relative_error(columns, _times(samples), coef)


def fit_affine(x: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Non-negative intercept and slope of ``t = intercept + slope * x``."""
    coef = relative_nnls([[1.0] * len(x), list(x)], times_s)
    return float(coef[0]), float(coef[1])


def _bandwidth(fixed_s: float, per_byte_s: float, sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """(fixed, bandwidth); when noise leaves no per-byte slope, the best observed rate with no fixed cost."""
    if per_byte_s > 0:
        return fixed_s, 1.0 / per_byte_s
    return 0.0, max(size / max(t, 1e-12) for size, t in zip(sizes_bytes, times_s))


def fit_transfer(bulk: Sequence[dict], chunked: Sequence[dict]) -> dict:
    """Link fit: latency and bandwidth from bulk copies, per-copy latency from per-layer copies of the same sizes.

    Bulk: ``t = latency + bytes / bw``. Per-layer (n copies): the excess over the
    bulk curve, ``t - (latency + bytes / bw)``, fitted as ``(n - 1) * per_copy``.
    """
    sizes, times = [s["bytes"] for s in bulk], _times(bulk)
    latency, per_byte = fit_affine(sizes, times)
    latency, bandwidth = _bandwidth(latency, per_byte, sizes, times)
    per_copy = 0.0
    if chunked:
        excess = [s["typical_s"] - latency - s["bytes"] / bandwidth for s in chunked]
        extra_copies = [s["copies"] - 1 for s in chunked]
        weight = np.array([1.0 / s["typical_s"] for s in chunked])
        per_copy = float(nnls((np.array(extra_copies, float) * weight)[:, None], np.array(excess) * weight)[0])
    return {"latency_s": latency, "bandwidth_bytes_per_s": bandwidth, "per_copy_latency_s": per_copy}


def fit_load(samples: Sequence[dict]) -> dict:
    """Weight load ``t = fixed + bytes / bandwidth``."""
    sizes, times = [s["bytes"] for s in samples], _times(samples)
    fixed, per_byte = fit_affine(sizes, times)
    fixed, bandwidth = _bandwidth(fixed, per_byte, sizes, times)
    return {"fixed_s": fixed, "bandwidth_bytes_per_s": bandwidth}


def fit_unload(samples: Sequence[dict]) -> dict:
    """Weight unload ``t = fixed + seconds_per_gib * GiB``."""
    fixed, per_gib = fit_affine([s["bytes"] / GIB for s in samples], _times(samples))
    return {"fixed_s": fixed, "seconds_per_gib": per_gib}

