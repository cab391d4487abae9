"""Helpers shared by command modules: JSON output and tables."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import typer
from rich.console import Console
from rich.table import Table

from sim.errors import MmsimError
from sim.files import cut

console = Console()


def print_json(data: object) -> None:
    """Plain JSON on stdout (no colour codes), so it pipes into jq and tests."""
    print(json.dumps(data, indent=2, default=float))


def table(title: str, columns: list[str], rows: Sequence[Sequence[object]]) -> Table:
    """A table whose text cells fold to the terminal's width; a column of short figures keeps them whole (a number
    broken over two lines reads as two numbers)."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths: list[int | None] = []
    for index in range(len(columns)):
        values = [row[index] for row in cells if index < len(row)]
        widths.append(max(map(len, values)) if values and all(_FIGURE.fullmatch(value) for value in values) else None)
    result = _table(title, columns, cells, widths)
    if any(widths) and not _fits(result):
        return _table(title, columns, cells, [None] * len(columns))  # whole figures would crop the right columns
    return result


def _fits(result: Table) -> bool:
    """Whether ``result`` renders within the console's width: its top border ends in its corner, not cropped."""
    probe = Console(width=console.width, color_system=None)
    with probe.capture() as captured:
        probe.print(result)
    top = next((line for line in captured.get().splitlines() if line.strip()), "")
    return top.rstrip().endswith("┓")


def _table(title: str, columns: list[str], cells: list[list[str]], min_widths: list[int | None]) -> Table:
    result = Table(title=title, title_justify="left")
    for column, width in zip(columns, min_widths):
        result.add_column(column, overflow="fold", min_width=width)
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
