"""The progress bar every long command shows: a description, the bar, done of total and the time taken."""

from __future__ import annotations

from rich import get_console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)


def progress_bar(enabled: bool, *, eta: bool = False, transient: bool = False) -> Progress:
    """A bar over requests or runs (with ``eta``, the time left too). A ``transient`` bar is shown on a terminal
    only: elsewhere rich would leave an empty line where it stood, ahead of the command's output or error."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if eta:
        columns += [TextColumn("ETA"), TimeRemainingColumn()]
    shown = enabled and (get_console().is_terminal or not transient)
    return Progress(*columns, transient=transient, disable=not shown)
