"""Writing native traces (CSV, JSONL or Parquet by suffix), streamed and atomic.

Rows are written chunk by chunk into a temporary file next to the target, which
replaces the target only when everything succeeded: an error half-way leaves no
half-written trace behind. The optional columns written are those of the first
chunk. Arrival times are rounded to the microsecond.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sim.errors import MmsimError
from sim.outputs import disk_error, written_through
from sim.workload.chunk import RequestChunk
from sim.workload.columns import REQUIRED_COLUMNS, default_column, optional_columns
from sim.workload.textfiles import file_kind

ARRIVAL_DECIMALS = 6

PARQUET_TYPES = {
    "arrival_s": pa.float64(), "model": pa.string(), "prompt_tokens": pa.int64(), "output_tokens": pa.int64(),
    "priority": pa.int64(), "slo_class": pa.string(), "prefix_ids": pa.list_(pa.int64()),
}


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """A temporary path in the target's folder that replaces ``target`` (through a link) when the block succeeds."""
    target = written_through(target)
    if not target.parent.is_dir():
        raise MmsimError("output folder does not exist", source=str(target.parent))
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes the file private; the trace should be like any new file
    try:
        yield Path(temporary)
        os.replace(temporary, target)
    except OSError as error:
        problem = disk_error(error, target)
        if problem is None:
            raise
        raise problem from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_trace(chunks: Iterable[RequestChunk], target: Path) -> int:
    """Write the chunks as a native trace at ``target`` (format from the suffix); returns the row count."""
    target = Path(target)
    kind = file_kind(target)
    if target.suffix.lower() == ".gz":
        raise MmsimError("writing compressed traces is not supported; drop the .gz suffix", source=str(target))
    with atomic_path(target) as temporary:
        if kind == "parquet":
            return _write_parquet(chunks, temporary)
        with open(temporary, "wb") as handle:
            return (_write_csv if kind == "csv" else _write_jsonl)(chunks, handle)


def _columns(first: RequestChunk) -> list[str]:
    """The columns a file gets: the required ones and the first chunk's optional ones."""
    return [*REQUIRED_COLUMNS, *optional_columns(first)]


def _values(chunk: RequestChunk, name: str) -> np.ndarray:
    """A column to write: arrival times rounded, missing optional columns filled with defaults."""
    if name == "arrival_s":
        return np.round(chunk.arrival_s, ARRIVAL_DECIMALS)
    values = getattr(chunk, name)
    return default_column(name, len(chunk)) if values is None else values


def _arrow_table(chunk: RequestChunk, columns: list[str], prefix_as_text: bool) -> pa.Table:
    """The chunk as an Arrow table (prefix ids as space-separated text for CSV, lists for Parquet)."""
    data = {}
    for name in columns:
        values = _values(chunk, name)
        if name == "prefix_ids":
            cells = [(" ".join(map(str, ids)) if prefix_as_text else list(ids)) if ids else None for ids in values]
            data[name] = pa.array(cells, pa.string() if prefix_as_text else PARQUET_TYPES[name])
        else:
            data[name] = pa.array(values, PARQUET_TYPES[name], from_pandas=True)
    return pa.table(data)


def _write_csv(chunks: Iterable[RequestChunk], handle) -> int:
    rows, columns = 0, None
    plain = pacsv.WriteOptions(include_header=False, quoting_style="none")
    for chunk in chunks:
        if columns is None:
            columns = _columns(chunk)
            handle.write(",".join(columns).encode() + b"\n")
        table = _arrow_table(chunk, columns, prefix_as_text=True)
        buffer = io.BytesIO()  # Arrow writes batch by batch: a late failure must not leave early rows written
        try:
            pacsv.write_csv(table, buffer, plain)
            handle.write(buffer.getvalue())
        except pa.ArrowInvalid:
            # A text value holds a comma, quote or line break: let pandas quote just those values.
            handle.write(table.to_pandas().to_csv(header=False, index=False, lineterminator="\n").encode())
        rows += len(chunk)
    if columns is None:
        handle.write(",".join(REQUIRED_COLUMNS).encode() + b"\n")
    return rows


def _json_texts(chunk: RequestChunk, name: str) -> list[str]:
    """The JSON text of every value of a column (names encoded once per distinct value)."""
    values = _values(chunk, name)
    if name in ("model", "slo_class"):
        codes, distinct = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=True)
        encoded = np.array([json.dumps(value) for value in distinct] + ["null"], dtype=object)
        return encoded[codes].tolist()
    if name == "prefix_ids":
        return [json.dumps(list(ids)) if ids else "null" for ids in values]
    return pc.cast(pa.array(values), pa.string()).to_pylist()


def _write_jsonl(chunks: Iterable[RequestChunk], handle) -> int:
    rows, columns, template = 0, None, ""
    for chunk in chunks:
        if columns is None:
            columns = _columns(chunk)
            template = "{{" + ", ".join(f'"{name}": {{}}' for name in columns) + "}}\n"
        texts = [_json_texts(chunk, name) for name in columns]
        handle.write("".join(template.format(*row) for row in zip(*texts)).encode())
        rows += len(chunk)
    return rows


def _write_parquet(chunks: Iterable[RequestChunk], temporary: Path) -> int:
    rows, writer = 0, None
    try:
        for chunk in chunks:
            if writer is None:
                columns = _columns(chunk)
                schema = pa.schema([(name, PARQUET_TYPES[name]) for name in columns])
                writer = pq.ParquetWriter(temporary, schema, compression="zstd")
            writer.write_table(_arrow_table(chunk, columns, prefix_as_text=False))
            rows += len(chunk)
        if writer is None:
            schema = pa.schema([(name, PARQUET_TYPES[name]) for name in REQUIRED_COLUMNS])
            pq.write_table(schema.empty_table(), temporary)
    finally:
        if writer is not None:
            writer.close()
    return rows
