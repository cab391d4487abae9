"""Native traces decoded from typed columns (pyarrow, numpy): no pandas import, and exactly the pandas decoder's
chunks, reports and messages, on well-formed traces and on every kind of odd cell."""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
import textwrap
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.workload.native as native
from sim.errors import MmsimError
from sim.workload.columns import make_chunk
from sim.workload.reader import read_trace
from sim.workload.rows import ImportOptions, RowReport
from sim.workload.writer import write_trace
from tests.conftest import scenario_dict

COLUMNS = ("arrival_s", "model", "prompt_tokens", "output_tokens", "priority", "slo_class", "prefix_ids")
HEADER = "arrival_s,model,prompt_tokens,output_tokens"
TYPED_DECODERS = ("csv_chunk", "jsonl_chunk", "parquet_chunk")
SERVED = frozenset({"qwen3-8b", "qwen2.5-3b"})
OPTIONS = [ImportOptions(), ImportOptions(skip_bad=True),
           ImportOptions(served_models=SERVED, skip_bad=True),
           ImportOptions(model_map={"qwen3-8b": "qwen3-8b", "code": "qwen2.5-3b"}, skip_bad=True),
           ImportOptions(start_s=0.5, end_s=40.0, time_scale=0.5)]


def outcome(path, options: ImportOptions, rows: int, *, typed: bool):
    """What reading gives: per chunk its first id, each column's dtype and values; the row report; or the error."""
    report = RowReport(str(path))
    with contextlib.ExitStack() as stack:
        if not typed:
            for name in TYPED_DECODERS:
                stack.enter_context(mock.patch.object(native, name, lambda *args: None))
        try:
            chunks = [(chunk.first_id, [_column(getattr(chunk, name)) for name in COLUMNS])
                      for chunk in read_trace(path, "mmsim", options, rows=rows, report=report)]
        except MmsimError as error:
            chunks = str(error)
        except ValueError as error:  # pandas refuses a header that names a column twice: uncaught, as before
            chunks = (type(error).__name__, str(error))
    return chunks, (report.rows_read, report.rows_out, report.bad_rows, report.first_bad, report.unit)


def _column(values):
    """A column as its dtype and its values with their Python types (so 1 and 1.0, or (1,) and [1], differ)."""
    if values is None:
        return None
    return values.dtype.str, [(type(value).__name__, value) for value in values.tolist()]


def assert_same_both_ways(path, options=OPTIONS, sizes=(1, 65536)):
    """Typed and pandas decoding agree for every option set and chunk size."""
    for option in options:
        for rows in sizes:
            assert outcome(path, option, rows, typed=True) == outcome(path, option, rows, typed=False), (option, rows)


@contextlib.contextmanager
def pandas_decodes():
    """Counts the blocks that went to the pandas decoder."""
    with mock.patch.object(native, "decode_native", wraps=native.decode_native) as spy:
        yield spy


# --- well-formed traces -----------------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_characters=',"\r\n\x00', exclude_categories=("Cs",)), max_size=8)
ROW = st.fixed_dictionaries({
    "gap": st.one_of(st.integers(0, 3).map(float), st.floats(0, 5, allow_nan=False).map(lambda x: round(x, 6))),
    "model": st.sampled_from(["qwen3-8b", "qwen2.5-3b", "code", "my-model"]),
    "prompt_tokens": st.integers(1, 10**7), "output_tokens": st.integers(1, 10**6),
    "priority": st.one_of(st.none(), st.integers(0, 9)),
    "slo_class": st.one_of(st.none(), st.sampled_from(["gold", "silver", "NA", " spaced ", "très"]), TEXT),
    "prefix_ids": st.one_of(st.none(), st.lists(st.integers(0, 2**40), max_size=5).map(tuple)),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROW, min_size=1, max_size=40),
       kind=st.sampled_from(["csv", "crlf-csv", "csv.gz", "jsonl", "parquet"]), names=st.permutations(COLUMNS),
       optional=st.sets(st.sampled_from(COLUMNS[4:])), chunk_rows=st.integers(1, 50))
def test_well_formed_traces_decode_as_pandas_does_without_it(tmp_path, rows, kind, names, optional, chunk_rows):
    names = [name for name in names if name in optional or name in COLUMNS[:4]]
    path = _write_rows(tmp_path / f"t.{kind.split('-')[-1]}", rows, names, crlf=kind == "crlf-csv")
    with pandas_decodes() as spy:
        typed = outcome(path, OPTIONS[0], chunk_rows, typed=True)
    assert spy.call_count == 0
    assert typed == outcome(path, OPTIONS[0], chunk_rows, typed=False)
    assert_same_both_ways(path, OPTIONS[1:], sizes=(chunk_rows,))


def _write_rows(path, rows: list[dict], names: list[str], crlf: bool = False):
    """A native trace in the file's format, written by hand so that optional cells can be left empty."""
    arrival = np.round(np.cumsum([row["gap"] for row in rows]), 6)
    cells = [{**row, "arrival_s": float(time)} for row, time in zip(rows, arrival)]
    if path.suffix == ".parquet":
        types = {"arrival_s": pa.float64(), "model": pa.string(), "prompt_tokens": pa.int64(),
                 "output_tokens": pa.int64(), "priority": pa.int64(), "slo_class": pa.string(),
                 "prefix_ids": pa.list_(pa.int64())}
        pq.write_table(pa.table({name: pa.array([cell[name] for cell in cells], types[name]) for name in names}),
                       path, row_group_size=7)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({name: cell[name] for name in names if cell[name] is not None or
                                            name == "model" or index == 0}) + "\n"
                                for index, cell in enumerate(cells)))
    else:
        def show(name, value):
            if value is None:
                return ""
            if name == "prefix_ids":
                return " ".join(map(str, value))
            return repr(value) if name == "arrival_s" else str(value)
        end = "\r\n" if crlf else "\n"
        text = (",".join(names) + end + "".join(",".join(show(name, cell[name]) for name in names) + end
                                                for cell in cells)).encode()
        path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_written_traces_decode_as_pandas_does(tmp_path, suffix):
    """A CSV block large enough for Arrow to parse it in several pieces, each with its own label dictionary."""
    rng = np.random.default_rng(5)
    rows = 40_000 if suffix == ".csv" else 5_000
    chunk = make_chunk(np.round(np.cumsum(rng.exponential(0.05, rows)), 6),
                       np.array(["qwen3-8b", "qwen2.5-3b"], dtype=object)[rng.integers(0, 2, rows)],
                       rng.integers(1, 5000, rows), rng.integers(1, 500, rows), priority=rng.integers(0, 3, rows),
                       slo_class=np.array([None, "gold", "silver"], dtype=object)[rng.integers(0, 3, rows)],
                       prefix_ids=np.array([tuple(range(k % 5)) or None for k in range(rows)] + [None], dtype=object)[:-1])
    path = tmp_path / f"t{suffix}"
    write_trace([chunk], path)
    with pandas_decodes() as spy:
        for size in (999, 65536):
            assert outcome(path, OPTIONS[0], size, typed=True)[1][1] == rows
    assert spy.call_count == 0
    assert_same_both_ways(path, OPTIONS[:3], sizes=(65536,))


# --- odd cells: the pandas decoder reads them, with its messages --------------------------------------------------

CSV_CELLS = [
    ("arrival_s", "0.05", "line 3: earlier than the row before; traces must be sorted by time"),
    ("arrival_s", "nan", "line 3: arrival_s 'nan' is not a number from 0 to 1e+09"),
    ("arrival_s", "inf", "line 3: arrival_s inf is not a number from 0 to 1e+09"),
    ("arrival_s", "-0.5", "line 3: arrival_s -0.5 is not a number from 0 to 1e+09"),
    ("arrival_s", "2e9", "line 3: arrival_s 2000000000 is not a number from 0 to 1e+09"),
    ("arrival_s", "0x10", "line 3: arrival_s '0x10' is not a number from 0 to 1e+09"),
    ("arrival_s", " 1", None), ("arrival_s", "1 ", None), ("arrival_s", "1e0", None), ("arrival_s", "+1", None),
    ("arrival_s", "", None), ("arrival_s", "1.", None), ("arrival_s", ".5", None), ("arrival_s", "1E-3", None),
    ("arrival_s", "-0", None), ("arrival_s", "1e-400", None), ("arrival_s", "Infinity", None), ("arrival_s", "NaN", None),
    ("arrival_s", "0.1000000000000000055511151231257827", None), ("arrival_s", "1,5", None),
    ("prompt_tokens", "2.5", "line 3: prompt_tokens 2.5 is not a whole number >= 1"),
    ("prompt_tokens", "0", "line 3: prompt_tokens 0 is less than 1"),
    ("prompt_tokens", "", "line 3: prompt_tokens (missing) is not a whole number >= 1"),
    ("prompt_tokens", "True", "line 3: prompt_tokens 'True' is not a whole number >= 1"),
    ("prompt_tokens", "1_0", "line 3: prompt_tokens '1_0' is not a whole number >= 1"),
    ("prompt_tokens", "99999999999999999999", "line 3: prompt_tokens 99999999999999999999 is more than 10,000,000"),
    ("prompt_tokens", "10.0", None), ("prompt_tokens", "1e2", None), ("prompt_tokens", "+7", None),
    ("prompt_tokens", " 10", None), ("prompt_tokens", "010", None), ("prompt_tokens", "-0", None),
    ("prompt_tokens", "0x1A", None), ("prompt_tokens", "١٢", None),
    ("output_tokens", "-3", "line 3: output_tokens -3 is less than 1"),
    ("model", "", "line 3: model is missing or not a name"), ("model", " ", "line 3: model is missing or not a name"),
    ("model", "gpt-9", "line 3: model 'gpt-9' is not served by this scenario"),
    ("model", " qwen3-8b ", None), ("model", "qwen3-8b\t", None), ("model", '"qwen3-8b"', None), ("model", "NA", None),
    ("model", "模型", None), ("model", "qwen3-8b\x1f", None), ("model", "nan", None), ("model", "\u00a0qwen3-8b", None),
    ("priority", "-1", "line 3: priority -1 is less than 0"),
    ("priority", "1.5", "line 3: priority 1.5 is not a whole number >= 0"), ("priority", "", None),
    ("priority", "2.0", None), ("priority", "+0", None),
    ("slo_class", "NA", None), ("slo_class", '"a, b"', None), ("slo_class", "", None), ("slo_class", " x ", None),
    ("slo_class", "null", None), ("slo_class", "#x", None), ("slo_class", "\u2028", None),
    ("prefix_ids", "1 x", "line 3: prefix_ids must be whole numbers (space-separated in CSV, a list in JSON)"),
    ("prefix_ids", "1_2 -3", None), ("prefix_ids", "   ", None), ("prefix_ids", "07 +8", None), ("prefix_ids", "", None),
    ("prefix_ids", "1\t2", None), ("prefix_ids", "٣", None),
]


@pytest.mark.parametrize(("column", "cell", "message"), CSV_CELLS)
def test_odd_csv_cells_read_as_before(tmp_path, column, cell, message):
    path = tmp_path / "t.csv"
    values = {"arrival_s": "0.1", "model": "qwen3-8b", "prompt_tokens": "10", "output_tokens": "5", "priority": "1",
              "slo_class": "gold", "prefix_ids": "1 2"}
    rows = [values, {**values, column: cell}, {**values, "arrival_s": "2"}]
    path.write_text(",".join(values) + "\n" + "".join(",".join(row.values()) + "\n" for row in rows))
    assert_same_both_ways(path)
    if message is not None:
        assert message in outcome(path, ImportOptions(served_models=SERVED), 65536, typed=True)[0]


CELL = st.text(st.sampled_from(list("0123456789+-.eExX_ \t,\"'ïNnaAIifT") + ["\u00a0", "\u3000", "٣"]), max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(COLUMNS), CELL), max_size=4))
def test_random_csv_cells_read_as_before(tmp_path, cells):
    rows = [["0.1", "qwen3-8b", "10", "5", "1", "gold", "1 2"] for _ in range(4)]
    for row, column, cell in cells:
        rows[row][COLUMNS.index(column)] = cell
    path = tmp_path / "t.csv"
    path.write_text(",".join(COLUMNS) + "\n" + "".join(",".join(row) + "\n" for row in rows))
    assert_same_both_ways(path, OPTIONS[:3], sizes=(1, 65536))


@pytest.mark.parametrize("case", [
    "blank lines", "no final newline", "wrong field count", "not utf-8", "byte-order mark", "nul byte", "lone cr",
    "duplicate column"])
def test_odd_csv_lines_read_as_before(tmp_path, case):
    body = ["0.1,qwen3-8b,10,5", "0.2,qwen3-8b,11,5", "0.3,qwen3-8b,12,5"]
    data = {"blank lines": HEADER + "\n\n" + "\n\n".join(body) + "\n\n",
            "no final newline": HEADER + "\n" + "\n".join(body),
            "wrong field count": HEADER + "\n" + "\n".join(body[:1] + ["0.2,qwen3-8b,11,5,9"] + body[2:]) + "\n",
            "not utf-8": HEADER + "\n" + "\n".join(body[:1] + ["0.2,qwen\udcff,11,5"] + body[2:]) + "\n",
            "byte-order mark": "\ufeff" + HEADER + "\n" + "\n".join(body) + "\n",
            "nul byte": HEADER + "\n" + "\n".join(body[:1] + ["0.2,qwen3-8b\0,11,5"] + body[2:]) + "\n",
            "lone cr": HEADER + "\n" + "\n".join(body[:1] + ["0.2,qwen3-8b,11,5\r9"] + body[2:]) + "\n",
            "duplicate column": HEADER + ",model\n" + "\n".join(f"{line},x" for line in body) + "\n"}[case]
    path = tmp_path / "t.csv"
    path.write_bytes(data.encode("utf-8", "surrogateescape"))
    assert_same_both_ways(path)


PARQUET_COLUMNS = [
    ("prompt_tokens", pa.array([10, None, 30])), ("prompt_tokens", pa.array([10.0, 2.5, 30.0])),
    ("prompt_tokens", pa.array([10.0, 20.0, 30.0])), ("prompt_tokens", pa.array([10, 20, 30], pa.int32())),
    ("prompt_tokens", pa.array([10, 20, 2**63 + 5], pa.uint64())), ("prompt_tokens", pa.array([10, 2**41, 30])),
    ("arrival_s", pa.array([0.1, float("nan"), 0.3])), ("arrival_s", pa.array([0.1, 0.05, 0.3])),
    ("arrival_s", pa.array([0.1, 0.2, 0.3], pa.float32())), ("arrival_s", pa.array([0, 1, 2], pa.int16())),
    ("arrival_s", pa.array([0.1, 0.2, 0.3], pa.float16())),
    ("model", pa.array(["qwen3-8b", None, "qwen3-8b"])), ("model", pa.array(["qwen3-8b", "", "qwen3-8b"])),
    ("model", pa.array([" qwen3-8b", "qwen3-8b ", "qwen3-8b"])), ("model", pa.array(["qwen3-8b", "x", "qwen3-8b"])),
    ("model", pa.array(["qwen3-8b"] * 3, pa.large_string())), ("model", pa.array(["qwen3-8b"] * 3).dictionary_encode()),
    ("model", pa.array([1, 2, 1]).dictionary_encode()), ("model", pa.array(["模型"] * 3)),
    ("model", pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int8()), pa.array(["qwen3-8b", "x"]))),
    ("priority", pa.array([0, None, 2])), ("priority", pa.array([0, -1, 2])), ("priority", pa.array([0.0, None, 1.5])),
    ("priority", pa.array([0.0, float("nan"), 1.0])),
    ("slo_class", pa.array(["a", None, ""])), ("slo_class", pa.array(["a", None, "b"], pa.large_string())),
    ("slo_class", pa.array([1, 2, None]).dictionary_encode()),
    ("prefix_ids", pa.array([[1, 2], None, []])), ("prefix_ids", pa.array([[1], [2, 3], None], pa.list_(pa.int32()))),
    ("prefix_ids", pa.array([[1], [-2, 3], None], pa.large_list(pa.int64()))),
    ("prefix_ids", pa.array([[1], [2**64 - 1], None], pa.list_(pa.uint64()))),
    ("prefix_ids", pa.array([[1], [None, 3], None], pa.list_(pa.int64()))),
    ("prefix_ids", pa.array([[1.0], [2.0], None], pa.list_(pa.float64()))), ("prefix_ids", pa.array(["1", "2", None])),
    ("prefix_ids", pa.array([None, None, None], pa.null())),
]


@pytest.mark.parametrize(("column", "values"), PARQUET_COLUMNS, ids=lambda value: str(getattr(value, "type", value)))
def test_odd_parquet_columns_read_as_before(tmp_path, column, values):
    table = {"arrival_s": pa.array([0.1, 0.2, 0.3]), "model": pa.array(["qwen3-8b"] * 3),
             "prompt_tokens": pa.array([10, 20, 30]), "output_tokens": pa.array([5, 6, 7])}
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({**table, column: values}), path)
    assert_same_both_ways(path)
    # Batches smaller than a row group can be slices of it (offsets into shared buffers).
    big = pa.concat_tables([pa.table({**table, column: values})] * 5)
    pq.write_table(big.slice(1), path, row_group_size=4)
    assert_same_both_ways(path, OPTIONS[1:2], sizes=(2, 5))


def test_a_parquet_trace_written_by_pandas_reads_as_before(tmp_path):
    """pandas' own types (categorical, nullable integers, its string type) and the schema metadata it adds."""
    import pandas as pd

    frame = pd.DataFrame({"arrival_s": [0.1, 0.2, 0.2], "model": pd.Categorical(["qwen3-8b", "code", "qwen3-8b"]),
                          "prompt_tokens": pd.array([10, 20, 30], dtype="Int64"), "output_tokens": [5, 6, 7],
                          "priority": pd.array([1, None, 2], dtype="Int64"),
                          "slo_class": pd.array(["a", None, ""], dtype="string")})
    frame.to_parquet(tmp_path / "t.parquet")
    assert_same_both_ways(tmp_path / "t.parquet")


JSON_VALUES = [
    ("prompt_tokens", True), ("prompt_tokens", "10"), ("prompt_tokens", 10.0), ("prompt_tokens", 2.5),
    ("prompt_tokens", None), ("prompt_tokens", 2**70), ("prompt_tokens", [10]),
    ("arrival_s", float("nan")), ("arrival_s", 1), ("arrival_s", -1), ("arrival_s", 0.05), ("arrival_s", 1e400),
    ("model", None), ("model", 3), ("model", " qwen3-8b"), ("model", ""), ("model", "gpt-9"),
    ("priority", None), ("priority", 1.0), ("priority", False), ("priority", -2),
    ("slo_class", None), ("slo_class", ""), ("slo_class", 5), ("slo_class", ["a"]),
    ("prefix_ids", None), ("prefix_ids", []), ("prefix_ids", [True, 2]), ("prefix_ids", "1 2"), ("prefix_ids", [1.0]),
    ("prefix_ids", {"a": 1}), ("prefix_ids", float("nan")), ("prefix_ids", [2**70]),
]


@pytest.mark.parametrize(("key", "value"), JSON_VALUES, ids=lambda value: repr(value)[:20])
def test_odd_jsonl_values_read_as_before(tmp_path, key, value):
    record = {"arrival_s": 0.1, "model": "qwen3-8b", "prompt_tokens": 10, "output_tokens": 5, "priority": 1,
              "slo_class": "gold", "prefix_ids": [1, 2]}
    records = [record, {**record, key: value}, {**record, "arrival_s": 2},
               {name: cell for name, cell in record.items() if name != key}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in records))
    assert_same_both_ways(path)


# --- no pandas ---------------------------------------------------------------------------------------------------

READ_CHECK = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from sim.workload.config import WorkloadConfig
    from sim.workload.stream import iter_requests
    config = WorkloadConfig.model_validate({"trace": {"path": sys.argv[1]}})
    config.serve(["qwen3-8b", "qwen2.5-3b"])
    rows = sum(len(chunk) for chunk in iter_requests(config, seed=0, base_dir=Path.cwd(), chunk_rows=1000))
    heavy = ("pandas", "pyarrow.compute")
    print(json.dumps([rows, [name for name in heavy if name in sys.modules]]))
""")

RUN_CHECK = textwrap.dedent("""
    import json, sys
    from sim.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as done:
        assert not done.code, done.code
    print(json.dumps([name for name in ("pandas", "pyarrow.compute") if name in sys.modules]))
""")


def _trace(tmp_path, suffix: str, rows: int = 3000, prefix: bool = True):
    rng = np.random.default_rng(1)
    path = tmp_path / f"t{suffix}"
    write_trace([make_chunk(np.round(np.cumsum(rng.exponential(0.02, rows)), 6),
                            np.array(["qwen3-8b", "qwen2.5-3b"], dtype=object)[rng.integers(0, 2, rows)],
                            rng.integers(1, 2000, rows), rng.integers(1, 200, rows), priority=rng.integers(0, 3, rows),
                            slo_class=np.array([None, "gold"], dtype=object)[rng.integers(0, 2, rows)],
                            **({"prefix_ids": np.array([(k % 7, k % 3) for k in range(rows)] + [None],
                                                       dtype=object)[:-1]} if prefix else {}))], path)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_reading_a_native_trace_imports_no_pandas(tmp_path, suffix):
    path = _trace(tmp_path, suffix)
    done = subprocess.run([sys.executable, "-c", READ_CHECK, str(path)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [3000, []]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_run_from_a_trace_imports_no_pandas(tmp_path, suffix):
    path = _trace(tmp_path, suffix, rows=200, prefix=False)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(scenario_dict(workload={"trace": {"path": path.name}})))
    done = subprocess.run([sys.executable, "-c", RUN_CHECK, "run", str(scenario), "--out", str(tmp_path / "run"),
                           "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
    assert (tmp_path / "run" / "requests.parquet").is_file()
