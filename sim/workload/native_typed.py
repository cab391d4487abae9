"""Decoding well-formed blocks of a native trace from typed columns (pyarrow, numpy), without pandas.

Each decoder returns the block's :class:`RequestChunk`, the one the pandas
decoder (:func:`sim.workload.native.decode_native`) makes, when it can vouch
for every row: each cell has its column's type (a number, a text, a list of
whole numbers), no required cell is missing, every row passes the native checks
(:func:`sim.workload.columns.native_numbers`) and every model label is plain
(below). Otherwise it returns None and the block goes to the pandas decoder,
whose messages quote a bad cell as the user wrote it.

A plain label is ASCII and printable, with no space at either end: the pandas
decoder strips labels, with Arrow's idea of Unicode whitespace, which is not
Python's, so other labels are left to it. Arrow columns are read through their
buffers, because ``Array.to_numpy`` imports pandas.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

from sim.workload.chunk import RequestChunk
from sim.workload.columns import REQUIRED_COLUMNS, make_chunk, native_numbers, parse_prefix_ids
from sim.workload.config import MAX_NAME_CHARS, MAX_PREFIX_ID

LABELS = pa.dictionary(pa.int32(), pa.string())
CSV_TYPES = {"arrival_s": pa.float64(), "model": LABELS, "prompt_tokens": pa.float64(), "output_tokens": pa.float64(),
             "priority": pa.float64(), "slo_class": LABELS, "prefix_ids": pa.string()}
"""How Arrow parses each native CSV column; a cell that does not parse so sends its block to pandas. Numbers are
read as float64, as the checks convert them: Arrow's integer parser also reads hexadecimal ("0x1A"), pandas' not."""
NUMBERS = ("arrival_s", "prompt_tokens", "output_tokens", "priority")


def csv_chunk(data: bytes, names: list[str], lines: np.ndarray) -> RequestChunk | None:
    """The chunk of a block of native CSV lines (no header line; one line per row), or None."""
    # Quotes, NUL bytes and lone carriage returns are where the two CSV parsers could split or read cells differently.
    if (b'"' in data or b"\0" in data or b"\r" in data and data.count(b"\r") != data.count(b"\r\n")
            or len(set(names)) < len(names)):
        return None
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(
            io.BytesIO(data), read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
            convert_options=pacsv.ConvertOptions(column_types={name: CSV_TYPES[name] for name in names},
                                                 null_values=[""], strings_can_be_null=True))
    except pa.ArrowInvalid:
        return None
    if table.num_rows != len(lines):
        return None
    return _checked({name: table.column(name).chunks for name in names}, lines, prefix_text=True)


def parquet_chunk(batch: pa.RecordBatch, lines: np.ndarray) -> RequestChunk | None:
    """The chunk of a batch of native Parquet rows (labels read dictionary-encoded), or None."""
    return _checked({name: [batch.column(name)] for name in batch.schema.names}, lines, prefix_text=False)


def jsonl_chunk(records: list[dict], names: list[str], lines: np.ndarray) -> RequestChunk | None:
    """The chunk of a block of native JSONL records whose keys are among ``names``, or None."""
    values: dict[str, np.ndarray] = {}
    for name in names:
        cells = [record.get(name) for record in records]
        kinds = set(map(type, cells))
        if name == "priority" and type(None) in kinds:
            cells, kinds = [0 if cell is None else cell for cell in cells], kinds - {type(None)}
        if name in NUMBERS:
            column = _json_numbers(cells) if kinds <= {int, float} else None
        elif name == "model":
            column = np.array(cells, dtype=object) if kinds == {str} and all(map(_plain, set(cells))) else None
        elif name == "slo_class":
            column = np.array([cell or None for cell in cells], dtype=object) if kinds <= {str, type(None)} \
                and not any(len(cell) > MAX_NAME_CHARS for cell in set(cells) if cell is not None) else None
        else:
            column = _id_tuples([parse_prefix_ids(cell, text=False) for cell in cells])
        if column is None:
            return None
        values[name] = column
    return _chunk(values, lines)


def _json_numbers(cells: list) -> np.ndarray | None:
    """JSON numbers as float64 (as pandas converts them); None for an integer past float64's range."""
    try:
        return np.array(cells, dtype=np.float64)
    except OverflowError:
        return None


def _checked(columns: dict[str, list[pa.Array]], lines: np.ndarray, prefix_text: bool) -> RequestChunk | None:
    """The chunk from Arrow columns (each as its list of arrays), or None when a column is not as expected."""
    values: dict[str, np.ndarray] = {}
    for name, arrays in columns.items():
        if name in NUMBERS:
            column = _numbers(arrays, gap=0 if name == "priority" else None)
        elif name == "model":
            column = _labels(arrays, lambda text: text if _plain(text) else None, gaps=False)
        elif name == "slo_class":
            column = _labels(arrays, lambda text: text or None, gaps=True, longest=MAX_NAME_CHARS)
        elif prefix_text:
            column = _id_tuples([parse_prefix_ids(cell, text=True) for array in arrays for cell in array.to_pylist()])
        else:
            column = _id_lists(arrays)
        if column is None:
            return None
        values[name] = column
    return _chunk(values, lines)


def _chunk(values: dict[str, np.ndarray], lines: np.ndarray) -> RequestChunk | None:
    """The chunk when every row passes the native checks, else None (the pandas decoder then reports the rows)."""
    checked = {}
    for name, column in values.items():
        if name in NUMBERS:
            column, bad, _ = native_numbers(name, column)
            if bad.any():
                return None
        checked[name] = column
    return make_chunk(*(checked[name] for name in REQUIRED_COLUMNS), priority=checked.get("priority"),
                      slo_class=checked.get("slo_class"), prefix_ids=checked.get("prefix_ids"), extra={"line": lines})


def _plain(text) -> bool:
    """Whether a model label reads the same to every decoder: ASCII, printable, no space at either end, not empty."""
    return isinstance(text, str) and text != "" and text.isascii() and text.isprintable() and text == text.strip()


def _numbers(arrays: list[pa.Array], gap: float | None) -> np.ndarray | None:
    """A column of numbers; None for another type, or for gaps (nulls) unless ``gap`` fills them."""
    if not arrays or not (pa.types.is_integer(arrays[0].type) or pa.types.is_floating(arrays[0].type)):
        return None
    parts = []
    for array in arrays:
        values = _numpy(array)
        if array.null_count:
            if gap is None:
                return None
            values = np.where(_valid(array), values, gap)
        parts.append(values)
    return np.concatenate(parts)


def _labels(arrays: list[pa.Array], convert, gaps: bool, longest: int | None = None) -> np.ndarray | None:
    """A dictionary-encoded text column as an object array of ``convert(text)``, None for gaps; None for another
    type, for a text longer than ``longest`` characters, or (unless ``gaps``) for a gap or a text that converts to
    None.

    Each distinct text is converted once, then spread over the rows by its codes.
    """
    kind = arrays[0].type if arrays else None
    if kind is None or not pa.types.is_dictionary(kind) or not (pa.types.is_string(kind.value_type)
                                                                or pa.types.is_large_string(kind.value_type)):
        return None
    parts = []
    for array in arrays:
        texts = np.empty(len(array.dictionary) + 1, dtype=object)
        dictionary = array.dictionary.to_pylist()
        if longest is not None and any(len(text) > longest for text in dictionary if text is not None):
            return None
        texts[:-1] = [None if text is None else convert(text) for text in dictionary]
        if not gaps and (array.null_count or any(text is None for text in texts[:-1])):
            return None
        codes = _numpy(array.indices).astype(np.intp)
        if array.null_count:
            codes = np.where(_valid(array.indices), codes, len(texts) - 1)
        parts.append(texts[codes])
    return np.concatenate(parts)


def _id_lists(arrays: list[pa.Array]) -> np.ndarray | None:
    """A Parquet column of lists of whole numbers as tuples (None for a gap or an empty list); None otherwise."""
    kind = arrays[0].type if arrays else None
    if kind is None or not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) \
            or not pa.types.is_integer(kind.value_type):
        return None
    tuples: list[tuple[int, ...] | None] = []
    for array in arrays:
        if not len(array):
            continue
        offsets = _numpy(array.offsets)
        ids = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if ids.null_count:
            return None
        numbers = _numpy(ids)
        if len(numbers) and (int(numbers.min()) < 0 or int(numbers.max()) > MAX_PREFIX_ID):  # uint64: past int64
            return None
        ids, bounds = numbers.tolist(), (offsets - offsets[0]).tolist()
        valid = _valid(array) if array.null_count else np.ones(len(array), dtype=bool)
        tuples.extend(tuple(ids[start:end]) or None if ok else None
                      for start, end, ok in zip(bounds[:-1], bounds[1:], valid.tolist()))
    return _id_tuples(tuples)


def _id_tuples(parsed: list) -> np.ndarray | None:
    """Parsed prefix ids as an object array of tuples and None; None when any was malformed (False)."""
    if any(ids is False for ids in parsed):
        return None
    column = np.empty(len(parsed), dtype=object)
    column[:] = parsed
    return column


def _numpy(array: pa.Array) -> np.ndarray:
    """The values of a fixed-width number array, as numpy sees its data buffer (nulls hold any value)."""
    kind = array.type
    code = "f" if pa.types.is_floating(kind) else "i" if pa.types.is_signed_integer(kind) else "u"
    values = np.frombuffer(array.buffers()[1], dtype=np.dtype(f"{code}{kind.bit_width // 8}"))
    return values[array.offset:array.offset + len(array)]


def _valid(array: pa.Array) -> np.ndarray:
    """Mask of the array's non-null values, from its validity bitmap."""
    bits = np.unpackbits(np.frombuffer(array.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[array.offset:array.offset + len(array)].astype(bool)
