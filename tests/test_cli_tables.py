"""The CLI's tables: whole figures where they fit, never a cropped table where they do not."""

from __future__ import annotations

import io

from rich.console import Console

from sim.cli import common
from sim.cli.sweep_cmds import axis_labels

COLUMNS = ["policy", "seed", "load", "duration_s", "SLO att.", "goodput req/s", "tok/s", "cost $", "$ / 1k req", "GPU-h"]
ROW = ["swap-aware", "1", "0.5", "120", "0.815", "0.678", "170.9", "0.2164", "1.2961", "0.271"]


def rendered(monkeypatch, width: int) -> list[str]:
    monkeypatch.setattr(common, "console", Console(width=width, file=io.StringIO(), color_system=None))
    out = Console(width=width, file=io.StringIO(), color_system=None)
    out.print(common.table("Sweep", COLUMNS, [ROW, ROW]))
    return [line.rstrip() for line in out.file.getvalue().splitlines()]


def test_figures_stay_whole_where_the_table_fits(monkeypatch):
    lines = rendered(monkeypatch, 110)
    assert lines[1].endswith("┓") and all(figure in "\n".join(lines) for figure in ROW)


def test_at_80_columns_a_sweeps_cells_stay_whole_without_vertical_rules(monkeypatch):
    """Boxed, the ten columns need 81 characters with every cell whole: rich folded "1.2961" into "1.296" and "1",
    and "swap-aware" into "swap-" and "aware". Without vertical rules they fit; only headers fold."""
    lines = rendered(monkeypatch, 80)
    assert all(len(line) <= 80 for line in lines)
    rows = [line.split() for line in lines if line.startswith("swap-aware")]
    assert rows == [ROW, ROW]


def test_a_table_too_wide_for_whole_cells_folds_them_rather_than_cropping(monkeypatch):
    # With every figure's width fixed, rich cut the table's right-hand columns (GPU-h lost).
    lines = rendered(monkeypatch, 60)
    assert lines[1].endswith("┓") and all(len(line) <= 60 for line in lines)
    assert all(line.endswith(("┃", "│", "┩", "┘", "┓")) for line in lines[1:])


def test_sweep_axis_labels_are_short_and_distinct():
    assert axis_labels(["policy.name", "seed", "workload.generator.duration_s"]) == ["policy", "seed", "duration_s"]
    assert axis_labels(["a.rate_per_s", "b.rate_per_s"]) == ["a.rate_per_s", "b.rate_per_s"]
