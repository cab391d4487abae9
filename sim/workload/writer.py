"""Writing native traces (CSV, JSONL or Parquet by suffix), streamed and atomic.

Rows are written chunk by chunk into a temporary file next to the target, which
replaces the target only when everything succeeded: an error half-way leaves no
half-written trace behind. The optional columns written are those of the first
chunk. Arrival times are written to the microsecond.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sim.errors import MmsimError
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
    """A temporary path in the target's folder that replaces ``target`` when the block succeeds."""
    target = Path(target)
    if not target.parent.is_dir():
        raise MmsimError("output folder does not exist", source=str(target.parent))
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    try:
        yield Path(temporary)
        os.replace(temporary, target)
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
        with open(temporary, "w", encoding="utf-8", newline="") as handle:
            return (_write_csv if kind == "csv" else _write_jsonl)(chunks, handle)


def _frame(chunk: RequestChunk, columns: list[str]) -> pd.DataFrame:
    """The chunk as a table with exactly ``columns`` (missing optional columns take their defaults)."""
    data = {}
    for name in columns:
        values = getattr(chunk, name)
        data[name] = default_column(name, len(chunk)) if values is None else values
    data["arrival_s"] = np.round(chunk.arrival_s, ARRIVAL_DECIMALS)
    return pd.DataFrame(data, columns=columns)


def _columns(first: RequestChunk) -> list[str]:
    return [*REQUIRED_COLUMNS, *optional_columns(first)]


def _write_csv(chunks: Iterable[RequestChunk], handle) -> int:
    rows, columns = 0, None
    for chunk in chunks:
        if columns is None:
            columns = _columns(chunk)
            handle.write(",".join(columns) + "\n")
        frame = _frame(chunk, columns)
        if "prefix_ids" in frame:
            frame["prefix_ids"] = [" ".join(map(str, ids)) if ids else "" for ids in frame["prefix_ids"]]
        frame.to_csv(handle, header=False, index=False, float_format=f"%.{ARRIVAL_DECIMALS}f", lineterminator="\n")
        rows += len(chunk)
    if columns is None:
        handle.write(",".join(REQUIRED_COLUMNS) + "\n")
    return rows


def _write_jsonl(chunks: Iterable[RequestChunk], handle) -> int:
    rows, columns = 0, None
    for chunk in chunks:
        columns = columns or _columns(chunk)
        frame = _frame(chunk, columns)
        arrivals = [f"{value:.{ARRIVAL_DECIMALS}f}".rstrip("0").rstrip(".") for value in frame["arrival_s"]]
        rest = frame.drop(columns="arrival_s")
        if "prefix_ids" in rest:
            rest["prefix_ids"] = [list(ids) if ids else None for ids in rest["prefix_ids"]]
        for arrival, record in zip(arrivals, rest.to_dict("records")):
            handle.write(f'{{"arrival_s": {arrival}, {json.dumps(record)[1:]}\n')
        rows += len(chunk)
    return rows


def _write_parquet(chunks: Iterable[RequestChunk], temporary: Path) -> int:
    rows, columns, writer = 0, None, None
    try:
        for chunk in chunks:
            if columns is None:
                columns = _columns(chunk)
                schema = pa.schema([(name, PARQUET_TYPES[name]) for name in columns])
                writer = pq.ParquetWriter(temporary, schema, compression="zstd")
            frame = _frame(chunk, columns)
            if "prefix_ids" in frame:
                frame["prefix_ids"] = [list(ids) if ids else None for ids in frame["prefix_ids"]]
            writer.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False))
            rows += len(chunk)
        if writer is None:
            schema = pa.schema([(name, PARQUET_TYPES[name]) for name in REQUIRED_COLUMNS])
            pq.write_table(schema.empty_table(), temporary)
    finally:
        if writer is not None:
            writer.close()
    return rows
