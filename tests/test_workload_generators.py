"""Generators: statistics on large samples, determinism, and independence from chunk sizes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.errors import MmsimError
from sim.workload.arrivals import ArrivalStream, Window, mean_rate, read_servegen, windows_for
from sim.workload.columns import concat
from sim.workload.config import GeneratorConfig, RateSeriesArrivals
from sim.workload.generator import generate
from sim.workload.lengths import mix_weights
from sim.workload.writer import write_trace

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
SHAREGPT = SHARED / "sharegpt_vidur" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
SERVEGEN = SHARED / "servegen" / "language" / "m-large" / "chunk-0-trace.csv"


def config(**overrides) -> GeneratorConfig:
    data = {
        "max_requests": 200_000,
        "arrivals": {"process": "poisson", "rate_per_s": 10.0},
        "mix": {"qwen2.5-3b": 0.5, "qwen3-8b": 0.3, "qwen2.5-14b": 0.2},
        "prompt_tokens": {"dist": "lognormal", "mean": 1000, "cv": 1.0},
        "output_tokens": {"dist": "lognormal", "mean": 250, "cv": 1.5},
    }
    data.update(overrides)
    return GeneratorConfig.model_validate(data)


def run(cfg: GeneratorConfig, seed: int = 1, chunk_rows: int = 65536, base_dir: Path | None = None):
    return concat(list(generate(cfg, seed=seed, base_dir=base_dir, chunk_rows=chunk_rows)))


def cv(values: np.ndarray) -> float:
    return float(values.std() / values.mean())


@pytest.mark.parametrize("arrivals, rate, target_cv", [
    ({"process": "poisson", "rate_per_s": 10.0}, 10.0, 1.0),
    ({"process": "gamma", "rate_per_s": 4.0, "cv": 3.0}, 4.0, 3.0),
    ({"process": "gamma", "rate_per_s": 50.0, "cv": 0.5}, 50.0, 0.5),
])
def test_rate_and_burstiness(arrivals, rate, target_cv):
    trace = run(config(arrivals=arrivals))
    gaps = np.diff(trace.arrival_s)
    assert len(trace) / trace.arrival_s[-1] == pytest.approx(rate, rel=0.03)
    assert cv(gaps) == pytest.approx(target_cv, rel=0.05)
    assert np.all(gaps >= 0)


def test_mix_shares_and_lengths():
    trace = run(config())
    names, counts = np.unique(trace.model.astype(str), return_counts=True)
    shares = dict(zip(names, counts / len(trace)))
    assert shares == pytest.approx({"qwen2.5-3b": 0.5, "qwen3-8b": 0.3, "qwen2.5-14b": 0.2}, abs=0.005)
    assert trace.prompt_tokens.mean() == pytest.approx(1000, rel=0.02)
    assert cv(trace.prompt_tokens) == pytest.approx(1.0, rel=0.05)
    assert trace.output_tokens.mean() == pytest.approx(250, rel=0.03)
    assert trace.prompt_tokens.dtype == np.int64 and trace.prompt_tokens.min() >= 1
    assert [chunk.first_id for chunk in generate(config(), seed=1)] == [0, 65536, 131072, 196608]


def test_zipf_mix_and_other_length_distributions():
    trace = run(config(mix={"zipf": 1.0, "models": ["a", "b", "c"]},
                       prompt_tokens={"dist": "uniform", "low": 10, "high": 20},
                       output_tokens={"dist": "constant", "value": 7}))
    assert mix_weights(config(mix={"zipf": 1.0, "models": ["a", "b", "c"]}).mix)[1] == pytest.approx(
        np.array([1, 1 / 2, 1 / 3]) / (11 / 6))
    assert np.mean(trace.model == "a") == pytest.approx(6 / 11, abs=0.005)
    assert trace.prompt_tokens.min() == 10 and trace.prompt_tokens.max() == 20
    assert trace.prompt_tokens.mean() == pytest.approx(15, abs=0.05)
    assert set(trace.output_tokens) == {7}


def test_lognormal_cap_and_duration_stop():
    trace = run(config(max_requests=None, duration_s=1000.0,
                       prompt_tokens={"dist": "lognormal", "mean": 1000, "cv": 3.0, "max": 4096}))
    assert trace.arrival_s[-1] < 1000.0 and len(trace) == pytest.approx(10_000, rel=0.05)
    assert trace.prompt_tokens.max() == 4096


@pytest.mark.skipif(not SHAREGPT.is_file(), reason="public traces not present")
def test_empirical_lengths_are_drawn_as_pairs():
    source = np.loadtxt(SHAREGPT, delimiter=",", skiprows=1, usecols=(0, 1), dtype=np.int64)
    pairs = {(int(p), int(o)) for p, o in source}
    empirical = {"dist": "empirical", "path": str(SHAREGPT)}
    trace = run(config(max_requests=20_000, prompt_tokens=empirical, output_tokens=empirical))
    assert all((int(p), int(o)) in pairs for p, o in zip(trace.prompt_tokens, trace.output_tokens))
    assert trace.prompt_tokens.mean() == pytest.approx(source[:, 0].mean(), rel=0.03)
    relative = run(config(max_requests=100, prompt_tokens={**empirical, "path": SHAREGPT.name, "column": "prompt"}),
                   base_dir=SHAREGPT.parent)
    assert set(relative.prompt_tokens) <= set(source[:, 0].tolist())


def test_rate_series_windows_and_rescaling():
    windows = [[0, 2.0], [1000, 10.0, 3.0], [2000, 0.0]]
    trace = run(config(max_requests=None, duration_s=3000.0, arrivals={"process": "rate-series", "windows": windows}))
    first = trace.arrival_s < 1000
    second = (trace.arrival_s >= 1000) & (trace.arrival_s < 2000)
    assert first.sum() == pytest.approx(2000, rel=0.08)
    assert second.sum() == pytest.approx(10_000, rel=0.15)
    assert trace.arrival_s.max() < 2000
    assert cv(np.diff(trace.arrival_s[second])) == pytest.approx(3.0, rel=0.2)
    scaled = RateSeriesArrivals(process="rate-series", windows=windows, rate_per_s=8.0)
    assert mean_rate(windows_for(scaled, duration_s=3000.0), 3000.0) == pytest.approx(8.0)
    assert mean_rate([Window(0, 1.0), Window(10, 3.0)]) == pytest.approx(2.0)


@pytest.mark.skipif(not SERVEGEN.is_file(), reason="public traces not present")
def test_servegen_windows():
    windows = read_servegen(SERVEGEN)
    assert len(windows) == 2016 and windows[1].rate_per_s == 0.0
    assert windows[0].dist == "weibull" and windows[0].shape == pytest.approx(0.3753486, rel=1e-6)
    assert windows[3].dist == "gamma" and windows[3].shape == pytest.approx(0.0604221, rel=1e-6)
    trace = run(config(max_requests=None, duration_s=6 * 3600.0,
                       arrivals={"process": "servegen", "path": str(SERVEGEN), "rate_per_s": 3.0}))
    assert len(trace) / (6 * 3600) == pytest.approx(3.0, rel=0.15)
    assert cv(np.diff(trace.arrival_s)) > 2


def test_weibull_and_gamma_windows_keep_the_rate():
    rng = np.random.default_rng(0)
    for window in (Window(0, 4.0, "weibull", 0.5), Window(0, 4.0, "gamma", 0.2)):
        assert window.gaps(rng, 400_000).mean() == pytest.approx(0.25, rel=0.03)


def test_bad_servegen_file(tmp_path):
    path = tmp_path / "chunk-0-trace.csv"
    path.write_text("0,1.0,2.0,Gamma,0.5,3\n600,1.0,2.0,Lognormal,0.5,3\n")
    with pytest.raises(MmsimError, match="line 2: unknown dist 'Lognormal'"):
        read_servegen(path)
    path.write_text("0,1.0,2.0,Gamma,0.5\n")
    with pytest.raises(MmsimError, match="line 1: expected 6 fields"):
        read_servegen(path)
    with pytest.raises(MmsimError, match="arrivals.path"):
        windows_for(config(arrivals={"process": "servegen", "path": "missing.csv"}).arrivals, tmp_path)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    cfg = config(max_requests=5000, arrivals={"process": "gamma", "rate_per_s": 4.0, "cv": 2.0})
    paths = []
    for name, seed, rows in (("a", 3, 65536), ("b", 3, 777), ("c", 4, 65536)):
        paths.append(tmp_path / f"{name}.csv")
        write_trace(generate(cfg, seed=seed, chunk_rows=rows), paths[-1])
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), chunk_rows=st.integers(1, 5000), requests=st.integers(1, 3000),
       cv_value=st.floats(0.2, 5.0, allow_subnormal=False), zipf=st.floats(0.0, 2.0, allow_subnormal=False))
def test_chunking_never_changes_the_requests(seed, chunk_rows, requests, cv_value, zipf):
    cfg = config(max_requests=requests, arrivals={"process": "gamma", "rate_per_s": 3.0, "cv": cv_value},
                 mix={"zipf": zipf, "models": ["a", "b", "c"]},
                 prompt_tokens={"dist": "uniform", "low": 1, "high": 100})
    whole, pieces = run(cfg, seed), list(generate(cfg, seed=seed, chunk_rows=chunk_rows))
    joined = concat(pieces)
    assert all(len(piece) <= chunk_rows for piece in pieces)
    assert [piece.first_id for piece in pieces] == list(range(0, requests, chunk_rows))
    assert len(whole) == requests
    np.testing.assert_array_equal(joined.arrival_s, whole.arrival_s)
    np.testing.assert_array_equal(joined.model, whole.model)
    np.testing.assert_array_equal(joined.prompt_tokens, whole.prompt_tokens)
    np.testing.assert_array_equal(joined.output_tokens, whole.output_tokens)
    assert np.all(np.diff(whole.arrival_s) >= 0) and whole.prompt_tokens.min() >= 1


@settings(max_examples=25, deadline=None)
@given(rates=st.lists(st.floats(0.0, 50.0, allow_subnormal=False), min_size=1, max_size=6), take=st.integers(1, 500),
       seed=st.integers(0, 1000))
def test_arrival_stream_is_sorted_inside_windows_and_chunk_independent(rates, take, seed):
    windows = [Window(100.0 * index, rate) for index, rate in enumerate(rates)]
    whole = ArrivalStream(windows, seed, duration_s=100.0 * len(rates)).take(10**6)
    stream = ArrivalStream(windows, seed, duration_s=100.0 * len(rates))
    parts = []
    while len(part := stream.take(take)):
        parts.append(part)
    joined = np.concatenate(parts) if parts else np.empty(0)
    np.testing.assert_array_equal(joined, whole)
    assert np.all(np.diff(whole) >= 0)
    for index, rate in enumerate(rates):
        inside = (whole >= 100.0 * index) & (whole < 100.0 * (index + 1))
        assert rate > 0 or not inside.any()
    assert math.isfinite(whole.max()) if len(whole) else True
