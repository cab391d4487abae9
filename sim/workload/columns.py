"""Column-level helpers for :class:`RequestChunk`: the native columns' rules, optional columns, slicing and joining.

Optional columns (``priority``, ``slo_class``, ``prefix_ids``) are ``None`` on a
chunk whose source has no such column. When chunks with different optional
columns are joined, the missing values take the defaults below.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from sim.files import cut
from sim.workload.chunk import RequestChunk
from sim.workload.config import MAX_PREFIX_ID
from sim.workload.rows import MAX_PRIORITY, LongInteger, finite_numbers, whole_numbers

REQUIRED_COLUMNS = ("arrival_s", "model", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("priority", "slo_class", "prefix_ids")
NATIVE_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS


def native_numbers(name: str, values):
    """(values, bad mask, reason) for a native number column: arrival times finite and >= 0, token counts whole
    from 1 to ``MAX_LENGTH_TOKENS``, priorities whole and >= 0 (gaps in priority already filled with 0)."""
    if name == "arrival_s":
        return finite_numbers(values, name, minimum=0.0)
    if name == "priority":
        return whole_numbers(values, name, minimum=0, maximum=MAX_PRIORITY)
    return whole_numbers(values, name)


def parse_prefix_ids(value, text: bool):
    """A tuple of ints, None when absent or empty, or False when malformed (:func:`prefix_ids_problem` says how).

    CSV cells hold space-separated ids; JSON and Parquet hold lists of integers. Each id is a whole number from 0
    to ``MAX_PREFIX_ID`` (an int64, as Parquet stores it).
    """
    if value is None:
        return None
    items: Iterable[Any]
    convert: Callable[[Any], int]
    if text:
        if not isinstance(value, str):
            return False
        items, convert = value.split(), int
    else:
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            return False
        items, convert = value, _whole
    try:
        ids = tuple(map(convert, items))
    except (TypeError, ValueError):
        return False
    if ids and (min(ids) < 0 or max(ids) > MAX_PREFIX_ID):
        return False
    return ids or None


def prefix_ids_problem(value, text: bool, column: str, malformed: str) -> str:
    """Why :func:`parse_prefix_ids` refused ``value`` (a cell of ``column``): its first id past the range, named,
    else ``malformed``."""
    if text and isinstance(value, str):
        items: Iterable[Any] = value.split()
    elif not text and not isinstance(value, (str, bytes, dict)) and hasattr(value, "__iter__"):
        items = value
    else:
        return malformed
    for item in items:
        try:
            number = int(item) if text else _whole(item)
        except (TypeError, ValueError):
            digits = item[1:] if text and item[:1] in "+-" else item
            if not (isinstance(item, LongInteger) or text and digits.isdecimal()):
                return malformed
            shown, below = cut(item), str(item).startswith("-")  # more digits than Python turns into an int
        else:
            if 0 <= number <= MAX_PREFIX_ID:
                continue
            shown, below = cut(number), number < 0
        if below:
            return f"{column} id {shown} is less than 0 (ids are whole numbers from 0 to 2**63-1)"
        return f"{column} id {shown} is more than {MAX_PREFIX_ID:,} (2**63-1, the largest id)"
    return malformed


def _whole(value) -> int:
    """An id of a JSON or Parquet list; ``true`` is no number here as anywhere (``operator.index(True)`` is 1)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("a boolean is not a whole number")
    return operator.index(value)


def optional_columns(chunk: RequestChunk) -> tuple[str, ...]:
    """The optional columns this chunk carries, in canonical order."""
    return tuple(name for name in OPTIONAL_COLUMNS if getattr(chunk, name) is not None)


def default_column(name: str, rows: int) -> np.ndarray:
    """Values of an optional column for rows whose source lacks it (priority 0, no class, no prefix)."""
    if name == "priority":
        return np.zeros(rows, dtype=np.int64)
    return np.full(rows, None, dtype=object)


def make_chunk(arrival_s, model, prompt_tokens, output_tokens, *, priority=None, slo_class=None,
               prefix_ids=None, first_id: int = 0, extra: dict | None = None) -> RequestChunk:
    """A chunk with canonical dtypes: float64 seconds, object model names, int64 lengths and priority."""
    return RequestChunk(
        arrival_s=np.asarray(arrival_s, dtype=np.float64),
        model=np.asarray(model, dtype=object),
        prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
        output_tokens=np.asarray(output_tokens, dtype=np.int64),
        priority=None if priority is None else np.asarray(priority, dtype=np.int64),
        slo_class=None if slo_class is None else np.asarray(slo_class, dtype=object),
        prefix_ids=None if prefix_ids is None else np.asarray(prefix_ids, dtype=object),
        first_id=first_id,
        extra=dict(extra or {}),
    )


def take(chunk: RequestChunk, index) -> RequestChunk:
    """The rows of ``chunk`` selected by ``index`` (a boolean mask, integer array or slice)."""
    def pick(values):
        return None if values is None else values[index]

    return RequestChunk(
        arrival_s=chunk.arrival_s[index], model=chunk.model[index],
        prompt_tokens=chunk.prompt_tokens[index], output_tokens=chunk.output_tokens[index],
        priority=pick(chunk.priority), slo_class=pick(chunk.slo_class), prefix_ids=pick(chunk.prefix_ids),
        first_id=chunk.first_id, extra={key: pick(value) for key, value in chunk.extra.items()},
    )


def concat(chunks: list[RequestChunk], optional: Iterable[str] | None = None) -> RequestChunk:
    """Join chunks row-wise; ``optional`` names the optional columns to keep (default: any chunk has)."""
    if optional is None:
        optional = {name for chunk in chunks for name in optional_columns(chunk)}
    optional = [name for name in OPTIONAL_COLUMNS if name in set(optional)]

    def column(name):
        parts = [getattr(chunk, name) for chunk in chunks]
        if name in OPTIONAL_COLUMNS:
            parts = [default_column(name, len(chunk)) if part is None else part for chunk, part in zip(chunks, parts)]
        return np.concatenate(parts) if parts else np.empty(0)

    extra_keys = set.intersection(*(set(chunk.extra) for chunk in chunks)) if chunks else set()
    return make_chunk(
        column("arrival_s"), column("model"), column("prompt_tokens"), column("output_tokens"),
        **{name: column(name) for name in optional},
        first_id=chunks[0].first_id if chunks else 0,
        extra={key: np.concatenate([chunk.extra[key] for chunk in chunks]) for key in sorted(extra_keys)},
    )

