"""Native traces: round trips through CSV/JSONL/Parquet, atomic writes, merging and statistics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import MmsimError
from sim.workload.columns import concat, make_chunk, take
from sim.workload.merge import merge_streams
from sim.workload.reader import read_trace
from sim.workload.rows import ImportOptions, RowReport
from sim.workload.stats import trace_stats
from sim.workload.stats_plot import plot_stats
from sim.workload.writer import write_trace

UNCHECKED = ImportOptions()


def sample(rows: int = 1000, seed: int = 0, optional: bool = True, models=("qwen3-8b", "qwen2.5-3b")):
    rng = np.random.default_rng(seed)
    extra = {}
    if optional:
        extra = {"priority": rng.integers(0, 3, rows),
                 "slo_class": np.array([None, "gold", "silver, fast"], dtype=object)[rng.integers(0, 3, rows)],
                 "prefix_ids": np.array([tuple(range(i % 4)) or None for i in range(rows)] + [None], dtype=object)[:-1]}
    return make_chunk(np.round(np.cumsum(rng.exponential(0.1, rows)), 6),
                      np.array(models, dtype=object)[rng.integers(0, len(models), rows)],
                      rng.integers(1, 5000, rows), rng.integers(1, 500, rows), **extra)


def read_all(path, rows=65536, options=UNCHECKED):
    return concat(list(read_trace(path, "mmsim", options, rows=rows)))


def assert_same(a, b):
    np.testing.assert_allclose(a.arrival_s, b.arrival_s, atol=5e-7)
    for name in ("model", "prompt_tokens", "output_tokens", "priority", "slo_class", "prefix_ids"):
        left, right = getattr(a, name), getattr(b, name)
        assert (left is None) == (right is None), name
        if left is not None:
            assert list(left) == list(right), name


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
@pytest.mark.parametrize("optional", [False, True])
def test_round_trip(tmp_path, suffix, optional):
    chunk = sample(optional=optional)
    path = tmp_path / f"t{suffix}"
    assert write_trace([chunk], path) == len(chunk)
    back = read_all(path, rows=300)
    assert_same(back, chunk)
    copy = tmp_path / f"copy{suffix}"
    write_trace(read_trace(path, "mmsim", UNCHECKED, rows=77), copy)
    assert copy.read_bytes() == path.read_bytes() or suffix == ".parquet"
    assert_same(read_all(copy), chunk)


def test_csv_layout_is_plain(tmp_path):
    path = tmp_path / "t.csv"
    write_trace([make_chunk([0.0, 1.5, 2.0000004], ["qwen3-8b"] * 3, [10, 20, 30], [1, 2, 3])], path)
    assert path.read_text() == ("arrival_s,model,prompt_tokens,output_tokens\n"
                                "0,qwen3-8b,10,1\n1.5,qwen3-8b,20,2\n2,qwen3-8b,30,3\n")


def test_csv_quotes_only_when_needed(tmp_path):
    classes = np.full(5000, None, dtype=object)
    classes[4000] = 'gold, "fast"'
    chunk = make_chunk(np.arange(5000.0), ["qwen3-8b"] * 5000, np.ones(5000), np.ones(5000), slo_class=classes)
    path = tmp_path / "t.csv"
    write_trace([chunk], path)
    back = read_all(path)
    assert len(back) == 5000 and back.slo_class[4000] == 'gold, "fast"' and back.slo_class[0] is None


def test_failed_write_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old contents\n")

    def chunks():
        yield sample(100)
        raise MmsimError("boom")

    with pytest.raises(MmsimError, match="boom"):
        write_trace(chunks(), target)
    assert target.read_text() == "old contents\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]
    with pytest.raises(MmsimError, match="cannot tell the trace format"):
        write_trace([sample(5)], tmp_path / "out.txt")


def test_native_row_checks(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("model,arrival_s,prompt_tokens,output_tokens,prefix_ids\n"
                    "qwen3-8b,0,5,5,1 2\n qwen3-8b ,1,5,5,\n,2,5,5,\nqwen3-8b,-1,5,5,\nqwen3-8b,3,5,5,1 x\n"
                    "qwen3-8b,4,5,0,\nqwen3-8b,5,5,5,3\n")
    with pytest.raises(MmsimError, match="line 4: model is missing"):
        read_all(path)
    report = RowReport(str(path))
    trace = concat(list(read_trace(path, "mmsim", ImportOptions(skip_bad=True), report=report)))
    assert report.bad_rows == 4 and trace.arrival_s.tolist() == [0, 1, 5]
    assert trace.model.tolist() == ["qwen3-8b"] * 3 and list(trace.prefix_ids) == [(1, 2), None, (3,)]
    path.write_text("arrival_s,model,prompt_tokens,output_tokens,colour\n")
    with pytest.raises(MmsimError, match="unknown column 'colour'"):
        read_all(path)


def test_jsonl_first_line_sets_the_columns(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 0, "model": "a", "prompt_tokens": 1, "output_tokens": 1, "slo_class": "x"}\n'
                    '{"arrival_s": 1, "model": "a", "prompt_tokens": 2, "output_tokens": 1}\n\n'
                    '{"arrival_s": 2, "model": "a", "prompt_tokens": 3, "output_tokens": 1, "priority": 1}\n')
    with pytest.raises(MmsimError, match="line 4: key 'priority' is not on the first line"):
        read_all(path)
    trace = read_all(path, options=ImportOptions(skip_bad=True))
    assert trace.prompt_tokens.tolist() == [1, 2] and list(trace.slo_class) == ["x", None]
    assert trace.priority is None


def test_parquet_reports_rows(tmp_path):
    path = tmp_path / "t.parquet"
    write_trace([make_chunk([0, 1, 0.5], ["a"] * 3, [1, 2, 3], [1, 1, 1])], path)
    with pytest.raises(MmsimError, match="row 3: earlier than the row before"):
        read_all(path)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(MmsimError, match="not a readable Parquet file"):
        read_all(tmp_path / "junk.parquet")


def test_model_labels_pass_unless_a_scenario_names_what_it_serves(tmp_path):
    # A trace names deployments (aliases, config-file models), which only a scenario defines: the reader keeps any
    # label, and refuses those a scenario does not serve.
    path = tmp_path / "t.csv"
    write_trace([sample(10, models=("qwen3-8b", "my-model"))], path)
    assert set(read_all(path, options=ImportOptions()).model) == {"qwen3-8b", "my-model"}
    with pytest.raises(MmsimError, match="'my-model' is not served by this scenario"):
        read_all(path, options=ImportOptions(served_models=frozenset({"qwen3-8b"})))
    mapped = read_all(path, options=ImportOptions(model_map={"qwen3-8b": "qwen3-8b", "my-model": "llama-3-8b"}))
    assert set(mapped.model) <= {"qwen3-8b", "llama-3-8b"}


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 400), min_size=1, max_size=4), rows=st.integers(1, 300),
       seed=st.integers(0, 10_000))
def test_merge_is_a_stable_sorted_union(sizes, rows, seed):
    inputs = [sample(size, seed + index, optional=index == 0, models=(f"m{index}",)) if size else None
              for index, size in enumerate(sizes)]
    streams = [[] if chunk is None else _split(chunk, 97) for chunk in inputs]
    merged = list(merge_streams(streams, rows))
    assert all(len(piece) <= rows for piece in merged)
    total = sum(sizes)
    assert sum(map(len, merged)) == total
    if total:
        joined = concat(merged)
        assert [piece.first_id for piece in merged] == list(np.cumsum([0] + [len(p) for p in merged])[:-1])
        assert np.all(np.diff(joined.arrival_s) >= 0)
        everything = concat([chunk for chunk in inputs if chunk is not None])
        order = np.argsort(everything.arrival_s, kind="stable")
        np.testing.assert_array_equal(joined.arrival_s, everything.arrival_s[order])
        np.testing.assert_array_equal(joined.model, everything.model[order])
        assert (joined.priority is not None) == (inputs[0] is not None)


def _split(chunk, size):
    return [take(chunk, slice(start, start + size)) for start in range(0, len(chunk), size)]


def test_stats_match_numpy(tmp_path):
    chunk = sample(5000, optional=False)
    stats = trace_stats(_split(chunk, 333))
    summary = stats.summary()
    gaps = np.diff(chunk.arrival_s)
    assert summary["requests"] == 5000
    assert summary["span_s"] == pytest.approx(chunk.arrival_s[-1] - chunk.arrival_s[0])
    assert summary["rate_per_s"] == pytest.approx(5000 / summary["span_s"])
    assert summary["interarrival_cv"] == pytest.approx(gaps.std() / gaps.mean(), rel=1e-9)
    assert sum(summary["models"].values()) == pytest.approx(1.0)
    for name, values in (("prompt_tokens", chunk.prompt_tokens), ("output_tokens", chunk.output_tokens)):
        assert summary[name]["mean"] == pytest.approx(values.mean())
        for q in (50, 90, 99):
            assert summary[name][f"p{q}"] == np.percentile(values, q, method="inverted_cdf")
        assert summary[name]["max"] == values.max()
    plot_stats(stats, tmp_path / "s.svg", "sample")
    assert (tmp_path / "s.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(MmsimError, match="must end in .png or .svg"):
        plot_stats(stats, tmp_path / "s.pdf", "sample")


def test_stats_of_huge_lengths_and_empty_streams():
    chunk = make_chunk([0.0, 1.0, 2.0], ["a"] * 3, [5, 2_000_000, 3_000_000], [1, 1, 1])
    summary = trace_stats([chunk]).summary()
    assert summary["prompt_tokens"]["p50"] == 2_000_000 and summary["prompt_tokens"]["max"] == 3_000_000
    empty = trace_stats([]).summary()
    assert empty["requests"] == 0 and empty["rate_per_s"] is None and empty["prompt_tokens"]["p50"] is None
