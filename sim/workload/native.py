"""Reading the native trace format (CSV, JSONL or Parquet), streamed in chunks.

One request per row: ``arrival_s`` (seconds, >= 0, non-decreasing), ``model``
(a catalogue name), ``prompt_tokens`` and ``output_tokens`` (whole numbers >= 1),
and optionally ``priority`` (whole number >= 0, default 0), ``slo_class`` (text)
and ``prefix_ids`` (ids of shared prompt-prefix blocks; in CSV space-separated,
in JSONL/Parquet a list of integers). Chunks carry prefix ids as tuples of ints.
CSV and Parquet name their columns in the header/schema; in JSONL the keys of
the first line set the optional columns (a later line may omit one, not add one).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sim.errors import MmsimError
from sim.files import check_regular_file, cut
from sim.workload.chunk import RequestChunk
from sim.workload.columns import NATIVE_COLUMNS, OPTIONAL_COLUMNS, REQUIRED_COLUMNS, make_chunk, native_numbers, \
    parse_prefix_ids, prefix_ids_problem
from sim.workload.config import MAX_NAME_CHARS
from sim.workload.native_typed import csv_chunk, jsonl_chunk, parquet_chunk
from sim.workload.rows import ImportOptions, RowReport
from sim.workload.textfiles import (check_named_once, csv_frame, csv_text_blocks, file_kind, jsonl_blocks, open_bytes,
                                    read_header)

if TYPE_CHECKING:
    import pandas as pd

TEXT_COLUMNS = ("model", "slo_class", "prefix_ids")


def read_native(path: Path, options: ImportOptions, report: RowReport, rows: int) -> Iterator[RequestChunk]:
    """Chunks of a native trace file; each carries ``extra['line']`` (line or row numbers for errors).

    Each block is decoded from typed columns (:mod:`sim.workload.native_typed`)
    when it is well formed, else by pandas, which reports its bad rows.
    """
    kind = file_kind(path)
    if kind == "csv":
        with open_bytes(path) as handle:
            _check_columns(read_header(handle, path), path, "header")
        for names, data, lines in csv_text_blocks(path, rows, report):
            chunk = csv_chunk(data, names, lines)
            yield chunk if chunk is not None else decode_native(csv_frame(data, names, TEXT_COLUMNS), lines, report,
                                                                prefix_text=True)
    elif kind == "jsonl":
        yield from _read_jsonl(path, report, rows)
    else:
        yield from _read_parquet(path, report, rows)


def _check_columns(names, path: Path, where: str) -> None:
    check_named_once(list(names), path, where)
    unknown = [name for name in names if name not in NATIVE_COLUMNS]
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if unknown or missing:
        problem = f"unknown column {cut(unknown[0])!r}" if unknown else f"missing column {missing[0]!r}"
        raise MmsimError(f"{problem} in the {where}; native columns are {', '.join(NATIVE_COLUMNS)} "
                         "(another format? see mmsim trace formats)", source=str(path))


def _read_jsonl(path: Path, report: RowReport, rows: int) -> Iterator[RequestChunk]:
    allowed: set[str] | None = None
    for records, lines in jsonl_blocks(path, rows, report):
        if allowed is None:
            _check_columns(list(records[0]), path, "first line")
            allowed = set(records[0])
            names = [name for name in NATIVE_COLUMNS if name in allowed]
        if not allowed.issuperset(chain.from_iterable(records)):
            keep = np.ones(len(records), dtype=bool)
            for index, record in enumerate(records):
                surplus = record.keys() - allowed
                if surplus:
                    keep[index] = False
                    name = min(surplus)
                    report.reject(int(lines[index]), f"key {cut(name)!r} is not on the first line (the first line sets "
                                  "the columns)" if name in OPTIONAL_COLUMNS else
                                  f"unknown key {cut(name)!r}; native keys are {', '.join(NATIVE_COLUMNS)}")
            records, lines = [record for record, ok in zip(records, keep) if ok], lines[keep]
        if records:
            chunk = jsonl_chunk(records, names, lines)
            if chunk is None:
                import pandas as pd  # for a block the typed decoder cannot vouch for

                chunk = decode_native(pd.DataFrame.from_records(records).reindex(columns=names), lines, report,
                                      prefix_text=False, typed_cells=True)
            yield chunk


def _read_parquet(path: Path, report: RowReport, rows: int) -> Iterator[RequestChunk]:
    report.unit = "row"
    parquet = _open_parquet(path)
    schema = parquet.schema_arrow
    _check_columns(schema.names, path, "schema")
    _check_parquet_types(schema, path)
    # Labels are read dictionary-encoded: the typed decoder maps each distinct label once, not every row's.
    labels = [name for name in ("model", "slo_class") if name in schema.names]
    batches = _open_parquet(path, read_dictionary=labels).iter_batches(batch_size=rows)
    first = 1
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as error:
            raise MmsimError(f"damaged Parquet file ({cut(error)})", source=str(path)) from None
        if batch is None:
            return
        lines = np.arange(first, first + batch.num_rows, dtype=np.int64)
        first += batch.num_rows
        report.rows_read += batch.num_rows
        chunk = parquet_chunk(batch, lines)
        if chunk is None:
            # pandas gets the columns as the file holds them (labels decoded again): its messages are as before.
            written = pa.RecordBatch.from_arrays([batch.column(name).cast(schema.field(name).type)
                                                  for name in schema.names], schema=schema)
            chunk = decode_native(written.to_pandas(), lines, report, prefix_text=False)
        yield chunk


def _open_parquet(path: Path, **options) -> pq.ParquetFile:
    """The Parquet file at ``path`` (``options`` for :class:`pyarrow.parquet.ParquetFile`); a missing or unreadable
    file is a user error."""
    check_regular_file(path, "trace file")
    try:
        return pq.ParquetFile(path, **options)
    except FileNotFoundError:
        raise MmsimError("file not found", source=str(path)) from None
    except (pa.ArrowInvalid, OSError) as error:
        raise MmsimError(f"not a readable Parquet file ({cut(error)})", source=str(path)) from None


def _check_parquet_types(schema: pa.Schema, path: Path) -> None:
    """Numbers must be stored as numbers: a timestamp is not seconds, a boolean is not a token count."""
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "priority"):
        if name in schema.names:
            kind = schema.field(name).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                raise MmsimError(f"column {name} has type {kind}; expected a number"
                                 + (" of seconds (not a timestamp)" if name == "arrival_s" else ""), source=str(path))
    for name in ("model", "slo_class"):
        if name in schema.names and not (pa.types.is_string(schema.field(name).type)
                                         or pa.types.is_large_string(schema.field(name).type)
                                         or pa.types.is_dictionary(schema.field(name).type)):
            raise MmsimError(f"column {name} has type {schema.field(name).type}; expected text", source=str(path))


NUMBER_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "priority")


def decode_native(frame: pd.DataFrame, lines: np.ndarray, report: RowReport, *, prefix_text: bool,
                  typed_cells: bool = False) -> RequestChunk:
    """Check and convert one block of native rows parsed by pandas; malformed rows go to ``report``. With
    ``typed_cells`` (JSON) a number written as text (``"10"``) is a bad row, as it is in a scenario's YAML."""
    quoted = [_quoted_numbers(frame, name) for name in NUMBER_COLUMNS if typed_cells and name in frame]
    arrival_s, bad_arrival, why_arrival = native_numbers("arrival_s", frame["arrival_s"])
    prompt, bad_prompt, why_prompt = native_numbers("prompt_tokens", frame["prompt_tokens"])
    output, bad_output, why_output = native_numbers("output_tokens", frame["output_tokens"])
    model, bad_model = text_column(frame["model"])
    checks = [(bad_arrival, why_arrival), (bad_model, lambda i: "model is missing or not a name"),
              (bad_prompt, why_prompt), (bad_output, why_output)]
    optional = {}
    if "priority" in frame:
        priorities = frame["priority"]
        if priorities.dtype.kind not in "biuf":  # text cells (a str column refuses a number as its fill value)
            priorities = priorities.astype(object)
        priority, bad_priority, why_priority = native_numbers("priority", priorities.fillna(0))
        optional["priority"] = priority
        checks.append((bad_priority, why_priority))
    if "slo_class" in frame:
        classes = frame["slo_class"].to_numpy(dtype=object, na_value=None)
        bad_class = np.fromiter((not (value is None or isinstance(value, str)) for value in classes), bool, len(classes))
        long_class = np.fromiter((isinstance(value, str) and len(value) > MAX_NAME_CHARS for value in classes), bool,
                                 len(classes))
        optional["slo_class"] = np.array([value or None for value in classes], dtype=object)
        checks.append((bad_class, lambda i: "slo_class must be text"))
        checks.append((long_class, lambda i: f"slo_class {cut(classes[i])!r} is longer than {MAX_NAME_CHARS} "
                                             "characters (a class label)"))
    if "prefix_ids" in frame:
        cells = frame["prefix_ids"].to_numpy(dtype=object, na_value=None)
        parsed = [parse_prefix_ids(value, prefix_text) for value in cells]
        bad_prefix = np.fromiter((ids is False for ids in parsed), bool, len(parsed))
        prefix = np.empty(len(parsed), dtype=object)
        prefix[:] = [None if ids is False else ids for ids in parsed]
        optional["prefix_ids"] = prefix
        checks.append((bad_prefix, lambda i: prefix_ids_problem(
            cells[i], prefix_text, "prefix_ids", "prefix_ids must be whole numbers (space-separated in CSV, a list "
            "in JSON)")))
    keep = report.check(lines, [check for check in quoted if check is not None] + checks)
    return make_chunk(arrival_s[keep], model[keep], prompt[keep], output[keep],
                      **{name: values[keep] for name, values in optional.items()}, extra={"line": lines[keep]})


def _quoted_numbers(frame: pd.DataFrame, name: str):
    """(mask, reason) for the rows whose ``name`` is text where JSON has numbers, or None when no row's is."""
    values = frame[name].to_numpy(dtype=object)
    mask = np.fromiter((isinstance(value, str) for value in values), bool, len(values))
    if not mask.any():
        return None
    return mask, lambda i: f"{name} {cut(values[i])!r} is text; write a JSON number (no quotes)"


def text_column(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(stripped names as an object array, mask of rows that are missing, empty or not text)."""
    import pandas as pd  # a pandas column: only blocks parsed by pandas get here

    if pd.api.types.is_string_dtype(values) and values.dtype != object:
        stripped = values.str.strip()
        bad = (stripped.isna() | (stripped == "")).to_numpy(dtype=bool)
        return stripped.to_numpy(dtype=object, na_value=""), bad
    raw = values.to_numpy(dtype=object, na_value=None)
    bad = np.fromiter((not (isinstance(name, str) and name.strip()) for name in raw), bool, len(raw))
    return np.array([name.strip() if ok else "" for name, ok in zip(raw, ~bad)], dtype=object), bad
