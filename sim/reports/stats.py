"""Means with 95% confidence intervals over seeds (Student's t), without needing scipy."""

from __future__ import annotations

import math

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom."""
    if df <= len(_T975):
        return _T975[df - 1]
    # Beyond the table the Cornish-Fisher expansion is accurate to three decimals.
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and half-width of its 95% confidence interval (None when fewer than two values)."""
    data = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not data:
        return None, None
    mean = sum(data) / len(data)
    if len(data) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in data) / (len(data) - 1)
    return mean, t_quantile(len(data) - 1) * math.sqrt(var / len(data))
