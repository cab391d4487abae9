"""Intervals over seeds that cannot mislead: none below three seeds, Wilson intervals for proportions (never
outside [0, 1]) and Student-t intervals clipped at 0 for rates, times and counts. No scipy needed."""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_SEEDS = 3
"""Fewer seeds than this give no interval: a t-interval from two values is wider than the quantity it bounds."""

Z975 = 1.959964

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds and its 95% interval; ``low``/``high`` are None with fewer than ``MIN_SEEDS`` values."""

    mean: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


def no_interval_text(seeds: int) -> str:
    """What a reader sees instead of an interval, e.g. ``2 seeds: no interval``."""
    return f"{seeds} seed{'s' if seeds != 1 else ''}: no interval"


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom."""
    if df <= len(_T975):
        return _T975[df - 1]
    # Beyond the table the Cornish-Fisher expansion is accurate to three decimals.
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def wilson(p: float, n: float, z: float = Z975) -> tuple[float, float]:
    """Wilson score interval for a proportion ``p`` observed over ``n`` trials (``n`` may be fractional)."""
    if n <= 0:
        return 0.0, 1.0
    if math.isinf(n):
        return p, p
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def _clean(values) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def rate_estimate(values) -> Estimate:
    """Mean over seeds with a Student-t 95% interval whose lower end is clipped at 0 (rates, times, counts)."""
    data = _clean(values)
    if not data:
        return Estimate(None, None, None, 0)
    mean = sum(data) / len(data)
    if len(data) < MIN_SEEDS:
        return Estimate(mean, None, None, len(data))
    var = sum((v - mean) ** 2 for v in data) / (len(data) - 1)
    half = t_quantile(len(data) - 1) * math.sqrt(var / len(data))
    return Estimate(mean, max(0.0, mean - half), mean + half, len(data))


def proportion_estimate(values, trials=None) -> Estimate:
    """Mean of per-seed proportions with a Wilson 95% interval on the effective sample size of the between-seed
    variance (Korn & Graubard 1998): n_eff = p(1-p) / (s²/k), capped at the pooled trial count when known, with
    Student's t quantile in place of z. The interval lies in [0, 1] by construction."""
    data = _clean(values)
    if not data:
        return Estimate(None, None, None, 0)
    k = len(data)
    mean = sum(data) / k
    if k < MIN_SEEDS:
        return Estimate(mean, None, None, k)
    var = sum((v - mean) ** 2 for v in data) / (k - 1)
    pooled = sum(float(t) for t in trials if t is not None) if trials is not None else 0.0
    n_eff = mean * (1 - mean) / (var / k) if var > 0 else math.inf
    if pooled > 0:
        n_eff = min(n_eff, pooled)  # seeds cannot tell more than every request they served
    low, high = wilson(mean, n_eff, t_quantile(k - 1))
    return Estimate(mean, low, high, k)


def overlap(a: Estimate, b: Estimate) -> bool | None:
    """Whether two intervals overlap; None when either has no interval."""
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return None
    return a.low <= b.high and b.low <= a.high
