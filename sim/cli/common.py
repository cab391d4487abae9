"""Helpers shared by command modules: JSON output and tables."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

console = Console()


def print_json(data: object) -> None:
    """Plain JSON on stdout (no colour codes), so it pipes into jq and tests."""
    print(json.dumps(data, indent=2, default=float))


def table(title: str, columns: list[str], rows: Sequence[Sequence[object]]) -> Table:
    result = Table(title=title, title_justify="left")
    for column in columns:
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*(str(cell) for cell in row))
    return result
