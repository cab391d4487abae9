"""Intervals in reports and sweep reports, against values computed by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.reports.stats import no_interval_text, overlap, proportion_estimate, rate_estimate, wilson
from sim.sweep.report import band_table


def test_wilson_45_of_50_matches_the_textbook_interval():
    # p = 0.9, n = 50, z = 1.96: centre 0.938416 / 1.076832, half 1.96·sqrt(0.0018 + 0.00038416) / 1.076832.
    low, high = wilson(45 / 50, 50)
    assert low == pytest.approx(0.78640, abs=5e-5)
    assert high == pytest.approx(0.95652, abs=5e-5)


def test_wilson_stays_inside_zero_and_one():
    assert wilson(0.0, 10)[0] == 0.0 and 1.0 - 1e-12 <= wilson(1.0, 10)[1] <= 1.0
    assert wilson(1.0, 10)[0] == pytest.approx(0.72246, abs=5e-5)  # 10/10: the known lower bound 0.7225


def test_fewer_than_three_seeds_give_no_interval():
    two = proportion_estimate([0.646, 0.99])  # the "64.6% ± 158.0%" case
    assert two.mean == pytest.approx(0.818) and not two.has_interval and two.n == 2
    assert not rate_estimate([1.2, 1.4]).has_interval
    assert no_interval_text(2) == "2 seeds: no interval" and no_interval_text(1) == "1 seed: no interval"
    assert overlap(two, two) is None


def test_proportion_interval_uses_the_between_seed_effective_sample_size():
    # mean 0.85, s² = 0.0025, n_eff = 0.85·0.15 / (0.0025/3) = 153 (< 300 requests), z = t(2) = 4.303.
    est = proportion_estimate([0.80, 0.85, 0.90], [100, 100, 100])
    assert est.mean == pytest.approx(0.85)
    assert est.low == pytest.approx(0.68896, abs=5e-5) and est.high == pytest.approx(0.93547, abs=5e-5)
    # Only 60 requests in all: the effective sample size is capped at 60.
    capped = proportion_estimate([0.80, 0.85, 0.90], [20, 20, 20])
    assert capped.low == pytest.approx(0.57542, abs=5e-5) and capped.high == pytest.approx(0.95950, abs=5e-5)


def test_proportion_intervals_never_leave_zero_and_one():
    for values in ([0.0, 0.0, 0.4], [1.0, 1.0, 0.6], [0.0, 1.0, 1.0], [0.02, 0.0, 0.01]):
        est = proportion_estimate(values, [50, 50, 50])
        assert 0.0 <= est.low <= est.mean <= est.high <= 1.0, values


def test_rate_interval_is_student_t_clipped_at_zero():
    # [1, 2, 3]: mean 2, s = 1, half = 4.303 / sqrt(3) = 2.4843.
    est = rate_estimate([1.0, 2.0, 3.0])
    assert est.mean == pytest.approx(2.0)
    assert est.low == 0.0 and est.high == pytest.approx(4.4843, abs=1e-3)
    wide = rate_estimate([10.0, 11.0, 12.0])
    assert wide.low == pytest.approx(11 - 2.4843, abs=1e-3)


def test_sweep_bands_are_clipped_and_absent_below_three_seeds():
    rows = []
    for seed, (slo, good) in enumerate([(0.0, 0.05), (0.5, 0.9), (1.0, 0.01)]):
        rows.append({"policy.name": "static", "seed": seed, "load": 1.0, "status": "ok", "slo_attainment": slo,
                     "goodput_requests_per_s": good, "requests_total": 40})
    for seed in range(2):
        rows.append({"policy.name": "static", "seed": seed, "load": 2.0, "status": "ok", "slo_attainment": 0.5,
                     "goodput_requests_per_s": 0.3, "requests_total": 40})
    frame = pd.DataFrame(rows)
    slo = band_table(frame, ["policy.name", "seed", "load"], "slo_attainment").set_index("x")
    assert 0.0 <= slo.loc[1.0, "low"] < slo.loc[1.0, "mean"] < slo.loc[1.0, "high"] <= 1.0
    assert math.isnan(slo.loc[2.0, "low"]) and math.isnan(slo.loc[2.0, "high"])  # two seeds: no band
    good = band_table(frame, ["policy.name", "seed", "load"], "goodput_requests_per_s").set_index("x")
    assert good.loc[1.0, "low"] == 0.0  # a t-interval would reach -0.93 req/s
    assert good.loc[1.0, "high"] == pytest.approx(0.32 + 4.303 * 0.50269 / 3**0.5, abs=2e-3)
