"""What a report says about each policy: its columns (how to read them from a summary, which way is better,
how their interval is computed) and per policy the counts of completed and dropped requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sim.reports.data import RunData
from sim.reports.stats import Estimate, proportion_estimate, rate_estimate

DROP_THRESHOLD = 0.01
"""A policy that dropped more than this share of its requests is never marked best on latency or overhead."""


@dataclass(frozen=True)
class Column:
    """A table column: how to read it from a run summary, how to show it, and which way is better.

    ``kind`` is ``proportion`` (Wilson interval, shown as a percentage) or ``rate`` (t-interval clipped at 0);
    ``trials`` reads the request count behind a proportion, which caps its effective sample size."""

    group: str
    label: str
    read: Callable[[dict], float | None]
    higher_is_better: bool | None
    fmt: str = "{:.2f}"
    kind: str = "rate"
    trials: Callable[[dict], float | None] | None = None

    @property
    def percent(self) -> bool:
        return self.kind == "proportion"


def get(*keys: str) -> Callable[[dict], float | None]:
    """A reader of the number at ``summary[k1][k2]…`` (None when absent)."""
    def read(summary: dict) -> float | None:
        value: Any = summary
        for key in keys:
            if not isinstance(value, dict) or value.get(key) is None:
                return None
            value = value[key]
        return float(value)
    return read


def _kv_seconds(summary: dict) -> float:
    lost = summary.get("lost_seconds", {})
    return float(lost.get("kv_out", 0.0)) + float(lost.get("kv_in", 0.0))


GOODPUT = Column("Goodput", "req/s", get("goodput_requests_per_s"), True, "{:.3f}")
SLO = Column("SLO attainment", "all", get("slo_attainment"), True, kind="proportion", trials=get("requests_total"))
TTFT_P90 = Column("TTFT s", "p90", get("ttft_s", "p90"), False, "{:.3f}")
TPOT_P90 = Column("TPOT s", "p90", get("tpot_s", "p90"), False, "{:.4f}")


def deciding_columns() -> list[Column]:
    """The columns that decide between policies, shown first (completed / dropped sits between SLO and latency)."""
    return [GOODPUT, SLO, TTFT_P90, TPOT_P90]


def detail_columns(models: list[str]) -> list[Column]:
    """Every other figure of the summary, for the expandable detail table."""
    cols = [
        Column("Throughput", "tokens/s", get("throughput_tokens_per_s"), True, "{:.1f}"),
        Column("Throughput", "req/s", get("throughput_requests_per_s"), True, "{:.3f}"),
    ]
    cols += [Column("SLO attainment", m, get("per_model", m, "slo_attainment"), True, kind="proportion",
                    trials=get("per_model", m, "requests")) for m in models]
    for metric, name in (("ttft_s", "TTFT s"), ("tpot_s", "TPOT s"), ("e2e_s", "E2E s"), ("queue_s", "Queue s")):
        fmt = "{:.4f}" if metric == "tpot_s" else "{:.3f}"
        cols += [Column(name, p, get(metric, p), False, fmt) for p in ("p50", "p90", "p99")]
    cols += [
        Column("Preemptions", "count", get("preemptions"), False, "{:.0f}"),
        Column("Seconds paused", "reload", get("lost_seconds", "reload"), False, "{:.1f}"),
        Column("Seconds paused", "unload", get("lost_seconds", "unload"), False, "{:.1f}"),
        Column("Seconds paused", "KV transfer", _kv_seconds, False, "{:.2f}"),
        Column("Seconds paused", "recompute", get("lost_seconds", "recompute"), False, "{:.1f}"),
        Column("GPUs", "busy share", get("gpu_busy_share"), None, kind="proportion"),
        Column("GPUs", "resident models", get("mean_resident_models_per_gpu"), None, "{:.2f}"),
    ]
    return cols


def estimate(col: Column, runs: list[RunData]) -> Estimate:
    """Mean over the runs (seeds) of one column, with the interval its kind calls for."""
    values = [col.read(r.summary) for r in runs]
    if col.kind == "proportion":
        trials = [col.trials(r.summary) for r in runs] if col.trials else None
        return proportion_estimate(values, trials)
    return rate_estimate(values)


def fmt_value(col: Column, value: float | None) -> str:
    """One number as the column shows it ("–" when absent)."""
    if value is None:
        return "–"
    return f"{value:.1%}" if col.percent else col.fmt.format(value)


def fmt_interval(col: Column, est: Estimate) -> str:
    """``low–high`` of an estimate in the column's format, or "" without an interval."""
    if est.low is None or est.high is None:
        return ""
    if col.percent:
        return f"{100 * est.low:.1f}–{100 * est.high:.1f}%"
    return f"{col.fmt.format(est.low)}–{col.fmt.format(est.high)}"


@dataclass(frozen=True)
class Drops:
    """Completed and dropped requests of one policy, summed over its seeds, with the drop reasons."""

    runs: int
    total: int
    completed: int
    dropped: int
    reasons: dict[str, int]

    @property
    def share(self) -> float:
        return self.dropped / self.total if self.total else 0.0

    def per_run(self) -> str:
        """``completed / dropped`` per run (means over seeds, rounded)."""
        return f"{round(self.completed / self.runs):,} / {round(self.dropped / self.runs):,}"

    def reasons_text(self) -> str:
        """``reason count, …`` summed over seeds, largest first, saying so when there are several ("" when nothing
        was dropped): beside the per-run means of :meth:`per_run`, a bare sum reads as a count per run."""
        ranked = sorted(self.reasons.items(), key=lambda item: -item[1])
        text = ", ".join(f"{reason} {count:,}" for reason, count in ranked if count)
        return f"{text} over {self.runs} runs" if text and self.runs > 1 else text


def drops(runs: list[RunData]) -> Drops:
    """The drop counts of one policy's runs."""
    reasons: dict[str, int] = {}
    for run in runs:
        for reason, count in (run.summary.get("drop_reasons") or {}).items():
            reasons[str(reason)] = reasons.get(str(reason), 0) + int(count)
    return Drops(len(runs), sum(int(r.summary.get("requests_total", 0)) for r in runs),
                 sum(int(r.summary.get("requests_completed", 0)) for r in runs),
                 sum(int(r.summary.get("requests_dropped", 0)) for r in runs), reasons)


def best(col: Column, estimates: dict[str, Estimate], excluded: set[str]) -> set[str]:
    """Policies with the best mean of a column. Lower-is-better columns (latency, overhead) skip ``excluded``
    policies: a policy that drops requests looks fast on the ones it kept."""
    skip = excluded if col.higher_is_better is False else set()
    known = {p: e.mean for p, e in estimates.items() if e.mean is not None}
    values = {p: v for p, v in known.items() if p not in skip}
    if col.higher_is_better is None or len(known) < 2 or not values:
        return set()
    if len(values) > 1 and len(set(values.values())) < 2:
        return set()  # a tie between every eligible policy picks no one
    target = max(values.values()) if col.higher_is_better else min(values.values())
    return {p for p, v in values.items() if v == target}
