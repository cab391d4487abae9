"""What every trace reader shares: import options, the row report, and vectorised column checks.

A malformed row is dropped and noted in the :class:`RowReport`: with ``skip_bad`` counted (the CLI prints the
count), else the earliest one noted is the error, naming the file and line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.errors import MmsimError
from sim.files import counted, cut
from sim.workload.config import MAX_LENGTH_TOKENS, MAX_TIME_S, Arrivals

MAX_PRIORITY = 1 << 40
"""Priorities above this are surely corrupt (and would overflow the policies' sort keys)."""


@dataclass(frozen=True)
class ImportOptions:
    """How to turn a source trace into native requests.

    ``model`` names the one model of a single-model trace (or overrides a trace's
    model column); ``model_map`` maps a trace's model labels to deployment names.
    ``start_s``/``end_s`` keep the window [start, end) in seconds after the trace's
    first request (native traces: after time 0); the window start becomes time 0 and
    inter-arrival times are then multiplied by ``time_scale``. ``arrivals`` and
    ``seed`` give length-pair files (which have no times) their arrival process;
    ``base_dir`` resolves file paths inside ``arrivals``. With ``served_models``,
    output model names must be among those (a scenario's deployments, aliases and
    config-file models included); without, any label passes: a trace names
    deployments, which only a scenario defines.
    """

    model: str | None = None
    model_map: dict[str, str] | None = None
    time_scale: float = 1.0
    start_s: float | None = None
    end_s: float | None = None
    skip_bad: bool = False
    arrivals: Arrivals | None = None
    seed: int = 0
    base_dir: str | None = None
    served_models: frozenset[str] | None = None


@dataclass
class RowReport:
    """Counts what happened to the rows of one source file while it was read."""

    source: str
    unit: str = "line"
    rows_read: int = 0
    rows_out: int = 0
    bad_rows: int = 0
    first_bad: str | None = None
    first_bad_number: int | None = None
    first_bad_reason: str | None = None
    dropped: dict[str, int] = field(default_factory=dict)

    def where(self, number: int) -> str:
        """How messages name row ``number`` ("line 5" in text files, "row 5" in Parquet)."""
        return f"{self.unit} {number}"

    def reject(self, number: int, reason: str) -> None:
        """One malformed row, noted and counted."""
        self.bad_rows += 1
        self._note_first(number, reason)

    def check(self, numbers: np.ndarray, checks: Sequence[tuple[np.ndarray, Callable[[int], str]]]) -> np.ndarray:
        """Apply vectorised row checks; returns the mask of rows to keep.

        Each check is (bad-row mask, reason for row i); the earliest bad row is noted with the reason of the
        first check it fails.
        """
        bad = np.zeros(len(numbers), dtype=bool)
        for mask, _ in checks:
            bad |= mask
        if not bad.any():
            return ~bad
        first = int(np.flatnonzero(bad)[0])
        reason = next(describe(first) for mask, describe in checks if mask[first])
        self.bad_rows += int(bad.sum())
        self._note_first(int(numbers[first]), reason)
        return ~bad

    def _note_first(self, number: int, reason: str) -> None:
        """Keep the earliest bad row in the file: the checks run column by column, not in row order."""
        if self.first_bad_number is None or number < self.first_bad_number:
            self.first_bad_number = number
            self.first_bad_reason = reason
            self.first_bad = f"{self.where(number)}: {reason}"

    def raise_first_bad(self) -> None:
        """End a strict read at the earliest bad row noted so far (rows are checked stage by stage, each stage
        over a chunk, so the first stage to find a bad row need not have found the earliest)."""
        if self.first_bad_number is not None:
            raise MmsimError(self.first_bad_reason or "", source=self.source, field=self.where(self.first_bad_number))

    def drop(self, reason: str, count: int) -> None:
        """Rows removed on purpose (e.g. failed requests), counted by reason."""
        if count:
            self.dropped[reason] = self.dropped.get(reason, 0) + int(count)

    def counts(self) -> dict:
        """Rows read, requests given, and the malformed rows ``skip_bad`` dropped with the first of them."""
        return {"rows_read": self.rows_read, "requests": self.rows_out, "skipped_malformed": self.bad_rows,
                "first_skipped": self.first_bad}

    def summary(self) -> str:
        """One line: rows written, then any malformed and dropped rows."""
        parts = [f"{counted(self.rows_out, 'request')} from {counted(self.rows_read, 'row')}"]
        if self.bad_rows:
            parts.append(f"skipped {counted(self.bad_rows, 'malformed row')} (first: {self.first_bad})")
        parts.extend(f"dropped {count} {reason}" for reason, count in self.dropped.items())
        return "; ".join(parts)


MAX_FLOAT_INT = int(np.finfo(np.float64).max)
"""The largest integer a float64 holds; a larger one cannot be a time or a token count anyway."""


class LongInteger:
    """A JSON integer of more digits than Python turns into an int (4,300: ``sys.get_int_max_str_digits``), kept
    as its text. Every check refuses it as past its range (as it does an integer past float64's), naming it; a JSON
    reader gets one from :func:`json_integer` instead of the ``ValueError`` that would end the command."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def json_integer(text: str) -> int | LongInteger:
    """``parse_int`` for :func:`json.loads`: the integer, or a :class:`LongInteger` past Python's digit limit."""
    try:
        return int(text)
    except ValueError:
        return LongInteger(text)


def as_numbers(values) -> np.ndarray:
    """Float64 values of a column; anything that is not a number (a boolean, a date) becomes NaN."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return values.astype(np.float64)  # typed columns (read by pyarrow) need no pandas
    import pandas as pd  # only trace files parsed by pandas get here; a generated workload never imports it

    series = values if isinstance(values, pd.Series) else pd.Series(values, dtype=object)
    if pd.api.types.is_bool_dtype(series) or not (pd.api.types.is_numeric_dtype(series)
                                                  or pd.api.types.is_object_dtype(series)
                                                  or pd.api.types.is_string_dtype(series)):
        return np.full(len(series), np.nan)
    if series.dtype == object:
        # Booleans are not numbers; nor, here, is an integer past float64's range (JSON has no limit on them).
        series = series.map(lambda value: np.nan if isinstance(value, (bool, np.bool_, LongInteger))
                            or isinstance(value, int) and abs(value) > MAX_FLOAT_INT else value)
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def whole_numbers(values, column: str, minimum: int = 1, maximum: int = MAX_LENGTH_TOKENS):
    """(int64 values, bad mask, reason) for a column of whole numbers from ``minimum`` to ``maximum`` (by default
    a token count: a scenario's lengths have the same bound)."""
    numbers = as_numbers(values)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(numbers) | (numbers < minimum) | (numbers != np.floor(numbers)) | (numbers > maximum)
    ints = np.where(bad, minimum, numbers).astype(np.int64)

    def reason(i: int) -> str:
        whole = np.isfinite(numbers[i]) and numbers[i] == np.floor(numbers[i])
        cell = _cell(values, i)
        if isinstance(cell, LongInteger):  # more digits than an int takes: a whole number, far out of range
            return f"{column} {_show(values, i)} is " + (f"less than {minimum}" if cell.text.startswith("-")
                                                         else f"more than {maximum:,}")
        if whole and numbers[i] > maximum:
            return f"{column} {_show(values, i)} is more than {maximum:,}"
        if whole:
            return f"{column} {_show(values, i)} is less than {minimum}"
        return f"{column} {_show(values, i)} is not a whole number >= {minimum}"

    return ints, bad, reason


def finite_numbers(values, column: str, minimum: float | None = None, maximum: float = MAX_TIME_S):
    """(float64 values, bad mask, reason) for a column of finite numbers (>= ``minimum`` if given, <= ``maximum``)."""
    numbers = as_numbers(values)
    bad = ~np.isfinite(numbers)
    with np.errstate(invalid="ignore"):
        bad |= np.abs(numbers) > maximum
        if minimum is not None:
            bad |= numbers < minimum
    limit = f" from {minimum:g} to {maximum:g}" if minimum is not None else f" of at most {maximum:g}"
    return np.where(bad, 0.0, numbers), bad, lambda i: f"{column} {_show(values, i)} is not a number{limit}"


def _cell(values, i: int):
    """Row ``i`` of a column: a pandas Series, or a sequence."""
    return values.iloc[i] if hasattr(values, "iloc") else values[i]


def _show(values, i: int) -> str:
    """Row ``i`` of a column as the user wrote it, for error messages."""
    value = _cell(values, i)
    if value is None or isinstance(value, float) and np.isnan(value):
        return "(missing)"
    if isinstance(value, (float, np.floating)) and float(value).is_integer() and abs(float(value)) < 2**53:
        return str(int(value))  # a column with a gap is read as floats: -1 was written, not -1.0
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"  # as the file wrote it, not Python's True
    return repr(cut(value)) if isinstance(value, str) else cut(value)
