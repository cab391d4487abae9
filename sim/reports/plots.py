"""Comparison plots across policies: latency CDFs, SLO attainment per model, throughput and queue depth over time,
and the overhead breakdown. Each function returns one inline SVG string."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from sim.reports.data import RunData
from sim.reports.stats import mean_ci
from sim.reports.svg import figure, to_svg

CDF_POINTS = 160
TIME_BINS = 200
LATENCIES = (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E latency (s)"))
OVERHEADS = (("reload", "reload"), ("unload", "unload"), ("kv", "KV transfer"), ("recompute", "recompute"))
OVERHEAD_COLOURS = {"reload": "#f59e0b", "unload": "#a16207", "kv": "#3b82f6", "recompute": "#ef4444"}


def _empty(ax, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#9ca3af")


def latency_cdfs(groups: dict[str, list[RunData]], colours: dict[str, str]) -> str:
    """CDFs of TTFT, TPOT and E2E per policy (all seeds pooled), thinned to a fixed number of quantiles."""
    fig, axes = figure(12, 3.3, 1, 3)
    levels = np.linspace(0, 1, CDF_POINTS)
    for ax, (column, label) in zip(axes[0], LATENCIES):
        lows, highs = [], []
        for policy, runs in groups.items():
            values = np.concatenate([r.requests.loc[r.requests["status"].eq("completed"), column].to_numpy(float)
                                     for r in runs])
            values = values[np.isfinite(values)]
            if values.size == 0:
                continue
            xs = np.quantile(values, levels)
            ax.plot(xs, levels, color=colours[policy], lw=1.6, label=policy)
            positive = values[values > 0]
            if positive.size:
                lows.append(positive.min())
                highs.append(positive.max())
        if not lows:
            _empty(ax)
        elif max(highs) / min(lows) > 50:
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylim(0, 1.01)
    axes[0][0].set_ylabel("share of completed requests")
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return to_svg(fig)


def slo_per_model(groups: dict[str, list[RunData]], models: list[str], colours: dict[str, str]) -> str:
    """Grouped bars: SLO attainment per model (and overall) per policy, with 95% CI whiskers over seeds."""
    labels = ["all models"] + models
    fig, axes = figure(12, 3.2)
    ax = axes[0][0]
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(labels))
    for i, (policy, runs) in enumerate(groups.items()):
        stats = [mean_ci([r.summary.get("slo_attainment") for r in runs])]
        stats += [mean_ci([r.summary.get("per_model", {}).get(m, {}).get("slo_attainment") for r in runs]) for m in models]
        means = [100 * (m or 0.0) for m, _ in stats]
        errors = [100 * (h or 0.0) for _, h in stats]
        ax.bar(x + (i - (len(groups) - 1) / 2) * width, means, width * 0.92, color=colours[policy], label=policy,
               yerr=errors if any(errors) else None, error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "#374151"})
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 105)
    ax.set_ylabel("SLO attainment (%)")
    ax.grid(axis="x", visible=False)
    ax.legend(ncols=min(len(groups), 5), loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8)
    fig.tight_layout()
    return to_svg(fig)


def _bin_edges(groups: dict[str, list[RunData]]) -> np.ndarray:
    end = max((float(r.requests["finish_s"].max()) if r.requests["finish_s"].notna().any() else 0.0)
              for runs in groups.values() for r in runs)
    end = max(end, max((float(r.timeseries["time_s"].max()) for runs in groups.values() for r in runs
                        if len(r.timeseries)), default=0.0), 1e-6)
    return np.linspace(0.0, end, TIME_BINS + 1)


def _throughput(run: RunData, edges: np.ndarray) -> np.ndarray:
    done = run.requests[run.requests["status"].eq("completed")]
    tokens, _ = np.histogram(done["finish_s"].to_numpy(float), bins=edges, weights=done["output_tokens"].to_numpy(float))
    return tokens / np.diff(edges)


def _queue_depth(run: RunData, edges: np.ndarray) -> np.ndarray:
    if run.timeseries.empty:
        return np.full(len(edges) - 1, np.nan)
    per_time = run.timeseries.groupby("time_s")["queued"].sum()
    index = np.clip(np.digitize(per_time.index.to_numpy(float), edges) - 1, 0, len(edges) - 2)
    binned = pd.Series(per_time.to_numpy(float)).groupby(index).mean()
    out = np.full(len(edges) - 1, np.nan)
    out[binned.index.to_numpy()] = binned.to_numpy()
    return out


def throughput_and_queue(groups: dict[str, list[RunData]], colours: dict[str, str]) -> str:
    """Output tokens/s and queued requests over time per policy (mean over seeds, binned)."""
    fig, axes = figure(12, 4.6, 2, 1, sharex=True)
    edges = _bin_edges(groups)
    centres = (edges[:-1] + edges[1:]) / 2
    for policy, runs in groups.items():
        axes[0][0].plot(centres, np.mean([_throughput(r, edges) for r in runs], axis=0), color=colours[policy],
                        lw=1.3, label=policy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # bins with no sample in any seed stay NaN (a gap)
            depth = np.nanmean([_queue_depth(r, edges) for r in runs], axis=0)
        axes[1][0].plot(centres, depth, color=colours[policy], lw=1.3)
    axes[0][0].set_ylabel("output tokens/s")
    axes[1][0].set_ylabel("queued requests")
    axes[1][0].set_xlabel("simulated time (s)")
    axes[0][0].legend(ncols=min(len(groups), 6), loc="upper right", fontsize=8)
    fig.tight_layout()
    return to_svg(fig)


def _overheads(run: RunData) -> dict[str, float]:
    lost = run.summary.get("lost_seconds", {})
    return {"reload": float(lost.get("reload", 0.0)), "unload": float(lost.get("unload", 0.0)),
            "kv": float(lost.get("kv_out", 0.0)) + float(lost.get("kv_in", 0.0)),
            "recompute": float(lost.get("recompute", 0.0))}


def overhead_bars(groups: dict[str, list[RunData]]) -> str:
    """Stacked bars per policy: request-seconds lost to reload, unload, KV transfer and recompute (mean over seeds)."""
    fig, axes = figure(12, 0.9 + 0.5 * len(groups), 1, 2, gridspec_kw={"width_ratios": [3, 2]})
    absolute, share = axes[0]
    names = list(groups)
    y = np.arange(len(names))
    means = {p: {k: float(np.mean([_overheads(r)[k] for r in runs])) for k, _ in OVERHEADS} for p, runs in groups.items()}
    left = np.zeros(len(names))
    left_share = np.zeros(len(names))
    totals = np.array([sum(means[p].values()) for p in names])
    for key, label in OVERHEADS:
        values = np.array([means[p][key] for p in names])
        absolute.barh(y, values, left=left, color=OVERHEAD_COLOURS[key], label=label, height=0.6)
        shares = np.divide(100 * values, totals, out=np.zeros_like(values), where=totals > 0)
        share.barh(y, shares, left=left_share, color=OVERHEAD_COLOURS[key], height=0.6)
        left += values
        left_share += shares
    for ax in (absolute, share):
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        ax.grid(axis="y", visible=False)
    share.set_yticklabels([])
    absolute.set_xlabel("request-seconds lost")
    share.set_xlabel("share of overhead (%)")
    share.set_xlim(0, 100)
    absolute.legend(ncols=4, loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=8)
    if not totals.any():
        _empty(absolute, "no overhead: nothing was reloaded, swapped or recomputed")
    fig.tight_layout()
    return to_svg(fig)
