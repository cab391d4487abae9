"""The report's table of SLO attainment by SLO class (shown only when the runs' requests have classes): one row per
class, a column per policy (best first, as the summary tables), each cell the share of the class's requests meeting
every limit they are held to, mean over seeds with its interval; then the requests without a class and, beyond
``TABLE_ROWS`` classes, one row for the rest."""

from __future__ import annotations

from html import escape
from typing import Callable

from sim.reports.data import RunData
from sim.reports.metrics import Column, best, estimate, get
from sim.reports.stats import MIN_SEEDS, no_interval_text
from sim.reports.tables import _cell
from sim.reports.verdict import ranking

TABLE_ROWS = 30
"""More classes than this and the table shows those with the most requests; one row sums up the rest."""


def has_classes(groups: dict[str, list[RunData]]) -> bool:
    """Whether any run's requests had SLO classes (its summary has per_slo_class)."""
    return any(run.summary.get("per_slo_class") for runs in groups.values() for run in runs)


def _met(figures: dict) -> int:
    """The requests of a class meeting their SLO: its attainment is that count over its requests."""
    return round(float(figures.get("slo_attainment") or 0.0) * int(figures["requests"]))


def _classes(runs: list[RunData]) -> tuple[list[str], list[str]]:
    """The labels shown (label order; beyond TABLE_ROWS those with the most requests over every run, ties the
    worst attainment first, then label order) and those left to the summing-up row."""
    totals: dict[str, list[int]] = {}
    for run in runs:
        for label, figures in (run.summary.get("per_slo_class") or {}).items():
            total = totals.setdefault(label, [0, 0])
            total[0] += int(figures["requests"])
            total[1] += _met(figures)
    labels = sorted(totals)
    if len(labels) <= TABLE_ROWS:
        return labels, []
    ranked = sorted(labels, key=lambda label: (-totals[label][0], totals[label][1] / max(1, totals[label][0])))
    return ranked[:TABLE_ROWS], ranked[TABLE_ROWS:]


def _pooled(labels: list[str], figure: str) -> Callable[[dict], float | None]:
    """A reader of a summary's requests (``figure`` "requests") or SLO attainment pooled over the classes ``labels``."""
    def read(summary: dict) -> float | None:
        classes = summary.get("per_slo_class") or {}
        requests = met = 0
        for label in labels:
            figures = classes.get(label)
            if figures:
                requests += int(figures["requests"])
                met += _met(figures)
        if figure == "requests":
            return float(requests) if classes else None
        return met / requests if requests else None
    return read


def _requests_cell(read: Callable[[dict], float | None], runs: list[RunData]) -> str:
    """The requests of a row per run: one number when every run had as many (a trace's requests are the same under
    every policy and seed), else their range."""
    counts = sorted({int(value) for value in (read(run.summary) for run in runs) if value is not None})
    if not counts:
        return '<td data-v="">–</td>'
    shown = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}–{counts[-1]:,}"
    return f'<td data-v="{counts[-1]}">{shown}</td>'


def _row(header: str, sort_key: str, column: Column, requests: Callable[[dict], float | None],
         groups: dict[str, list[RunData]], order: list[str]) -> str:
    estimates = {policy: estimate(column, groups[policy]) for policy in order}
    winners = best(column, estimates, set())
    runs = [run for policy in order for run in groups[policy]]
    cells = [f'<th scope="row" data-v="{escape(sort_key)}">{header}</th>', _requests_cell(requests, runs)]
    cells += [_cell(column, policy, groups[policy], winners, False) for policy in order]
    return "<tr>" + "".join(cells) + "</tr>"


def _attainment(read: Callable[[dict], float | None], trials: Callable[[dict], float | None], label: str) -> Column:
    return Column("SLO attainment", label, read, True, kind="proportion", trials=trials)


def table(groups: dict[str, list[RunData]], colours: dict[str, str], prefix: str = "") -> str:
    """The heading, the table and its note; "" when no run's requests had classes."""
    if not has_classes(groups):
        return ""
    order = ranking(groups)
    runs = [run for policy in order for run in groups[policy]]
    shown, hidden = _classes(runs)
    rows = []
    for label in shown:
        read_requests = get("per_slo_class", label, "requests")
        column = _attainment(get("per_slo_class", label, "slo_attainment"), read_requests, label)
        rows.append(_row(escape(label), label, column, read_requests, groups, order))
    foot = []
    if any(run.summary.get("slo_unclassed") for run in runs):
        read_requests = get("slo_unclassed", "requests")
        column = _attainment(get("slo_unclassed", "slo_attainment"), read_requests, "(no class)")
        foot.append(_row("<em>(no class)</em>", "", column, read_requests, groups, order))
    if hidden:
        read_requests = _pooled(hidden, "requests")
        column = _attainment(_pooled(hidden, "slo_attainment"), read_requests, "the rest")
        foot.append(_row(f"<em>{len(hidden):,} more classes</em>", "", column, read_requests, groups, order))
    heads = ['<th scope="col" class="sortable" data-col="0">SLO class</th>',
             '<th scope="col" class="sortable" data-col="1">Requests <small>per run</small></th>']
    heads += [f'<th scope="col" class="sortable" data-col="{i}"><span class="chip" style="background:{colours[policy]}">'
              f'</span>{escape(policy)} <small>SLO attainment ↑</small></th>' for i, policy in enumerate(order, 2)]
    fewest = min(len(groups[policy]) for policy in order)
    intervals = ("Under each mean: its 95% Wilson interval over seeds." if fewest >= MIN_SEEDS
                 else f"{no_interval_text(fewest)}: intervals need {MIN_SEEDS} or more seeds.")
    rest = (f" The {TABLE_ROWS} classes with the most requests are shown; “{len(hidden):,} more classes” pools the "
            "others' requests, and each run's summary.json (per_slo_class) has every class." if hidden else "")
    note = (f'<p class="note">Share of each SLO class\'s requests (dropped ones count as misses) meeting every limit '
            "they are held to: their class's, and their model's for each limit the class leaves unset or when the "
            "scenario does not name the class. (no class): requests whose trace row has no slo_class, held to their "
            f"model's SLO. Best per row in green; click a header to sort. {intervals}{rest}</p>")
    body = (f'<div class="table-wrap"><table id="{escape(prefix)}slo-class-table" class="summary sortable-table">'
            f'<thead><tr>{"".join(heads)}</tr></thead><tbody>{"".join(rows)}</tbody>'
            + (f'<tfoot>{"".join(foot)}</tfoot>' if foot else "") + "</table></div>")
    return "<h3>SLO attainment by SLO class</h3>" + body + note
