"""HTML page for a sweep folder: SLO attainment and goodput vs load per policy (95% bands over seeds where there
are at least three: Wilson inside [0, 1] for attainment, never below 0 for goodput; fixed policy colours),
cost (per run, and per combination of the other axes with the cost-vs-attainment Pareto frontier), the
capacity or cheapest-fleet table when ``capacity.json`` is present, and links to every run's folder."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import MmsimError
from sim.files import counted, cut, load_json
from sim.reports.colours import policy_colours
from sim.reports.stats import MIN_SEEDS, Estimate, no_interval_text, proportion_estimate, rate_estimate
from sim.results import atomic_write
from sim.sweep.index import COST_FIGURES, FIGURES, read_index
from sim.sweep.page import document, figure_svg, num as _num, pyplot, table as _table
from sim.sweep.pareto import COST, FIGURE_COLUMNS, figures_row, pareto_front, pareto_svg

LOAD_AXES = ("load", "workload.generator.arrivals.rate_per_s", "workload.time_scale")
SERIES_AXES = ("policy.name", "policy")
PROPORTIONS = ("slo_attainment",)
"""Metrics that are shares of requests: Wilson intervals inside [0, 1]; every other metric is a rate (>= 0)."""


def confidence(values: pd.Series, trials: pd.Series | None = None, proportion: bool = False) -> Estimate:
    """Mean over seeds and its 95% interval: none below three seeds, Wilson for proportions (``trials`` caps the
    effective sample size), Student's t clipped at 0 otherwise (see docs/reports.md)."""
    if proportion:
        return proportion_estimate(values.tolist(), None if trials is None else trials.tolist())
    return rate_estimate(values.tolist())


def _varying(axes: list[str], frame: pd.DataFrame) -> list[str]:
    """The axes with more than one value: one that is the same in every run (e.g. a shortened duration) is
    neither an x axis nor part of a series' name."""
    return [a for a in axes if a in frame and frame[a].astype(str).nunique() > 1]


def _x_axis(axes: list[str], frame: pd.DataFrame) -> str | None:
    axes = _varying(axes, frame)
    for name in LOAD_AXES:
        if name in axes:
            return name
    numeric = [a for a in axes if a != "seed" and a not in SERIES_AXES and pd.api.types.is_numeric_dtype(frame[a])]
    return numeric[0] if numeric else None


def _series_label(row: pd.Series, keys: list[str]) -> str:
    return ", ".join(f"{row[k]}" if k in SERIES_AXES else f"{k}={row[k]}" for k in keys) or "all runs"


def band_table(frame: pd.DataFrame, axes: list[str], metric: str) -> pd.DataFrame:
    """Mean and 95% interval (low, high; NaN below three seeds) of ``metric`` per series (every axis but x and
    seed) and x."""
    x = _x_axis(axes, frame)
    keys = [a for a in _varying(axes, frame) if a not in (x, "seed")]
    ok = frame[frame["status"].eq("ok")].copy()
    ok["_series"] = ok.apply(lambda r: _series_label(r, keys), axis=1) if len(ok) else []
    rows = []
    for (series, xv), part in ok.groupby(["_series", x] if x else ["_series", "_series"], sort=True):
        trials = part["requests_total"] if "requests_total" in part else None
        est = confidence(part[metric], trials, proportion=metric in PROPORTIONS)
        rows.append({"series": series, "x": xv if x else 0, "mean": math.nan if est.mean is None else est.mean,
                     "low": math.nan if est.low is None else est.low, "high": math.nan if est.high is None else est.high,
                     "n": est.n})
    return pd.DataFrame(rows, columns=["series", "x", "mean", "low", "high", "n"])


def _policy_of(series: str) -> str:
    """The policy in a series label (the part that is not ``axis=value``), which picks the series' colour."""
    return next((part for part in series.split(", ") if "=" not in part), series)


def _band_caption(bands: pd.DataFrame, metric: str) -> str:
    """What the plot's band is, saying so when too few seeds give none."""
    seeds = int(bands["n"].min()) if len(bands) else 0
    method = "Wilson interval" if metric in PROPORTIONS else "Student's t interval, clipped at 0"
    if seeds >= MIN_SEEDS:
        return f"Mean over seeds; band: 95% {method} over seeds."
    return f"Mean over seeds; {no_interval_text(seeds)} (a band needs {MIN_SEEDS} or more seeds at a point)."


def _svg(bands: pd.DataFrame, xlabel: str | None, ylabel: str) -> str:
    """Each series' mean and band against x; with no x axis (``xlabel`` None), one column per series."""
    figure, axis = pyplot().subplots(figsize=(6.4, 3.6))
    colours = policy_colours(sorted({_policy_of(series) for series in bands["series"]}))
    for position, (series, part) in enumerate(bands.groupby("series", sort=True)):
        part = part.sort_values("x")
        colour = colours[_policy_of(series)]
        if xlabel is None:
            spread = [part["mean"] - part["low"], part["high"] - part["mean"]]  # NaN (under three seeds): no bar
            axis.errorbar([position], part["mean"], yerr=spread, fmt="o", capsize=4, color=colour)
            continue
        axis.plot(part["x"], part["mean"], marker="o", label=series, color=colour)
        # Points with fewer than three seeds have no interval: the band leaves a gap there.
        axis.fill_between(part["x"], part["low"], part["high"], alpha=0.2, color=colour, linewidth=0)
    if xlabel is None:
        names = sorted(set(bands["series"]))
        axis.set_xticks(range(len(names)), names, fontsize="small")
        axis.set_xlim(-0.5, len(names) - 0.5)
    else:
        axis.set_xlabel(xlabel)
        if len(bands):
            axis.legend(fontsize="small")
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure_svg(figure)


def cost_table(frame: pd.DataFrame, axes: list[str]) -> list[dict]:
    """Per combination of every axis but the seed: means over its finished runs of SLO attainment, goodput and
    the cost figures, the runs counted, and whether it is on the cost-vs-attainment Pareto frontier."""
    keys = [a for a in _varying(axes, frame) if a != "seed"]
    ok = frame[frame["status"].eq("ok")]
    rows: list[dict[str, Any]] = []
    if ok.empty:
        return rows
    for _, part in (ok.groupby(keys, sort=False, dropna=False) if keys else [((), ok)]):
        label = _series_label(part.iloc[0], keys)
        rows.append({"series": label, "policy": _policy_of(label), "runs": len(part),
                     **{name: _mean(part, name) for name in ("slo_attainment", "goodput_requests_per_s", *COST_FIGURES)}})
    for row, on_front in zip(rows, pareto_front([(r[COST], r["slo_attainment"]) for r in rows])):
        row["pareto"] = on_front
    return rows


def _mean(part: pd.DataFrame, name: str) -> float | None:
    """The column's mean, None where it is missing (an index from before cost was recorded) or empty."""
    return None if name not in part or part[name].isna().all() else float(part[name].mean())


def _cost_section(frame: pd.DataFrame, axes: list[str]) -> str:
    rows = cost_table(frame, axes)
    if not any(r[COST] is not None for r in rows):
        return ""
    cells = [[html.escape(r["series"]), str(r["runs"]), *figures_row(r), "✓" if r["pareto"] else ""] for r in rows]
    return ("<h2>Cost and SLO attainment</h2><p>Mean over the finished runs (seeds) of each combination of the other "
            "axes; ringed and joined: the Pareto frontier (no other combination costs no more per 1,000 requests and "
            "attains no less).</p>" + pareto_svg(rows, "policy", "series")
            + _table(["series", "runs", *FIGURE_COLUMNS, "Pareto"], cells))


def _capacity_section(path: Path) -> str:
    data = _read_object(path, "capacity file")
    if not data:
        return ""
    query = data.get("query", {})
    if "fleet" in data:
        return _fleet_section(data["fleet"], query)
    rows = []
    for answer in data.get("policies", []):
        layout = answer.get("gpu_layout")
        rows.append([html.escape(answer["policy"]), _num(answer.get("max_load")), html.escape(answer.get("max_load_bound", "")),
                     _num(answer.get("attainment_at_max")),
                     "-" if answer.get("min_gpus") is None else f"{answer['min_gpus']} ({layout[0]}×{layout[1]})",
                     _num(answer.get("attainment_at_min_gpus"))])
    title = f"Capacity at SLO attainment ≥ {query.get('target')} over {counted(len(query.get('seeds', [])), 'seed')}"
    if query.get("gpus_for_load") is not None:
        title += f"; min GPUs at load {query['gpus_for_load']}"
    return f"<h2>{html.escape(title)}</h2>" + _table(
        ["policy", "max load ×", "bound", "attainment there", "min GPUs", "attainment there"], rows)


def _fleet_section(answers: list[dict], query: dict) -> str:
    rows = []
    for a in answers:
        tried = f"{a['mixes_run']} of {a['mixes_total']}"
        if a.get("nodes") is None:
            rows.append([html.escape(a["policy"]), "none meets the target", *["-"] * 5, tried])
            continue
        f = a["figures"]
        rows.append([html.escape(a["policy"]), html.escape(", ".join(f"{k}={v}" for k, v in a["nodes"].items())),
                     str(a["gpus"]), _num(a["hourly_usd"], ".2f"), _num(f.get("cost_usd"), ".4f"),
                     _num(f.get("cost_per_1k_requests_usd"), ".4f"), _num(f.get("slo_attainment")), tried])
    title = (f"Cheapest fleet at SLO attainment ≥ {query.get('target')} over {counted(len(query.get('seeds', [])), 'seed')}, "
             f"load {query.get('load')}×")
    return f"<h2>{html.escape(title)}</h2>" + _table(
        ["policy", "nodes per pool", "GPUs", "$ / hour", "run cost $", "$ / 1k req", "attainment", "mixes run"], rows)


def _run_link(sweep_dir: Path, run_id: str) -> str:
    run_dir = sweep_dir / "runs" / run_id
    target = "report.html" if (run_dir / "report.html").is_file() else ""
    return f'<a href="runs/{html.escape(run_id)}/{target}">{html.escape(run_id)}</a>'


INDEX_COLUMNS = ("run_id", "status", "error")
"""What the report reads of every index row besides the axes and figures."""


def _read_sweep_index(sweep_dir: Path) -> pd.DataFrame:
    """The sweep's index, or one error naming the damaged file (pyarrow and pandas raise many kinds)."""
    name = "index.parquet" if (sweep_dir / "index.parquet").is_file() else "index.csv"
    try:
        frame = read_index(sweep_dir)
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise MmsimError(f"unreadable sweep index (truncated or damaged?): {reason}; rerun `mmsim sweep` to rewrite it",
                         source=str(sweep_dir / name)) from None
    missing = [column for column in INDEX_COLUMNS if column not in frame.columns]
    if missing:
        raise MmsimError(f"not a sweep index: lacks column(s) {', '.join(missing)}", source=str(sweep_dir / name))
    return frame


def _read_object(path: Path, what: str) -> dict:
    """A JSON object the sweep wrote beside its index ({} when absent), or one error naming the file."""
    if not path.is_file():
        return {}
    data = load_json(path, what)
    if not isinstance(data, dict):
        raise MmsimError(f"expected a JSON object, found a {type(data).__name__}", source=str(path))
    return data


def _read_meta(sweep_dir: Path, frame: pd.DataFrame) -> tuple[dict, list[str]]:
    """sweep.json ({} when absent) and the sweep's axes: those it lists (each a column of the index that is
    neither a figure nor run_id/status/error), or, without a list, the index's dotted columns."""
    path = sweep_dir / "sweep.json"
    meta = _read_object(path, "sweep description")
    for key in ("name", "base"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise MmsimError(f"expected text, found {cut(repr(meta[key]))}", source=str(path), field=key)
    axes = meta.get("axes")
    if axes is None or axes == []:
        return meta, [c for c in frame.columns if c not in INDEX_COLUMNS and "." in str(c)]
    columns = [str(c) for c in frame.columns if c not in (*INDEX_COLUMNS, *FIGURES)]
    if (not isinstance(axes, list) or not all(isinstance(a, str) and a in columns for a in axes)
            or len(set(axes)) != len(axes)):
        index = "index.parquet" if (sweep_dir / "index.parquet").is_file() else "index.csv"
        raise MmsimError(f"expected a list of the index's axis columns ({index} has: "
                         f"{cut(', '.join(columns) or 'none', 200)}), each once, found {cut(repr(axes))}",
                         source=str(path), field="axes")
    return meta, axes


def _figure_sections(frame: pd.DataFrame, axes: list[str]) -> list[str]:
    """The plots and the cost section; with no finished run (every run failed, or none ran), a line that says so."""
    if not frame["status"].eq("ok").any():
        return ["<p><strong>No run of this sweep finished (every run failed, or none ran), so there are no figures; "
                "the runs table gives each failed run's error.</strong></p>"]
    x = _x_axis(axes, frame)
    xlabel = "load multiplier" if x == "load" else x
    sections = []
    for metric, label in (("slo_attainment", "SLO attainment"), ("goodput_requests_per_s", "goodput (req/s)")):
        bands = band_table(frame, axes, metric)
        title = f"{label} vs {xlabel}" if xlabel else f"{label} per series"
        sections.append(f"<h2>{html.escape(title)}</h2>"
                        f"<p>{html.escape(_band_caption(bands, metric))}</p>{_svg(bands, xlabel, label)}")
    return [*sections, _cost_section(frame, axes)]


def sweep_report(sweep_dir: Path, out: Path) -> Path:
    """Write a self-contained HTML page for the sweep in ``sweep_dir`` to ``out``; return ``out``."""
    sweep_dir, out = Path(sweep_dir), Path(out)
    if not (sweep_dir / "index.parquet").is_file() and not (sweep_dir / "index.csv").is_file():
        raise MmsimError("not a sweep folder (no index.parquet or index.csv)", source=str(sweep_dir))
    frame = _read_sweep_index(sweep_dir)
    meta, axes = _read_meta(sweep_dir, frame)
    sections = _figure_sections(frame, axes)
    sections.append(_capacity_section(sweep_dir / "capacity.json"))
    figures = {"slo_attainment": ".3f", "goodput_requests_per_s": ".3f", "cost_usd": ".4f", "cost_per_1k_requests_usd": ".4f",
               "cost_per_million_output_tokens_usd": ".3f", "gpu_hours": ".3f", "throughput_tokens_per_s": ".1f",
               "ttft_p99_s": ".3f", "preemptions": ".0f", "reload_s": ".1f"}
    rows = [[_run_link(sweep_dir, r["run_id"]), *(html.escape(str(r[a])) for a in axes), html.escape(str(r["status"])),
             *(_num(r.get(f), form) for f, form in figures.items()), html.escape(str(r["error"] or "")) if r["status"] != "ok" else ""]
            for r in frame.to_dict("records")]
    sections.append("<h2>Runs</h2>" + _table(["run", *axes, "status", *figures, "error"], rows))
    failed = int((frame["status"] != "ok").sum())
    name = meta.get("name", sweep_dir.name)
    page = document(f"Sweep {name}", f"<p>{counted(len(frame), 'run')}, {failed} failed; base scenario "
                    f"{html.escape(str(meta.get('base', '?')))}; axes: {html.escape(', '.join(axes))}.</p>"
                    + "".join(sections))
    atomic_write(out, lambda p: Path(p).write_text(page))
    return out
