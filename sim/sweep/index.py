"""The sweep index: one row per run (axis values, status, headline figures), as CSV and Parquet."""

from __future__ import annotations

import json
import numbers
from pathlib import Path

import pandas as pd

from sim.results import atomic_write

COST_FIGURES = ("cost_usd", "cost_per_1k_requests_usd", "cost_per_million_output_tokens_usd", "gpu_hours")
"""From the summary's ``fleet`` block (sim/fleet/cost.py): what the GPUs billed during the run cost."""
FIGURES = ("throughput_tokens_per_s", "goodput_requests_per_s", "slo_attainment", *COST_FIGURES, "ttft_p99_s",
           "preemptions", "reload_s", "requests_total", "requests_completed", "sim_wall_seconds")


def summary_figures(summary: dict) -> dict:
    """The headline figures of a run's summary.json, flat (cost None for a summary without a fleet block)."""
    fleet = summary.get("fleet") or {}
    return {
        "throughput_tokens_per_s": summary.get("throughput_tokens_per_s"),
        "goodput_requests_per_s": summary.get("goodput_requests_per_s"),
        "slo_attainment": summary.get("slo_attainment"),
        **{name: fleet.get(name) for name in COST_FIGURES},
        "ttft_p99_s": (summary.get("ttft_s") or {}).get("p99"),
        "preemptions": summary.get("preemptions"),
        "reload_s": (summary.get("lost_seconds") or {}).get("reload"),
        "requests_total": summary.get("requests_total"),
        "requests_completed": summary.get("requests_completed"),
        "sim_wall_seconds": summary.get("sim_wall_seconds"),
    }


def make_row(run_id: str, axes: dict, status: str, error: str = "", summary: dict | None = None) -> dict:
    """One index row."""
    figures = summary_figures(summary) if summary else dict.fromkeys(FIGURES)
    return {"run_id": run_id, **axes, "status": status, "error": error, **figures}


def _column_safe(values: pd.Series) -> pd.Series:
    """Parquet wants one type per column: mixed numbers/strings (or lists) become text."""
    kinds = {"num" if isinstance(v, numbers.Number) and not isinstance(v, bool) else type(v).__name__
             for v in values if v is not None}
    if len(kinds) <= 1 and not kinds & {"list", "dict"}:
        return values
    return values.map(lambda v: v if v is None else (json.dumps(v) if isinstance(v, (list, dict)) else str(v)))


def write_index(out: Path, rows: list[dict], axes: list[str]) -> pd.DataFrame:
    """Write OUT/index.csv and OUT/index.parquet atomically; rows in sweep order."""
    columns = ["run_id", *axes, "status", "error", *FIGURES]
    frame = pd.DataFrame(rows, columns=columns)
    for axis in axes:
        frame[axis] = _column_safe(frame[axis])
    atomic_write(Path(out) / "index.parquet", lambda p: frame.to_parquet(p, index=False))
    atomic_write(Path(out) / "index.csv", lambda p: frame.to_csv(p, index=False))
    return frame


def read_index(sweep_dir: Path) -> pd.DataFrame:
    """The index of a sweep folder (Parquet if present, else CSV)."""
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / "index.parquet").is_file():
        return pd.read_parquet(sweep_dir / "index.parquet")
    return pd.read_csv(sweep_dir / "index.csv")
