"""Streaming CSV and JSONL reading in blocks of lines, keeping each row's line number.

Files are read as bytes a block of lines at a time, so a huge trace never sits
in memory whole; each block is parsed by pandas (CSV) or ``json`` (JSONL).
Lines with the wrong number of fields and JSON that does not parse are
reported to the :class:`RowReport` with their line numbers; blank lines are
ignored. CRLF line ends, a final line without newline, a UTF-8 byte-order mark
and gzip compression (``.gz``) are handled.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd

from sim.errors import MmsimError
from sim.workload.rows import RowReport

TRACE_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}


def file_kind(path: Path) -> str:
    """``csv``, ``jsonl`` or ``parquet`` from the file name (a ``.gz`` suffix is looked through)."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    kind = TRACE_SUFFIXES.get(suffixes[-1]) if suffixes else None
    if kind is None:
        raise MmsimError(f"cannot tell the trace format from the name; use one of {', '.join(TRACE_SUFFIXES)}",
                         source=str(path))
    return kind


def resolve_input(path: str, base_dir: Path | None, field: str) -> Path:
    """An input file named in a config: absolute, or relative to ``base_dir``, else to the current folder."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        options = [candidate]
    else:
        options = ([Path(base_dir) / candidate] if base_dir is not None else []) + [Path.cwd() / candidate]
    for option in options:
        if option.is_file():
            return option
    raise MmsimError(f"file {path!r} not found (looked in {', '.join(str(o.parent) for o in options)})", field=field)


def open_bytes(path: Path) -> BinaryIO:
    """The file opened for binary reading, decompressing ``.gz``; a missing file is a user error."""
    try:
        return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")
    except FileNotFoundError:
        raise MmsimError("file not found", source=str(path)) from None
    except IsADirectoryError:
        raise MmsimError("is a directory, not a trace file", source=str(path)) from None


def _decode(raw: bytes, path: Path, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MmsimError("not UTF-8 text", source=str(path), field=f"line {number}") from None


def read_header(handle: BinaryIO, path: Path) -> list[str]:
    """Column names from the first line."""
    first = handle.readline()
    if not first.strip():
        raise MmsimError("empty file (expected a header line)", source=str(path))
    return [name.strip() for name in _decode(first, path, 1).lstrip("\ufeff").rstrip("\r\n").split(",")]


def csv_blocks(path: Path, rows: int, report: RowReport, *, required: tuple[str, ...] = (),
               text_columns: tuple[str, ...] = ()) -> Iterator[tuple[list[str], pd.DataFrame, np.ndarray]]:
    """Yield (header, block, line numbers) for a CSV file with a header line, ``rows`` lines at a time.

    A column in ``required`` missing from the header is an error. Columns in
    ``text_columns`` stay strings ("NA" too); empty cells are NaN.
    """
    with open_bytes(path) as handle:
        names = read_header(handle, path)
        missing = [name for name in required if name not in names]
        if missing:
            raise MmsimError(f"missing column {missing[0]!r}; the header has {','.join(names)} "
                             f"but {','.join(required)} are needed", source=str(path), field="line 1")
        line = 1
        dtypes = {name: str for name in text_columns if name in names}
        while block := list(islice(handle, rows)):
            kept, numbers = [], []
            for line, raw in enumerate(block, start=line + 1):
                text = raw.rstrip(b"\r\n")
                if not text.strip():
                    continue
                fields = text.count(b",") + 1
                if fields != len(names) and b'"' in text:
                    fields = len(next(csv.reader([_decode(text, path, line)])))
                if fields != len(names):
                    report.rows_read += 1
                    report.reject(line, f"expected {len(names)} fields ({','.join(names)}), found {fields}")
                    continue
                kept.append(text)
                numbers.append(line)
            if not kept:
                continue
            report.rows_read += len(kept)
            frame = pd.read_csv(io.BytesIO(b"\n".join(kept)), header=None, names=names, dtype=dtypes,
                                keep_default_na=False, na_values=[""], encoding="utf-8")
            yield names, frame, np.asarray(numbers, dtype=np.int64)


def jsonl_blocks(path: Path, rows: int, report: RowReport) -> Iterator[tuple[list[dict], np.ndarray]]:
    """Yield (records, line numbers) for a JSONL file, ``rows`` lines at a time; each line must be an object."""
    with open_bytes(path) as handle:
        line = 0
        while block := list(islice(handle, rows)):
            records, numbers = [], []
            for line, raw in enumerate(block, start=line + 1):
                if not raw.strip():
                    continue
                report.rows_read += 1
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as error:
                    report.reject(line, f"not valid JSON ({error.msg if hasattr(error, 'msg') else error})")
                    continue
                if not isinstance(record, dict):
                    report.reject(line, "expected a JSON object per line")
                    continue
                records.append(record)
                numbers.append(line)
            if records:
                yield records, np.asarray(numbers, dtype=np.int64)
