"""Fits used by calibration recover known coefficients from synthetic samples (numpy only, no torch)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from calibrate.fit import fit_decode, fit_load, fit_prefill, fit_transfer, fit_unload, max_relative_error, nnls

GIB = 2**30


def sample(t: float, **fields) -> dict:
    return fields | {"typical_s": t, "median_s": t}


def brute_force_nnls(a: np.ndarray, b: np.ndarray) -> float:
    """Smallest residual over every feasible subset of free coefficients."""
    best = np.inf
    n = a.shape[1]
    for r in range(n + 1):
        for subset in itertools.combinations(range(n), r):
            x = np.zeros(n)
            if subset:
                x[list(subset)] = np.linalg.lstsq(a[:, list(subset)], b, rcond=None)[0]
            if (x >= -1e-12).all():
                best = min(best, float(np.linalg.norm(a @ x - b)))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_nnls_is_optimal_and_non_negative(seed):
    rng = np.random.default_rng(seed)
    a = rng.random((10, 3)) * rng.choice([1.0, 1e3, 1e-6], 3)  # badly scaled columns, as bytes vs seconds are
    b = rng.normal(size=10)
    x = nnls(a, b)
    assert (x >= 0).all()
    assert np.linalg.norm(a @ x - b) <= brute_force_nnls(a, b) * (1 + 1e-7) + 1e-12


def test_nnls_recovers_exact_non_negative_solution():
    a = np.array([[1.0, 1, 128], [1, 4, 512], [1, 8, 8192], [1, 2, 4096]])
    truth = np.array([1e-3, 2e-5, 3e-9])
    assert np.allclose(nnls(a, a @ truth), truth, rtol=1e-8)


def test_decode_fit_recovers_coefficients():
    base, per_seq, per_ctx = 1.2e-3, 2.5e-5, 4e-9
    samples = [sample(base + per_seq * b + per_ctx * b * c, batch=b, context_tokens=b * c)
               for b in (1, 4, 8, 32) for c in (128, 1024, 4096)]
    fields, error = fit_decode(samples)
    assert fields["decode_base_s"] == pytest.approx(base, rel=1e-6)
    assert fields["decode_per_seq_s"] == pytest.approx(per_seq, rel=1e-6)
    assert fields["decode_per_context_token_s"] == pytest.approx(per_ctx, rel=1e-6)
    assert error < 1e-9


def test_decode_fit_clamps_a_negative_slope_to_zero():
    # time falls slightly with batch (noise): the fit must not return a negative per-sequence cost
    samples = [sample(1e-3 - 1e-7 * b + 1e-9 * b * c, batch=b, context_tokens=b * c) for b in (1, 4, 8) for c in (128, 1024)]
    fields, _ = fit_decode(samples)
    assert fields["decode_per_seq_s"] == 0.0
    assert fields["decode_base_s"] > 0 and fields["decode_per_context_token_s"] > 0


def test_prefill_fit_recovers_quadratic():
    base, linear, quadratic = 5e-4, 3e-6, 2e-10
    samples = [sample(base + linear * p + quadratic * p * p, prompt_tokens=p) for p in (16, 128, 512, 2048, 8192)]
    fields, error = fit_prefill(samples)
    assert fields["prefill_base_s"] == pytest.approx(base, rel=1e-6)
    assert fields["prefill_per_token_s"] == pytest.approx(linear, rel=1e-6)
    assert fields["prefill_per_token_sq_s"] == pytest.approx(quadratic, rel=1e-6)
    assert error < 1e-9


def test_transfer_fit_recovers_latency_bandwidth_and_per_copy_latency():
    latency, bandwidth, per_copy = 1.5e-5, 24e9, 8e-6
    sizes = (10**6, 16 * 10**6, 256 * 10**6, 10**9)
    bulk = [sample(latency + n / bandwidth, bytes=n, copies=1) for n in sizes]
    chunked = [sample(latency + n / bandwidth + (k - 1) * per_copy, bytes=n, copies=k) for n in sizes for k in (72, 96)]
    fit = fit_transfer(bulk, chunked)
    assert fit["latency_s"] == pytest.approx(latency, rel=1e-6)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(bandwidth, rel=1e-6)
    assert fit["per_copy_latency_s"] == pytest.approx(per_copy, rel=1e-6)


def test_transfer_fit_without_slope_falls_back_to_best_rate():
    # pure noise: bigger copies not slower; bandwidth must stay positive and finite
    bulk = [sample(1e-3, bytes=n, copies=1) for n in (10**6, 2 * 10**6)]
    fit = fit_transfer(bulk, [])
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(2e9)
    assert fit["latency_s"] == 0.0 and fit["per_copy_latency_s"] == 0.0


def test_load_and_unload_fits():
    fixed, bandwidth = 0.8, 3e9
    load = fit_load([sample(fixed + n / bandwidth, bytes=n) for n in (2**28, 2**30, 2**31)])
    assert load == pytest.approx({"fixed_s": fixed, "bandwidth_bytes_per_s": bandwidth}, rel=1e-6)
    unload = fit_unload([sample(0.19 + 0.0128 * n / GIB, bytes=n) for n in (GIB, 4 * GIB, 16 * GIB)])
    assert unload == pytest.approx({"fixed_s": 0.19, "seconds_per_gib": 0.0128}, rel=1e-6)


def test_fits_weight_relative_error():
    # one small sample 50% off must not be drowned by large exact ones: relative weighting shares the error
    samples = [sample(1e-5 + n / 1e10, bytes=n) for n in (10**9, 2 * 10**9)] + [sample(1.5 * (1e-5 + 10**3 / 1e10), bytes=10**3)]
    fit = fit_load(samples)
    assert fit["fixed_s"] > 1e-5


def test_max_relative_error():
    assert max_relative_error([[1.0, 1.0], [1.0, 2.0]], [1.0, 2.0], np.array([0.0, 1.0])) == 0.0
