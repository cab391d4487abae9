"""Helpers shared by command modules: JSON output and tables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from sim.errors import MmsimError

console = Console()
PAGE_START = b"<!DOCTYPE html"
"""How every HTML page mmsim writes begins (comparison, sweep and reproduction reports)."""


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


def check_page_target(path: Path, *, inputs: Iterable[Path] = (), folders: Iterable[Path] = (),
                      force: bool | None = None) -> Path:
    """An HTML page to write, checked before any work: writable, none of the command's inputs, and not replacing
    a file mmsim did not write. ``force`` is None for a command without --force."""
    from sim.files import check_output_file

    check_output_file(path)
    check_not_input(path, inputs, folders)
    check_replaceable(path, force)
    return path


def check_not_input(path: Path, inputs: Iterable[Path] = (), folders: Iterable[Path] = ()) -> None:
    """Refuse an output that is one of the command's input files or lies in one of its input folders: the page
    would replace what the command reads, and every later command on it would fail."""
    target = path.resolve()  # a symbolic link or a ../ spelling names the same file
    for source in inputs:
        if target == source.resolve() or (path.exists() and source.exists() and path.samefile(source)):
            raise MmsimError("the output is also an input of this command; give a new file for the page",
                             source=str(path))
    for folder in folders:
        if target.is_relative_to(folder.resolve()):
            raise MmsimError(f"the output lies inside the input folder {folder}, whose files the command reads; "
                             "give a file outside it", source=str(path))


def check_replaceable(path: Path, force: bool | None = None) -> None:
    """Refuse to replace an existing file that is not a page mmsim wrote (a scenario, a trace, a run's JSON):
    re-running a command onto its own earlier page still works."""
    if force or not path.is_file():
        return
    with path.open("rb") as handle:
        if handle.read(len(PAGE_START)) == PAGE_START:
            return
    remedy = "give another file, or --force to replace it" if force is False else "give another file or remove it"
    raise MmsimError(f"exists and is not an HTML page written by mmsim; {remedy}", source=str(path))


# Options `run` and `compare` share: a scenario's overrides, read by sim.cli.run_cmds.load_with_overrides.
MODE_OPTION = typer.Option("fast", "--mode", help="fast (fast-forward) or exact (per-iteration reference)")
PROFILE_OPTION = typer.Option(None, "--profile", help="override the scenario's profile: a built-in name or a profile "
                              "JSON (e.g. one written by mmsim calibrate)")
AUTOSCALER_OPTION = typer.Option(None, "--autoscaler", help="override the scenario's autoscaler: none, utilisation, "
                                 "queue-depth, kv-utilisation, predictive or path/to/file.py:Class")
FORCE_OPTION = typer.Option(False, "--force", help="replace a finished run of another scenario, policy or seed "
                            "(the same run is made again in place without it)")


_FIGURE = re.compile(r"[-+$]?[\d.,]{1,12}(e[-+]?\d+)?[%x×]?|-|—")
