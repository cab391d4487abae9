"""HTML page for a sweep folder: SLO attainment and goodput vs load per policy (95% bands over seeds),
the capacity table when ``capacity.json`` is present, and links to every run's folder."""

from __future__ import annotations

import html
import io
import json
import math
from pathlib import Path

import pandas as pd

from sim.errors import MmsimError
from sim.results import atomic_write
from sim.sweep.index import read_index

LOAD_AXES = ("load", "workload.generator.arrivals.rate_per_s", "workload.time_scale")
SERIES_AXES = ("policy.name", "policy")
# Two-sided 97.5% Student-t quantiles by degrees of freedom (1..30); beyond that the normal 1.96.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def confidence(values: pd.Series) -> tuple[float, float]:
    """Mean and half-width of its 95% confidence interval (Student t; 0 for one value)."""
    data = values.dropna()
    if data.empty:
        return math.nan, math.nan
    if len(data) < 2:
        return float(data.mean()), 0.0
    t = T975[len(data) - 2] if len(data) - 1 <= len(T975) else 1.96
    return float(data.mean()), t * float(data.std(ddof=1)) / math.sqrt(len(data))


def _x_axis(axes: list[str], frame: pd.DataFrame) -> str | None:
    for name in LOAD_AXES:
        if name in axes:
            return name
    numeric = [a for a in axes if a != "seed" and a not in SERIES_AXES and pd.api.types.is_numeric_dtype(frame[a])]
    return numeric[0] if numeric else None


def _series_label(row: pd.Series, keys: list[str]) -> str:
    return ", ".join(f"{row[k]}" if k in SERIES_AXES else f"{k}={row[k]}" for k in keys) or "all runs"


def band_table(frame: pd.DataFrame, axes: list[str], metric: str) -> pd.DataFrame:
    """Mean and 95% half-width of ``metric`` per series (every axis but x and seed) and x."""
    x = _x_axis(axes, frame)
    keys = [a for a in axes if a not in (x, "seed")]
    ok = frame[frame["status"].eq("ok")].copy()
    ok["_series"] = ok.apply(lambda r: _series_label(r, keys), axis=1) if len(ok) else []
    rows = []
    for (series, xv), part in ok.groupby(["_series", x] if x else ["_series", "_series"], sort=True):
        mean, half = confidence(part[metric])
        rows.append({"series": series, "x": xv if x else 0, "mean": mean, "half": half, "n": len(part)})
    return pd.DataFrame(rows, columns=["series", "x", "mean", "half", "n"])


def _svg(bands: pd.DataFrame, xlabel: str, ylabel: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 3.6))
    for series, part in bands.groupby("series", sort=True):
        part = part.sort_values("x")
        axis.plot(part["x"], part["mean"], marker="o", label=series)
        axis.fill_between(part["x"], part["mean"] - part["half"], part["mean"] + part["half"], alpha=0.2)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    if len(bands):
        axis.legend(fontsize="small")
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})  # no timestamp: same sweep, same page
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _table(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _num(value, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _capacity_section(path: Path) -> str:
    if not path.is_file():
        return ""
    data = json.loads(path.read_text())
    query = data.get("query", {})
    rows = []
    for answer in data.get("policies", []):
        layout = answer.get("gpu_layout")
        rows.append([html.escape(answer["policy"]), _num(answer.get("max_load")), html.escape(answer.get("max_load_bound", "")),
                     _num(answer.get("attainment_at_max")),
                     "-" if answer.get("min_gpus") is None else f"{answer['min_gpus']} ({layout[0]}×{layout[1]})",
                     _num(answer.get("attainment_at_min_gpus"))])
    title = f"Capacity at SLO attainment ≥ {query.get('target')} over {len(query.get('seeds', []))} seed(s)"
    if query.get("gpus_for_load") is not None:
        title += f"; min GPUs at load {query['gpus_for_load']}"
    return f"<h2>{html.escape(title)}</h2>" + _table(
        ["policy", "max load ×", "bound", "attainment there", "min GPUs", "attainment there"], rows)


def _run_link(sweep_dir: Path, run_id: str) -> str:
    run_dir = sweep_dir / "runs" / run_id
    target = "report.html" if (run_dir / "report.html").is_file() else ""
    return f'<a href="runs/{html.escape(run_id)}/{target}">{html.escape(run_id)}</a>'


def sweep_report(sweep_dir: Path, out: Path) -> Path:
    """Write a self-contained HTML page for the sweep in ``sweep_dir`` to ``out``; return ``out``."""
    sweep_dir, out = Path(sweep_dir), Path(out)
    if not (sweep_dir / "index.parquet").is_file() and not (sweep_dir / "index.csv").is_file():
        raise MmsimError("not a sweep folder (no index.parquet or index.csv)", source=str(sweep_dir))
    frame = read_index(sweep_dir)
    meta = json.loads((sweep_dir / "sweep.json").read_text()) if (sweep_dir / "sweep.json").is_file() else {}
    axes = meta.get("axes") or [c for c in frame.columns if c not in ("run_id", "status", "error") and "." in c]
    x = _x_axis(axes, frame)
    xlabel = "load multiplier" if x == "load" else (x or "(no numeric axis)")
    sections = []
    for metric, label in (("slo_attainment", "SLO attainment"), ("goodput_requests_per_s", "goodput (req/s)")):
        bands = band_table(frame, axes, metric)
        sections.append(f"<h2>{html.escape(label)} vs {html.escape(xlabel)}</h2>"
                        f"<p>Mean over seeds with 95% confidence band.</p>{_svg(bands, xlabel, label)}")
    sections.append(_capacity_section(sweep_dir / "capacity.json"))
    figures = ["slo_attainment", "goodput_requests_per_s", "throughput_tokens_per_s", "ttft_p99_s", "preemptions", "reload_s"]
    rows = [[_run_link(sweep_dir, r["run_id"]), *(html.escape(str(r[a])) for a in axes), html.escape(str(r["status"])),
             *(_num(r[f]) for f in figures), html.escape(str(r["error"] or "")) if r["status"] != "ok" else ""]
            for r in frame.to_dict("records")]
    sections.append("<h2>Runs</h2>" + _table(["run", *axes, "status", *figures, "error"], rows))
    failed = int((frame["status"] != "ok").sum())
    name = meta.get("name", sweep_dir.name)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Sweep {html.escape(name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:70em}}table{{border-collapse:collapse;font-size:0.85em}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}svg{{max-width:100%;height:auto}}</style></head>
<body><h1>Sweep {html.escape(name)}</h1>
<p>{len(frame)} run(s), {failed} failed; base scenario {html.escape(str(meta.get('base', '?')))};
axes: {html.escape(', '.join(axes))}.</p>
{''.join(sections)}
</body></html>
"""
    atomic_write(out, lambda p: Path(p).write_text(page))
    return out
