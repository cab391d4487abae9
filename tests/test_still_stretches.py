"""Still stretches: a run whose requests come far apart ends at once, and passing over the stretches changes
nothing but the samples that would have recorded stillness (compared with runs that sample and decide at
every step of their grids)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from contextlib import ExitStack
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import mmsim_in_process, wall_clock_limit

OWN_AUTOSCALER = Path(__file__).parent / "data" / "own_autoscaler.py"
AUTOSCALERS = ("none", "utilisation", "queue-depth", "kv-utilisation", "predictive", f"{OWN_AUTOSCALER}:Halving")
SAMPLE_KEYS = ["time_s", "gpu", "model", "nth"]  # nth: a GPU may hold two instances of a model


def every_step():
    """Sampler and controller that never pass over anything: the reference runs."""
    stack = ExitStack()
    for module in ("sim.engine.sampler", "sim.fleet.controller"):
        stack.enter_context(mock.patch(f"{module}.next_change_s", lambda *args: -math.inf))
    return stack


@pytest.mark.parametrize("autoscaler", AUTOSCALERS)
def test_a_trace_with_a_request_a_billion_seconds_later_ends_at_once(tmp_path, capsys, autoscaler):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens\n0,qwen3-8b,100,50\n1e9,qwen3-8b,100,50\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: late\nprofile: a100-80gb\ncluster: {nodes: 1, gpus_per_node: 1}\n"
                        "models:\n  - {name: qwen3-8b}\nworkload:\n  trace: {path: t.csv}\n"
                        f"autoscaler: {{name: '{autoscaler}'}}\n")
    with wall_clock_limit(30):
        code, out, err = mmsim_in_process(capsys, "run", scenario, "--out", tmp_path / "run", "--json",
                                          "--allow-policy-files")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["requests_completed"] == 2 and summary["makespan_s"] > 1e9
    # The one GPU holds the one model throughout: one resident model per GPU, however the samples are spaced.
    assert summary["mean_resident_models_per_gpu"] == pytest.approx(1.0)
    samples = pd.read_parquet(tmp_path / "run" / "timeseries.parquet")
    # The time rules' ten minutes (and a forecast's decay) are sampled; the billion seconds after them are not.
    assert len(samples) < 500
    # Each sample stands on the 5 s grid of a trace's samples.
    steps = samples["time_s"].to_numpy() / 5.0
    assert np.allclose(steps, np.round(steps), rtol=1e-12, atol=1e-6)
    # The report's memory timeline holds the model's weights across the stretch the samples passed over, with no
    # bin missing between the first and the last sampled one (a stacked plot would slope across a gap).
    from sim.reports.data import load_run
    from sim.reports.timelines import _memory

    centres, gib = _memory(load_run(tmp_path / "run"), ["qwen3-8b"])
    assert len(centres) > 150 and np.all(np.diff(centres) > 0)
    assert np.allclose(np.diff(centres), centres[1] - centres[0])
    weights = gib["qwen3-8b"].to_numpy()
    assert np.allclose(weights[1:-1], weights[1])


def gapped_rows():
    """Requests in bursts with long gaps between them (longer than the fleets' time rules)."""
    gap = st.one_of(st.integers(0, 300).map(lambda centis: centis / 100), st.integers(40, 2000).map(float))
    return st.lists(st.tuples(gap, st.integers(1, 800), st.integers(1, 300)), min_size=1, max_size=12)


@st.composite
def cases(draw):
    models = draw(st.lists(st.sampled_from(("qwen2.5-3b", "qwen3-8b")), min_size=1, max_size=2, unique=True))
    autoscaler = {"name": draw(st.sampled_from(AUTOSCALERS)), "interval_s": draw(st.sampled_from([1.0, 5.0])),
                  "min_replicas": draw(st.integers(0, 1)), "scale_down_window_s": draw(st.sampled_from([0.0, 10.0])),
                  "node_idle_s": draw(st.sampled_from([0.0, 5.0]))}
    if draw(st.booleans()):
        autoscaler["scale_to_zero_idle_s"] = draw(st.sampled_from([2.0, 20.0]))
    low = draw(st.integers(0, 1))
    scenario = parse_scenario({
        "name": "gapped", "seed": 1, "profile": "paper-rtx5000",
        "cluster": {"pools": [{"name": "p", "profile": "paper-rtx5000", "min_nodes": low, "nodes": max(low, 1),
                               "max_nodes": 2, "gpus_per_node": draw(st.integers(1, 2)), "host_memory_gb": 64}]},
        "models": [{"name": m} for m in models],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {m: 1.0 for m in models}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "slo": {"default": {"ttft_s": 2.0}},
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 1024},
        "cold_start": {"provision_s": draw(st.sampled_from([0.0, 3.0])), "container_init_s": 0.5, "image_gb": 1.0,
                       "registry_gb_per_s": 1.0, "runtime_start_s": 0.5, "weight_fetch_gb_per_s": 50.0,
                       "deserialise_gb_per_s": 50.0, "warm_up_s": 0.5},
        "autoscaler": autoscaler,
        "sample_interval_s": draw(st.sampled_from([0.5, 5.0])),
    }, "gapped")
    rows = draw(gapped_rows())
    gaps, prompts, outputs = zip(*rows)
    names = [models[i % len(models)] for i in range(len(rows))]
    chunk = RequestChunk(np.cumsum(gaps), np.array(names), np.array(prompts), np.array(outputs))
    return scenario, chunk, draw(st.sampled_from(["static", "swap-aware"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_passing_over_still_stretches_changes_nothing_but_still_samples(case):
    scenario, chunk, policy = case
    with wall_clock_limit(120):
        passed = simulate(scenario, policy=policy, chunks=[chunk])
        with every_step():
            reference = simulate(scenario, policy=policy, chunks=[chunk])
    pd.testing.assert_frame_equal(passed.requests, reference.requests)
    pd.testing.assert_frame_equal(passed.events, reference.events)
    for key in ("requests_completed", "requests_dropped", "loads", "unloads", "preemptions"):
        assert passed.summary[key] == reference.summary[key], key
    assert passed.summary["mean_resident_models_per_gpu"] == pytest.approx(
        reference.summary["mean_resident_models_per_gpu"], rel=1e-9)
    kept, every = (frame.assign(nth=frame.groupby(["time_s", "gpu", "model"], observed=True).cumcount())
                   for frame in (passed.timeseries, reference.timeseries))
    joined = every.merge(kept, on=SAMPLE_KEYS, how="left", suffixes=("", "_kept"), indicator=True)
    taken = joined["_merge"] == "both"
    assert taken.sum() == len(kept), "a sample the reference did not take"
    for column in ("weight_bytes", "kv_bytes", "queued", "running"):
        assert (joined.loc[taken, column] == joined.loc[taken, f"{column}_kept"]).all(), column
    # Only samples of a still stretch were passed over: each repeats the sample taken before it (the same rows,
    # memory, queues and batches) with nothing computed since.
    skipped = joined.loc[~taken, SAMPLE_KEYS + ["weight_bytes", "kv_bytes", "queued", "running", "busy_share"]]
    assert (skipped["busy_share"] == 0).all()
    kept_times = np.unique(kept["time_s"].to_numpy())
    before = kept_times[np.searchsorted(kept_times, skipped["time_s"].to_numpy()) - 1]
    repeated = skipped.assign(time_s=before).merge(kept, on=SAMPLE_KEYS, how="left", suffixes=("", "_kept"))
    for column in ("weight_bytes", "kv_bytes", "queued", "running"):
        assert (repeated[column] == repeated[f"{column}_kept"]).all(), column
    # Busy seconds add up the same: a sample after a stretch covers the whole stretch.
    for gpu in every["gpu"].unique():
        if gpu < 0:
            continue
        assert _busy_seconds(kept, gpu, scenario.sample_interval_s) == pytest.approx(
            _busy_seconds(every, gpu, scenario.sample_interval_s), rel=1e-9, abs=1e-9)


def _busy_seconds(samples: pd.DataFrame, gpu: int, interval_s: float) -> float:
    """Busy seconds of one GPU the samples account for (its rows at a time share one busy share)."""
    rows = samples[samples["gpu"] == gpu].groupby("time_s")["busy_share"].first()
    times = rows.index.to_numpy()
    spans = np.diff(times, prepend=0.0)
    spans = np.where(np.isclose(spans, interval_s, rtol=1e-9), interval_s, spans)
    return float(np.dot(rows.to_numpy(), spans))
