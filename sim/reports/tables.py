"""The summary tables: the deciding columns first (goodput, SLO attainment, completed / dropped, TTFT and TPOT p90),
then every other figure in an expandable detail table. Cells are means over seeds with their 95% interval."""

from __future__ import annotations

from html import escape

from sim.reports.data import RunData
from sim.reports.metrics import (DROP_THRESHOLD, Column, best, deciding_columns, detail_columns, drops, estimate,
                                 fmt_interval, fmt_value)
from sim.reports.verdict import ranking

ARROWS = {True: " ↑", False: " ↓", None: ""}
DAGGER = ('<sup class="dagger" title="this policy dropped more than the threshold: the figure covers only the '
          'requests it served">†</sup>')


def _breakable(text: str) -> str:
    """Escaped text that may wrap after dashes, underscores and commas: the deciding table must fit 420 px."""
    return escape(text).replace("–", "–<wbr>").replace("_", "_<wbr>").replace(", ", ",<wbr> ")


def _hyphenable(text: str) -> str:
    """Escaped header text that may hyphenate its long words (soft hyphens) in a narrow column."""
    return escape(text).replace("attainment", "attain&shy;ment").replace("Requests", "Re&shy;quests")


def _policy_cell(policy: str, runs: list[RunData], colour: str) -> str:
    seeds = f'{len(runs)} seed{"s" if len(runs) != 1 else ""}'
    return (f'<th scope="row" data-v="{escape(policy)}"><span class="chip" style="background:{colour}"></span>'
            f'{escape(policy)} <small>({seeds})</small></th>')


def _drops_cell(runs: list[RunData], threshold: float) -> str:
    counted = drops(runs)
    detail = f"{counted.share:.1%} dropped" if counted.dropped else "none dropped"
    if counted.reasons_text():
        detail += f": {counted.reasons_text()}"
    klass = ' class="warn"' if counted.share > threshold else ""
    return (f'<td data-v="{counted.share:.10g}"{klass}>{counted.per_run()}'
            f'<small class="iv">{_breakable(detail)}</small></td>')


def _cell(col: Column, policy: str, runs: list[RunData], winners: set[str], over: bool) -> str:
    est = estimate(col, runs)
    shown = escape(fmt_value(col, est.mean))
    if over and col.higher_is_better is False:
        shown += DAGGER
    interval = fmt_interval(col, est)
    if interval:
        shown += f'<small class="iv">{_breakable(interval)}</small>'
    sort_value = "" if est.mean is None else f"{est.mean:.10g}"
    klass = ' class="best"' if policy in winners else ""
    return f'<td data-v="{sort_value}"{klass}>{shown}</td>'


def _table(table_id: str, cols: list[Column], groups: dict[str, list[RunData]], colours: dict[str, str],
           threshold: float, drops_at: int, deciding: bool) -> str:
    """One sortable table: a row per policy (best first), a column per ``cols`` entry, with the completed /
    dropped column inserted before ``cols[drops_at]``. The deciding table has one compact header row (its cells
    marked ``data-deciding`` for the browser test); the detail table groups its headers."""
    over = {p for p, runs in groups.items() if drops(runs).share > threshold}
    winners = [best(c, {p: estimate(c, runs) for p, runs in groups.items()}, over) for c in cols]
    heads: list[tuple[str, str]] = []  # (group, label) in display order
    for i, col in enumerate(cols):
        if i == drops_at:
            heads.append(("Requests", "completed / dropped"))
        heads.append((col.group, col.label + ARROWS[col.higher_is_better]))
    if deciding:
        mark = ' data-deciding="1"'
        labels = "".join(f'<th scope="col" class="sortable" data-col="{i + 1}"{mark}>{_hyphenable(group)}'
                         f"<small>{escape(label)}</small></th>" for i, (group, label) in enumerate(heads))
        head = f'<tr><th scope="col" class="sortable" data-col="0"{mark}>Policy</th>{labels}</tr>'
    else:
        spans: list[list] = []
        for group, _ in heads:
            if spans and spans[-1][0] == group:
                spans[-1][1] += 1
            else:
                spans.append([group, 1])
        top = "".join(f'<th colspan="{n}" scope="colgroup">{escape(g)}</th>' for g, n in spans)
        labels = "".join(f'<th scope="col" class="sortable" data-col="{i + 1}">{escape(label)}</th>'
                         for i, (_, label) in enumerate(heads))
        head = (f'<tr><th rowspan="2" scope="col" class="sortable" data-col="0">Policy</th>{top}</tr>'
                f"<tr>{labels}</tr>")
    rows = []
    for policy in ranking(groups):
        runs = groups[policy]
        cells = [_policy_cell(policy, runs, colours[policy])]
        for i, (col, col_winners) in enumerate(zip(cols, winners)):
            if i == drops_at:
                cells.append(_drops_cell(runs, threshold))
            cells.append(_cell(col, policy, runs, col_winners, policy in over))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    klass = "summary sortable-table deciding" if deciding else "summary sortable-table"
    return (f'<div class="table-wrap"><table id="{escape(table_id)}" class="{klass}">'
            f'<thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>')


def summary_tables(groups: dict[str, list[RunData]], models: list[str], colours: dict[str, str],
                   threshold: float = DROP_THRESHOLD, prefix: str = "") -> str:
    """The deciding table, then the detail table inside ``<details>``."""
    deciding = _table(f"{prefix}summary-table", deciding_columns(), groups, colours, threshold, drops_at=2,
                      deciding=True)
    details = detail_columns(models)
    first_latency = next(i for i, c in enumerate(details) if c.group == "TTFT s")
    detail = _table(f"{prefix}detail-table", details, groups, colours, threshold, drops_at=first_latency,
                    deciding=False)
    return (deciding + f'<details class="detail"><summary>All figures: throughput, SLO attainment per model, every '
            f"latency percentile, preemptions, seconds paused, GPUs ({len(details) + 1} columns)</summary>"
            f"{detail}</details>")
