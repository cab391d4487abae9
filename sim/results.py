"""Run results: the run's tables and the files a run writes (atomically); the summary is :mod:`sim.summary`.

The tables are built from the recorder's typed arrays without pandas: the summary is computed with numpy
and the Parquet files are written with pyarrow straight from those columns, a row group at a time, so a
run of ten million requests never holds more than one row group's worth of derived columns. pandas frames
(``RunResult.requests`` and friends, for the Python API) are built only when asked for.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from sim.engine.recorder import DROP_REASONS, EVENT_COLUMNS, LOST_COLUMNS, Recorder
from sim.outputs import written_through

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
REQUEST_COLUMNS = ("id", "model", "slo_class", "status", "drop_reason", "arrival_s", "queue_s", "first_scheduled_s",
                   "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "cached_prompt_tokens",
                   "output_tokens", "generated_tokens", "preemptions", *LOST_COLUMNS, "gpu")
"""requests.parquet's columns, in order."""
CODED_COLUMNS = ("model", "slo_class", "drop_reason")
"""Columns kept as codes into a list of names (categoricals in pandas, dictionaries in Parquet); a negative code
(a request without an SLO class) is a missing value."""
DERIVED_FROM = {"queue_s": "first_scheduled_s", "ttft_s": "first_token_s", "e2e_s": "finish_s"}
"""Latencies measured from arrival: each is this column minus ``arrival_s``."""
ARROW_TYPES = {"i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64", "f8": "float64"}
"""numpy dtype (size and kind) -> Arrow type, for the columns a run writes."""
ROW_GROUP_ROWS = 1 << 18
"""Requests per Parquet row group: the most rows whose derived columns exist at once while writing."""


class RequestTable:
    """A run's requests in id order, as requests.parquet holds them, computed one column at a time from the
    recorder's arrays (which stay the only full copy of the data)."""

    def __init__(self, recorder: Recorder):
        self.model_names = list(recorder.model_names)
        self.slo_class_names = list(recorder.slo_class_names)
        self._raw = recorder.request_columns()
        self._lost_rows, self._lost_values = recorder.lost_seconds()
        self._order = _id_order(self._raw["id"])
        self._lost_positions: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._order)

    def names(self, column: str) -> list[str]:
        """The names a coded column's codes index."""
        if column == "model":
            return self.model_names
        return self.slo_class_names if column == "slo_class" else list(DROP_REASONS)

    def column(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """Column ``name`` for the requests at positions ``rows`` of the id order (codes for CODED_COLUMNS)."""
        if name == "status":
            return np.where(self.column("drop_reason", rows) == 0, "completed", "dropped")
        if name in DERIVED_FROM:
            values = self.column(DERIVED_FROM[name], rows)
            values -= self.column("arrival_s", rows)  # in place: one full column less at a time (10M rows: 80 MB)
            return values
        if name == "tpot_s":
            # As vLLM's benchmark: TPOT is over the tokens after the first, so a one-token output has none (NaN,
            # left out of TPOT statistics rather than counted as 0).
            output = self.column("output_tokens", rows)
            decode_tokens = np.where(output > 1, output - 1, np.nan)
            del output
            values = self.column("finish_s", rows)
            values -= self.column("first_token_s", rows)
            values /= decode_tokens
            return values
        if name in LOST_COLUMNS:
            return self._lost(LOST_COLUMNS.index(name), rows)
        values = self._raw[name][self._order[rows]]
        if name in CODED_COLUMNS:
            return values
        return values.astype(np.float64 if values.dtype.kind == "f" else np.int64, copy=False)  # as the files hold them

    def _lost(self, cause: int, rows: slice) -> np.ndarray:
        """Seconds lost to one cause: zero but for the few requests the recorder kept losses for."""
        if self._lost_positions is None:
            rank = np.empty(len(self._order), np.int64)
            rank[self._order] = np.arange(len(self._order))
            self._lost_positions = rank[self._lost_rows]
        start, stop, _ = rows.indices(len(self._order))
        dense = np.zeros(stop - start, np.float64)
        inside = (self._lost_positions >= start) & (self._lost_positions < stop)
        dense[self._lost_positions[inside] - start] = self._lost_values[inside, cause]
        return dense

    def slices(self) -> Iterator[slice]:
        for start in range(0, len(self), ROW_GROUP_ROWS):
            yield slice(start, start + ROW_GROUP_ROWS)

    def arrow_batch(self, rows: slice = slice(None)) -> pa.RecordBatch:
        """The requests at ``rows`` as one Arrow record batch with requests.parquet's schema."""
        import pyarrow as pa

        arrays = []
        for name in REQUEST_COLUMNS:
            if name in CODED_COLUMNS:
                names = self.names(name)
                codes: np.ndarray = self.column(name, rows).astype(_code_type(len(names)), copy=False)
                arrays.append(pa.DictionaryArray.from_arrays(arrow_numbers(codes, codes < 0),
                                                             arrow_strings(names, large=False)))
            elif name == "status":
                dropped = (self.column("drop_reason", rows) != 0).astype(np.int8)
                arrays.append(arrow_labels(dropped, ("completed", "dropped")))
            else:
                arrays.append(arrow_numbers(self.column(name, rows)))
        return pa.RecordBatch.from_arrays(arrays, names=list(REQUEST_COLUMNS))

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        data = {}
        for name in REQUEST_COLUMNS:
            values = self.column(name)
            coded = name in CODED_COLUMNS
            data[name] = pd.Categorical.from_codes(values, categories=self.names(name)) if coded else values
        return pd.DataFrame(data)


def _id_order(ids: np.ndarray) -> np.ndarray:
    """The rows in id order. Ids numbered 0..n-1 (every stream's) are placed directly, in O(n) and 32 bits a row
    (each column is gathered through this once per use); other ids are sorted."""
    count = len(ids)
    index_type = np.int32 if count < 2**31 else np.int64
    if count and ids.min() == 0 and ids.max() == count - 1:
        seen = np.zeros(count, bool)
        seen[ids] = True
        if seen.all():
            order = np.empty(count, index_type)
            order[ids] = np.arange(count, dtype=index_type)
            return order
    return np.argsort(ids, kind="stable").astype(index_type)


def _code_type(categories: int) -> type:
    """The narrowest signed integer type for codes into ``categories`` names (as pandas picks for categoricals)."""
    for dtype in (np.int8, np.int16, np.int32):
        if categories < np.iinfo(dtype).max:
            return dtype
    return np.int64


class ColumnTable:
    """A run's events or samples as numpy columns, typed as their Parquet files hold them when read; a text column
    is kept as codes into the list of its distinct texts."""

    def __init__(self, columns: dict[str, np.ndarray], texts: dict[str, list[str]]):
        self._columns, self.texts = columns, texts

    def __len__(self) -> int:
        return len(next(iter(self._columns.values())))

    def column(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """Column ``name`` at ``rows`` (codes for a text column), numbers as int64 or float64."""
        values = self._columns[name][rows]
        if name in self.texts:
            return values
        return values.astype(np.float64 if values.dtype.kind == "f" else np.int64)

    def text(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        return np.array(self.texts[name], dtype=object)[self._columns[name][rows]]

    def slices(self) -> Iterator[slice]:
        for start in range(0, len(self), ROW_GROUP_ROWS):
            yield slice(start, start + ROW_GROUP_ROWS)

    def arrow_batch(self, rows: slice = slice(None)) -> pa.RecordBatch:
        import pyarrow as pa

        arrays = [arrow_labels(self.column(name, rows), tuple(self.texts[name])) if name in self.texts
                  else arrow_numbers(self.column(name, rows)) for name in self._columns]
        return pa.RecordBatch.from_arrays(arrays, names=list(self._columns))

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({name: pd.Series(self.text(name), dtype="str") if name in self.texts else self.column(name)
                             for name in self._columns})


def event_table(recorder: Recorder) -> ColumnTable:
    """The event log: its row tuples, column by column."""
    values = list(zip(*recorder.events)) if recorder.events else [()] * len(EVENT_COLUMNS)
    columns, texts = {}, {}
    for name, column in zip(EVENT_COLUMNS, values):
        if name in ("kind", "model", "detail"):
            texts[name] = sorted(set(column))
            codes = {text: code for code, text in enumerate(texts[name])}
            columns[name] = np.array([codes[text] for text in column], np.int64)
        else:
            columns[name] = np.array(column, np.float64 if name.endswith("_s") else np.int64)
    return ColumnTable(columns, texts)


def sample_table(recorder: Recorder) -> ColumnTable:
    """The periodic samples: views of the recorder's arrays."""
    return ColumnTable(recorder.sample_columns(), {"model": list(recorder.sample_names)})


# -- Arrow arrays from numpy, built from their buffers: ``pa.array`` imports pandas to inspect its argument, which
# would cost every run half a second of start-up.
def arrow_numbers(values: np.ndarray, absent: np.ndarray | None = None) -> pa.Array:
    """A numeric column as an Arrow array over the same memory; NaN becomes null, as pandas writes it, and so do
    the values where ``absent`` is True."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    arrow_type = getattr(pa, ARROW_TYPES[values.dtype.str[1:]])()
    validity, missing = None, 0
    if absent is None and values.dtype.kind == "f":
        absent = np.isnan(values)
    if absent is not None:
        missing = int(absent.sum())
        if missing:
            validity = pa.py_buffer(np.packbits(~absent, bitorder="little"))
    return pa.Array.from_buffers(arrow_type, len(values), [validity, pa.py_buffer(values)], null_count=missing)


def arrow_strings(texts: list[str], large: bool = True) -> pa.Array:
    """A text column (``large_string``, as pandas writes text, or ``string``) from Python strings."""
    import pyarrow as pa

    encoded = [text.encode() for text in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64 if large else np.int32)
    np.cumsum([len(data) for data in encoded], out=offsets[1:])
    kind = pa.LargeStringArray if large else pa.StringArray
    return kind.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))


def arrow_labels(codes: np.ndarray, labels: tuple[str, ...]) -> pa.Array:
    """A ``large_string`` column whose row i is ``labels[codes[i]]``, built without a Python string per row."""
    import pyarrow as pa

    encoded = [label.encode() for label in labels]
    width = max((len(data) for data in encoded), default=0)
    table = np.zeros((len(labels), width), np.uint8)
    for k, data in enumerate(encoded):
        table[k, :len(data)] = np.frombuffer(data, np.uint8)
    lengths = np.array([len(data) for data in encoded], np.int64)[codes]
    offsets = np.zeros(len(codes) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    text = table[codes][np.arange(width) < lengths[:, None]]  # each row's bytes, rows in order
    return pa.LargeStringArray.from_buffers(len(codes), pa.py_buffer(offsets), pa.py_buffer(text))


# -- the summary -----------------------------------------------------------------------------------------
def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Write through a temporary file in the same folder, then rename: never a half-written file (a link is
    written through)."""
    path = written_through(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; results are ordinary files
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename in (None, tmp):
            error.filename = str(path)  # a full disk raises without a name (or the temporary's): the user's path
        raise


def write_table(table: RequestTable | ColumnTable, path: str) -> None:
    """A table as Parquet, a row group at a time: only one row group's typed and derived columns exist at once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    batches = (table.arrow_batch(rows) for rows in table.slices())
    first = next(batches, None)
    if first is None:  # no rows: the file still has the table's columns
        first = table.arrow_batch(slice(0, 0))
    # Dictionary pages only for the columns whose values repeat (model names, labels, kinds): tried on every
    # float column too (Parquet's default), it took two thirds of a million-request run's writing for nothing.
    repeating = [field.name for field in first.schema if pa.types.is_dictionary(field.type)
                 or pa.types.is_string(field.type) or pa.types.is_large_string(field.type)]
    with pq.ParquetWriter(path, first.schema, use_dictionary=repeating) as writer:
        writer.write_batch(first)
        for batch in batches:
            writer.write_batch(batch)


def write_run(result, out_dir: Path, scenario_data: dict | None = None) -> Path:
    """Write summary.json, requests/events/timeseries Parquet (and the scenario) into ``out_dir``, a folder no
    reader looks in yet: :func:`sim.runner.write_run_folder`'s staging one, swapped into place whole. Plain writes:
    a temporary file and a rename for each file cost a small run's writing a fifth of its time for nothing."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, table in (("requests", result.tables.requests), ("events", result.tables.events),
                        ("timeseries", result.tables.samples)):
        write_table(table, str(out_dir / f"{name}.parquet"))
    if scenario_data is not None:
        (out_dir / "scenario.json").write_text(json.dumps(scenario_data, indent=1, default=str))
    (out_dir / "summary.json").write_text(json.dumps(result.summary, indent=1, default=float))
    return out_dir
