"""Streaming CSV and JSONL reading in blocks of lines, keeping each row's line number.

Files are read as bytes a block of lines at a time, so a huge trace never sits
in memory whole; each block is parsed by pandas or pyarrow (CSV) or ``json`` (JSONL).
Lines with the wrong number of fields and JSON that does not parse are
reported to the :class:`RowReport` with their line numbers; blank lines are
ignored. CRLF line ends, a final line without newline, a UTF-8 byte-order mark
and gzip compression (``.gz``) are handled; a damaged or truncated ``.gz`` and
text that is not UTF-8 are errors naming the file (and line).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.errors import MmsimError
from sim.files import check_regular_file, cut
from sim.workload.rows import RowReport, json_integer

if TYPE_CHECKING:
    import pandas as pd

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
    if not path.strip():
        raise MmsimError("is empty; name a file (absolute, or relative to the scenario's folder)", field=field)
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        options = [candidate]
    else:
        options = ([Path(base_dir) / candidate] if base_dir is not None else []) + [Path.cwd() / candidate]
    for option in options:
        if os.path.exists(option):
            try:
                return check_regular_file(option, "input file")
            except MmsimError as error:
                raise MmsimError(f"{option}: {error.args[0]}", field=field) from None
    raise MmsimError(f"file {path!r} not found (looked in {', '.join(str(o.parent) for o in options)})", field=field)


def open_bytes(path: Path) -> io.BufferedIOBase:
    """The file opened for binary reading, decompressing ``.gz``; a missing or special file is a user error."""
    check_regular_file(path, "trace file")
    try:
        return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")
    except OSError as error:
        raise MmsimError(f"cannot read trace file ({error.strerror})", source=str(path)) from None


def read_lines(handle: io.BufferedIOBase, rows: int, path: Path) -> list[bytes]:
    """The next ``rows`` lines (fewer at the end); a damaged gzip stream is a user error naming the file."""
    try:
        return list(islice(handle, rows))
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as error:
        problem = "truncated" if isinstance(error, EOFError) else cut(str(error) or type(error).__name__)
        raise MmsimError(f"not a readable gzip file ({problem})", source=str(path)) from None


def _decode(raw: bytes, path: Path, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MmsimError("not UTF-8 text", source=str(path), field=f"line {number}") from None


def read_header(handle: io.BufferedIOBase, path: Path) -> list[str]:
    """Column names from the first line, each named once."""
    first = read_lines(handle, 1, path)
    if not first or not first[0].strip():
        raise MmsimError("empty file (expected a header line)", source=str(path))
    names = [cut(name.strip()) for name in _decode(first[0], path, 1).lstrip("\ufeff").rstrip("\r\n").split(",")]
    check_named_once(names, path, "header")
    return names


def check_named_once(names: list[str], path: Path, where: str) -> None:
    """A header or schema that names a column twice is an error: which of the two would a reader take?"""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise MmsimError(f"column {name!r} is named twice in the {where}; name each column once", source=str(path))
        seen.add(name)


def _undecodable(block: list[bytes], first_line: int, report: RowReport) -> np.ndarray:
    """Mask of the block's lines that are not UTF-8 (each reported); one check of the whole block when all are."""
    bad = np.zeros(len(block), dtype=bool)
    data = b"".join(block)
    if data.isascii():
        return bad
    try:
        data.decode("utf-8")
        return bad
    except UnicodeDecodeError:
        pass
    for index, line in enumerate(block):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad[index] = True
            report.rows_read += 1
            report.reject(first_line + index, "not UTF-8 text")
    return bad


def _screen(block: list[bytes], first_line: int, fields: int | None):
    """(joined bytes, line numbers, lines needing a closer look: maybe blank, a wrong field count or a quote
    left open).

    Vectorised over the block's bytes, so the common case costs no Python work per line.
    """
    data = b"".join(block)
    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buffer == ord("\n"))
    if len(ends) < len(block):
        ends = np.append(ends, len(buffer))
    starts = np.concatenate([[0], ends[:-1] + 1])

    def per_line(byte: str) -> np.ndarray:
        """How many times ``byte`` occurs on each line."""
        at = np.flatnonzero(buffer == ord(byte))
        return np.searchsorted(at, ends) - np.searchsorted(at, starts)

    suspect = ends - starts <= 2
    if fields is not None:
        suspect |= per_line(",") != fields - 1
    if b'"' in data:  # a quote left open would swallow every line after it into one field
        suspect |= per_line('"') % 2 == 1
    return data, np.arange(first_line, first_line + len(block), dtype=np.int64), suspect


def csv_blocks(path: Path, rows: int, report: RowReport, *, required: tuple[str, ...] = (),
               text_columns: tuple[str, ...] = ()) -> Iterator[tuple[list[str], pd.DataFrame, np.ndarray]]:
    """Yield (header, block, line numbers) for a CSV file with a header line, ``rows`` lines at a time.

    A column in ``required`` missing from the header is an error. Columns in
    ``text_columns`` stay strings ("NA" too); empty cells are NaN.
    """
    for names, data, numbers in csv_text_blocks(path, rows, report, required=required):
        yield names, csv_frame(data, names, text_columns), numbers


def csv_frame(data: bytes, names: list[str], text_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """A block of CSV lines (no header) parsed by pandas; ``text_columns`` stay strings, empty cells are NaN."""
    import pandas as pd  # here, not at the top: well-formed native CSV blocks are parsed without it

    dtypes = {name: str for name in text_columns if name in names}
    return pd.read_csv(io.BytesIO(data), header=None, names=names, dtype=dtypes, keep_default_na=False,
                       na_values=[""], encoding="utf-8")


def csv_text_blocks(path: Path, rows: int, report: RowReport, *,
                    required: tuple[str, ...] = ()) -> Iterator[tuple[list[str], bytes, np.ndarray]]:
    """Yield (header, lines, line numbers) for a CSV file with a header line, ``rows`` lines at a time.

    The lines (joined bytes) are the block's well-shaped ones: blank lines are
    left out, and lines that are not UTF-8 or have the wrong number of fields are
    reported. A column in ``required`` missing from the header is an error.
    """
    with open_bytes(path) as handle:
        names = read_header(handle, path)
        missing = [name for name in required if name not in names]
        if missing:
            raise MmsimError(f"missing column {missing[0]!r}; the header has {','.join(names)} "
                             f"but {','.join(required)} are needed", source=str(path), field="line 1")
        line = 2
        while block := read_lines(handle, rows, path):
            undecodable = _undecodable(block, line, report)
            if undecodable.any():
                block = [text if not bad else b"\n" for text, bad in zip(block, undecodable)]
            data, numbers, suspect = _screen(block, line, len(names))
            line += len(block)
            if suspect.any():
                keep = np.ones(len(block), dtype=bool)
                for index in np.flatnonzero(suspect):
                    problem = _csv_problem(block[index], names, path, int(numbers[index]))
                    if problem is None:
                        continue
                    keep[index] = False
                    if problem:
                        report.rows_read += 1
                        report.reject(int(numbers[index]), problem)
                block = [text if text.endswith(b"\n") else text + b"\n" for text, ok in zip(block, keep) if ok]
                data, numbers = b"".join(block), numbers[keep]
            if len(numbers):
                report.rows_read += len(numbers)
                yield names, data, numbers


def _csv_problem(raw: bytes, names: list[str], path: Path, line: int) -> str | None:
    """None for a good line, "" for a blank one (skipped), else what is wrong with it."""
    text = raw.rstrip(b"\r\n")
    if not text.strip():
        return ""
    if text.count(b'"') % 2:  # quotes inside a quoted field are doubled: a whole line holds an even number
        return ('a quote (") is opened and never closed on its line (a quoted field spanning lines, with a newline '
                'inside the quotes, is not supported: each row must be one line)')
    fields = text.count(b",") + 1
    if fields != len(names) and b'"' in text:
        fields = len(next(csv.reader([_decode(text, path, line)])))
    if fields == len(names):
        return None
    return f"expected {len(names)} fields ({','.join(names)}), found {fields}"


def jsonl_blocks(path: Path, rows: int, report: RowReport) -> Iterator[tuple[list[dict], np.ndarray]]:
    """Yield (records, line numbers) for a JSONL file, ``rows`` lines at a time; each line must be an object.

    A block is parsed as one JSON array (fast); if that fails or does not give
    one object per line, its lines are parsed one by one to find the bad ones.
    """
    with open_bytes(path) as handle:
        line = 1
        empty = True
        while block := read_lines(handle, rows, path):
            _, numbers, blank = _screen(block, line, None)
            line += len(block)
            if blank.any():
                blank[blank] = [not block[index].strip() for index in np.flatnonzero(blank)]
                block = [text for text, skip in zip(block, blank) if not skip]
                numbers = numbers[~blank]
            if not block:
                continue
            empty = False
            report.rows_read += len(block)
            joined = b",".join(block)
            try:
                records = json.loads(b"[" + joined + b"]")
            except (ValueError, RecursionError):  # bad JSON, or an integer of more than 4,300 digits
                records = None
            if records is None or len(records) != len(block) or not all(type(r) is dict for r in records):
                records, numbers = _jsonl_lines(block, numbers, report)  # checks each line's keys too
            elif _key_colons(joined) > sum(map(len, records)):
                records, numbers = _drop_keys_twice(block, records, numbers, report)
            if b"\\ud" in joined or b"\\uD" in joined:
                records, numbers = _drop_surrogates(records, numbers, report)
            if records:
                yield records, numbers
    if empty:
        raise MmsimError("empty file (expected one JSON object per line)", source=str(path))


def _drop_surrogates(records: list[dict], numbers: np.ndarray, report: RowReport) -> tuple[list[dict], np.ndarray]:
    """Records whose text is valid Unicode; a lone surrogate escape (``\\udc80``) makes a text no file can hold."""
    keep = np.ones(len(records), dtype=bool)
    for index, record in enumerate(records):
        for value in (*record.keys(), *record.values()):
            if isinstance(value, str) and not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    keep[index] = False
                    report.reject(int(numbers[index]), "text holds a lone surrogate (an unpaired \\ud800-\\udfff escape)")
                    break
    return [record for record, ok in zip(records, keep) if ok], numbers[keep]


def _key_twice(raw: bytes) -> str | None:
    """The first key an object of this JSON line gives twice (json keeps the last silently), or None."""
    twice: list[str] = []

    def pairs_to_dict(pairs: list) -> dict:
        record = dict(pairs)
        if len(record) != len(pairs) and not twice:
            seen: set = set()
            for key, _ in pairs:
                if key in seen:
                    twice.append(key)
                    break
                seen.add(key)
        return record

    json.loads(raw, object_pairs_hook=pairs_to_dict, parse_int=json_integer)
    return twice[0] if twice else None


_KEY_COLON = re.compile(rb'"[ \t\r]*:')
"""A key's closing quote and its colon, however spaced (the whitespace JSON allows within a line)."""


def _key_colons(text: bytes) -> int:
    """How many quote-and-colon pairs ``text`` holds: at least one per key of its objects, so text holding no more
    than its objects have keys names none twice (more: a key given twice, or such a pair inside a text). Written
    compactly or as ``json.dumps`` writes, counted by a plain count."""
    if b'" ' in text or b'"\t' in text or b'"\r' in text:
        return len(_KEY_COLON.findall(text))
    return text.count(b'":')


def _twice_problem(raw: bytes, record: dict) -> str | None:
    """Why a parsed line is bad for naming a key twice; counting its keys' colons first keeps the usual line from a
    second parse."""
    if _key_colons(raw) <= len(record):
        return None
    name = _key_twice(raw)
    return None if name is None else f"key {cut(name)!r} given twice; keep one"


def _drop_keys_twice(block: list[bytes], records: list[dict], numbers: np.ndarray,
                     report: RowReport) -> tuple[list[dict], np.ndarray]:
    """The records of a block parsed whole, less those whose line names a key twice (counted or an error)."""
    keep = np.ones(len(records), dtype=bool)
    for index, (raw, record) in enumerate(zip(block, records)):
        problem = _twice_problem(raw, record)
        if problem is not None:
            keep[index] = False
            report.reject(int(numbers[index]), problem)
    return [record for record, ok in zip(records, keep) if ok], numbers[keep]


def _jsonl_lines(block: list[bytes], numbers: np.ndarray, report: RowReport) -> tuple[list[dict], np.ndarray]:
    """Parse line by line; bad lines go to ``report``. An integer of more digits than Python converts is kept as a
    :class:`~sim.workload.rows.LongInteger`, for the column's check to name."""
    records, kept = [], []
    for raw, line in zip(block, numbers):
        try:
            record = json.loads(raw, parse_int=json_integer)
            problem = _twice_problem(raw, record) if isinstance(record, dict) else "expected one JSON object per line"
        except RecursionError:
            problem = "not valid JSON (nested too deeply)"
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            problem = f"not valid JSON ({cut(getattr(error, 'msg', None) or error)})"
        if problem is None:
            records.append(record)
            kept.append(line)
        else:
            report.reject(int(line), problem)
    return records, np.asarray(kept, dtype=np.int64)
