"""The summary table (one row per policy, mean ± 95% CI over seeds) and the one-sentence verdict."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Callable

from sim.reports.data import RunData
from sim.reports.stats import mean_ci


@dataclass(frozen=True)
class Column:
    """A table column: how to read it from a run summary, how to show it, and which way is better."""

    group: str
    label: str
    read: Callable[[dict], float | None]
    higher_is_better: bool | None
    fmt: str = "{:.2f}"
    percent: bool = False


def _get(*keys: str) -> Callable[[dict], float | None]:
    def read(summary: dict) -> float | None:
        value = summary
        for key in keys:
            if not isinstance(value, dict) or value.get(key) is None:
                return None
            value = value[key]
        return float(value)
    return read


def _kv_seconds(summary: dict) -> float:
    lost = summary.get("lost_seconds", {})
    return float(lost.get("kv_out", 0.0)) + float(lost.get("kv_in", 0.0))


def columns(models: list[str]) -> list[Column]:
    """Every column of the summary table, per-model SLO attainment included."""
    cols = [
        Column("Throughput", "tokens/s", _get("throughput_tokens_per_s"), True, "{:.1f}"),
        Column("Throughput", "req/s", _get("throughput_requests_per_s"), True, "{:.3f}"),
        Column("Goodput", "req/s", _get("goodput_requests_per_s"), True, "{:.3f}"),
        Column("SLO attainment", "all", _get("slo_attainment"), True, percent=True),
    ]
    cols += [Column("SLO attainment", m, _get("per_model", m, "slo_attainment"), True, percent=True) for m in models]
    for metric, name in (("ttft_s", "TTFT s"), ("tpot_s", "TPOT s"), ("e2e_s", "E2E s")):
        fmt = "{:.4f}" if metric == "tpot_s" else "{:.3f}"
        cols += [Column(name, p, _get(metric, p), False, fmt) for p in ("p50", "p90", "p99")]
    cols += [
        Column("Preemptions", "count", _get("preemptions"), False, "{:.0f}"),
        Column("Seconds lost", "reload", _get("lost_seconds", "reload"), False, "{:.1f}"),
        Column("Seconds lost", "KV transfer", _kv_seconds, False, "{:.2f}"),
        Column("Seconds lost", "recompute", _get("lost_seconds", "recompute"), False, "{:.1f}"),
        Column("GPUs", "busy share", _get("gpu_busy_share"), None, percent=True),
        Column("GPUs", "resident models", _get("mean_resident_models_per_gpu"), None, "{:.2f}"),
    ]
    return cols


def _fmt(col: Column, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1%}" if col.percent else col.fmt.format(value)


def cell_stats(groups: dict[str, list[RunData]], col: Column) -> dict[str, tuple[float | None, float | None]]:
    """Mean and CI half-width of one column for each policy."""
    return {policy: mean_ci([col.read(r.summary) for r in runs]) for policy, runs in groups.items()}


def _best(col: Column, stats: dict[str, tuple]) -> set[str]:
    values = {p: m for p, (m, _) in stats.items() if m is not None}
    if col.higher_is_better is None or len(values) < 2 or len(set(values.values())) < 2:
        return set()
    target = max(values.values()) if col.higher_is_better else min(values.values())
    return {p for p, v in values.items() if v == target}


def summary_table(groups: dict[str, list[RunData]], models: list[str], colours: dict[str, str]) -> str:
    """The sortable HTML table: grouped headers, mean ± CI cells, best value per column highlighted."""
    cols = columns(models)
    head_groups, spans = [], []
    for col in cols:
        if spans and head_groups[-1] == col.group:
            spans[-1] += 1
        else:
            head_groups.append(col.group)
            spans.append(1)
    top = "".join(f'<th colspan="{n}" scope="colgroup">{escape(g)}</th>' for g, n in zip(head_groups, spans))
    arrows = {True: " ↑", False: " ↓", None: ""}
    second = "".join(f'<th scope="col" class="sortable" data-col="{i + 1}" title="click to sort">'
                     f'{escape(c.label)}<span class="dir">{arrows[c.higher_is_better]}</span></th>'
                     for i, c in enumerate(cols))
    stats = [cell_stats(groups, c) for c in cols]
    best = [_best(c, s) for c, s in zip(cols, stats)]
    rows = []
    for policy, runs in groups.items():
        cells = [f'<th scope="row" data-v="{escape(policy)}"><span class="chip" style="background:{colours[policy]}"></span>'
                 f'{escape(policy)} <small>({len(runs)} seed{"s" if len(runs) != 1 else ""})</small></th>']
        for col, col_stats, winners in zip(cols, stats, best):
            mean, half = col_stats[policy]
            shown = _fmt(col, mean)
            if half is not None:
                shown += f' <small>± {_fmt(col, half)}</small>'
            sort_value = "" if mean is None else f"{mean:.10g}"
            klass = ' class="best"' if policy in winners else ""
            cells.append(f'<td data-v="{sort_value}"{klass}>{shown}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return ('<div class="table-wrap"><table id="summary-table" class="summary">'
            f'<thead><tr><th rowspan="2" scope="col" class="sortable" data-col="0">Policy</th>{top}</tr><tr>{second}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _lead(groups: dict[str, list[RunData]], col: Column) -> tuple[str, float, float | None, str | None, float | None, bool]:
    """Winner, its mean, CI, the runner-up, its mean, and whether their CIs overlap."""
    stats = {p: s for p, s in cell_stats(groups, col).items() if s[0] is not None}
    ranked = sorted(stats, key=lambda p: -stats[p][0])
    winner = ranked[0]
    mean, half = stats[winner]
    if len(ranked) < 2:
        return winner, mean, half, None, None, False
    runner = ranked[1]
    other, other_half = stats[runner]
    overlap = half is not None and other_half is not None and mean - half <= other + other_half
    return winner, mean, half, runner, other, overlap


def verdict(groups: dict[str, list[RunData]]) -> str:
    """One sentence: the best policy for goodput and for SLO attainment, with the margin over the runner-up."""
    if not groups:
        return "No runs to compare."
    good = _lead(groups, Column("", "goodput", _get("goodput_requests_per_s"), True))
    slo = _lead(groups, Column("", "slo", _get("slo_attainment"), True))

    def goodput_text(lead) -> str:
        winner, mean, _, runner, other, overlap = lead
        text = f"goodput ({mean:.3f} req/s"
        if runner is not None:
            rel = f", {100 * (mean - other) / other:+.1f}%" if other else ""
            text += f", {mean - other:+.3f} req/s{rel} over <b>{escape(runner)}</b>"
            text += "; within the 95% CI" if overlap else ""
        return text + ")"

    def slo_text(lead) -> str:
        winner, mean, _, runner, other, overlap = lead
        text = f"SLO attainment ({mean:.1%}"
        if runner is not None:
            text += f", {100 * (mean - other):+.1f} points over <b>{escape(runner)}</b>"
            text += "; within the 95% CI" if overlap else ""
        return text + ")"

    if len(groups) == 1:
        only = next(iter(groups))
        return (f"Only one policy, <b>{escape(only)}</b>, was run: {goodput_text(good)[:-1].replace('(', 'of ', 1)}, "
                f"{slo_text(slo)[:-1].replace('(', 'of ', 1)}.")
    if good[0] == slo[0]:
        return f"<b>{escape(good[0])}</b> is best on both {goodput_text(good)} and {slo_text(slo)}."
    return (f"<b>{escape(good[0])}</b> has the best {goodput_text(good)}; "
            f"<b>{escape(slo[0])}</b> has the best {slo_text(slo)}.")
