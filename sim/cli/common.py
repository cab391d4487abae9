"""Helpers shared by command modules: JSON output and tables."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from sim.errors import MmsimError
from sim.files import cut

console = Console()


def print_json(data: object) -> None:
    """Plain JSON on stdout (no colour codes), so it pipes into jq and tests."""
    print(json.dumps(data, indent=2, default=float))


def table(title: str, columns: list[str], rows: Sequence[Sequence[object]]) -> Table:
    """A table whose cells keep to one line where the terminal's width allows (headers may fold), a column of
    short figures keeps them whole even where text must fold (a number broken over two lines reads as two
    numbers)."""
    cells = [[str(cell) for cell in row] for row in rows]
    longest, figures = [], []
    for index in range(len(columns)):
        values = [row[index] for row in cells if index < len(row)]
        width = max(map(len, values), default=0)
        longest.append(width if 0 < width <= WHOLE_CELL_CHARS else None)
        figures.append(width if values and all(_FIGURE.fullmatch(value) for value in values) else None)
    result = _table(title, columns, cells, figures)
    if _room_for(result, natural=True):
        return result
    # Else each column as wide as its longest cell, headers folding (in words where they have room), without
    # vertical rules (three characters a column narrower: on an 80-column terminal a sweep's ten columns fit).
    whole = _whole_cells(title, columns, cells, longest)
    if whole is not None:
        return whole
    if any(figures) and not _fits(result):
        return _table(title, columns, cells, [None] * len(columns))  # whole figures would crop the right columns
    return result


WHOLE_CELL_CHARS = 24
"""Cells up to this long are kept on one line when the table has room; longer text folds."""


def _whole_cells(title: str, columns: list[str], cells: list[list[str]], longest: list[int | None]) -> Table | None:
    """The table with every cell on one line, its spare width given to headers' longest words; None if it does not
    fit the console."""
    widths = list(longest)
    spare = console.width - _width(_table(title, columns, cells, widths, compact=True))
    if spare < 0:
        return None
    for index, header in enumerate(columns):
        width = widths[index]
        if width is not None:
            grow = min(max(max(map(len, header.split()), default=0) - width, 0), spare)
            widths[index], spare = width + grow, spare - grow
    return _table(title, columns, cells, widths, compact=True)


def _width(result: Table, natural: bool = False) -> int:
    """Characters ``result`` needs: its columns at their minimum widths, or (``natural``) with nothing folded."""
    probe = Console(width=10_000, color_system=None)  # a measurement is capped at the console's width
    measured = Measurement.get(probe, probe.options, result)
    return measured.maximum if natural else measured.minimum


def _room_for(result: Table, natural: bool = False) -> bool:
    return _width(result, natural) <= console.width


def _fits(result: Table) -> bool:
    """Whether ``result`` renders within the console's width: its top border ends in its corner, not cropped."""
    probe = Console(width=console.width, color_system=None)
    with probe.capture() as captured:
        probe.print(result)
    top = next((line for line in captured.get().splitlines() if line.strip()), "")
    return top.rstrip().endswith("┓")


def _table(title: str, columns: list[str], cells: list[list[str]], min_widths: list[int | None],
           compact: bool = False) -> Table:
    """The rich table; ``compact``: without vertical rules, each column capped at its minimum width, so that a
    header longer than its cells folds instead of widening the column."""
    result = (Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
              if compact else Table(title=title, title_justify="left"))
    for column, width in zip(columns, min_widths):
        result.add_column(column, overflow="fold", min_width=width, max_width=width if compact else None)
    for row in cells:
        result.add_row(*row)
    return result


# Options `run` and `compare` share: a scenario's overrides, read by sim.cli.run_cmds.load_with_overrides.
MODE_OPTION = typer.Option("fast", "--mode", help="fast (fast-forward) or exact (per-iteration reference)")
PROFILE_OPTION = typer.Option(None, "--profile", help="override the scenario's profile: a built-in name or a profile "
                              "JSON (e.g. one written by mmsim calibrate)")
AUTOSCALER_OPTION = typer.Option(None, "--autoscaler", help="override the scenario's autoscaler: none, utilisation, "
                                 "queue-depth, kv-utilisation, predictive or path/to/file.py:Class")
FORCE_OPTION = typer.Option(False, "--force", help="replace a finished run of another scenario, policy or seed "
                            "(the same run is made again in place without it)")


T = TypeVar("T")


def comma_list(text: str, flag: str, convert: Callable[[str], T], noun: str, expected: str, *,
               unique: bool = True) -> list[T]:
    """The entries of a comma-separated flag, stripped and converted. An empty entry (``a,,b``, a trailing comma)
    is refused, not dropped, and so (when ``unique``) is one given twice: either is usually a typo, and dropping
    or repeating it would silently run something else than what was asked. ``convert`` raises ValueError for a
    bad entry; ``expected`` says what the flag takes (``comma-separated policy names``)."""
    shown = repr(cut(text))
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise MmsimError(f"{flag} must name at least one {noun}, not {shown} (expected {expected})")
    if "" in parts:
        raise MmsimError(f"{flag}: empty entry in {shown} (expected {expected})")
    values = [_converted(part, convert, flag, expected) for part in parts]
    seen: set = set()
    for value in values if unique else ():
        if value in seen:
            raise MmsimError(f"{flag}: {value!r} is there twice in {shown} (give each {noun} once)")
        seen.add(value)
    return values


def _converted(part: str, convert: Callable[[str], T], flag: str, expected: str) -> T:
    try:
        return convert(part)
    except ValueError:
        raise MmsimError(f"{flag}: expected {expected}, not {cut(part)!r}") from None


def named(value: str | None, flag: str, expected: str) -> str | None:
    """A flag naming one thing (``--policy``, ``--autoscaler``, ``--profile``), refused when given empty: an empty
    name would fall back to the scenario's own without a word, or be looked up as a name nobody can have."""
    if value is not None and not value.strip():
        raise MmsimError(f"{flag}: needs {expected}")  # the value is blank: nothing to quote
    return value


_FIGURE = re.compile(r"[-+$]?[\d.,]{1,12}(e[-+]?\d+)?[%x×]?|-|—")
