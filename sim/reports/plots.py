"""Comparison plots across policies: latency CDFs, SLO attainment per model, throughput and queue depth over time
(small multiples, one panel per policy on shared axes), and the overhead breakdown. Each function returns inline
SVG: a list of small panels where the page lays them out in a grid that re-flows, or one wide figure."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from sim.reports.data import RunData
from sim.reports.metrics import SLO, Column, drops, estimate, get
from sim.reports.svg import figure, to_svg

CDF_POINTS = 160
TIME_BINS = 120
SMOOTH_BINS = 5
PANEL = (4.4, 3.0)
"""Inches of one small-multiple panel: at the page's grid width its 9 pt text shows at about 12 px."""
LATENCIES = (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E latency (s)"))
OVERHEADS = (("reload", "reload"), ("unload", "unload"), ("kv", "KV transfer"), ("recompute", "recompute"))
OVERHEAD_COLOURS = {"reload": "#f59e0b", "unload": "#a16207", "kv": "#3b82f6", "recompute": "#ef4444"}


def _empty(ax, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#9ca3af")


def latency_cdfs(groups: dict[str, list[RunData]], colours: dict[str, str]) -> list[str]:
    """One panel per latency (TTFT, TPOT, E2E): its CDF per policy over completed requests, seeds pooled; each
    legend entry gives the share of requests the curve covers."""
    levels = np.linspace(0, 1, CDF_POINTS)
    served = {p: 1 - drops(runs).share for p, runs in groups.items()}
    panels = []
    for column, label in LATENCIES:
        fig, axes = figure(*PANEL)
        ax = axes[0][0]
        lows, highs = [], []
        for policy, runs in groups.items():
            values = np.concatenate([r.requests.loc[r.requests["status"].eq("completed"), column].to_numpy(float)
                                     for r in runs])
            values = values[np.isfinite(values)]
            if values.size == 0:
                continue
            ax.plot(np.quantile(values, levels), levels, color=colours[policy], lw=1.6,
                    label=f"{policy} ({served[policy]:.0%} served)")
            positive = values[values > 0]
            if positive.size:
                lows.append(positive.min())
                highs.append(positive.max())
        if not lows:
            _empty(ax)
        elif max(highs) / min(lows) > 50:
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("share of completed requests")
        ax.set_ylim(0, 1.01)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        panels.append(to_svg(fig))
    return panels


def slo_per_model(groups: dict[str, list[RunData]], models: list[str], colours: dict[str, str]) -> str:
    """Grouped bars: SLO attainment per model (and overall) per policy; whiskers show the 95% Wilson interval
    where a policy has at least three seeds."""
    labels = ["all models"] + models
    fig, axes = figure(max(6.0, 1.6 + 1.1 * len(labels)), 3.2)
    ax = axes[0][0]
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(labels))
    for i, (policy, runs) in enumerate(groups.items()):
        cols = [SLO] + [Column("", m, get("per_model", m, "slo_attainment"), True, kind="proportion",
                               trials=get("per_model", m, "requests")) for m in models]
        stats = [estimate(c, runs) for c in cols]
        means = np.array([100 * (s.mean or 0.0) for s in stats])
        below = [max(0.0, m - 100 * s.low) if s.low is not None else 0.0 for m, s in zip(means, stats)]
        above = [max(0.0, 100 * s.high - m) if s.high is not None else 0.0 for m, s in zip(means, stats)]
        ax.bar(x + (i - (len(groups) - 1) / 2) * width, means, width * 0.92, color=colours[policy], label=policy,
               yerr=[below, above] if any(below) or any(above) else None,
               error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "#374151"})
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 105)
    ax.set_ylabel("SLO attainment (%)")
    ax.grid(axis="x", visible=False)
    ax.legend(ncols=min(len(groups), 6), loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8)
    fig.tight_layout()
    return to_svg(fig)


def _bin_edges(groups: dict[str, list[RunData]]) -> np.ndarray:
    end = max((float(r.requests["finish_s"].max()) if r.requests["finish_s"].notna().any() else 0.0)
              for runs in groups.values() for r in runs)
    end = max(end, max((float(r.timeseries["time_s"].max()) for runs in groups.values() for r in runs
                        if len(r.timeseries)), default=0.0), 1e-6)
    return np.linspace(0.0, end, TIME_BINS + 1)


def _throughput(run: RunData, edges: np.ndarray) -> np.ndarray:
    """Output tokens/s completed per time bin, as a moving average over SMOOTH_BINS bins: a request's tokens all
    land in the bin where it finishes, which would make a raw series mostly spikes."""
    done = run.requests[run.requests["status"].eq("completed")]
    tokens, _ = np.histogram(done["finish_s"].to_numpy(float), bins=edges, weights=done["output_tokens"].to_numpy(float))
    return np.convolve(tokens / np.diff(edges), np.ones(SMOOTH_BINS) / SMOOTH_BINS, mode="same")


def held_between_samples(binned: pd.Series | pd.DataFrame):
    """Bins (by bin number) with a bin between two sampled ones holding the earlier one's value: the sampler passes
    over still stretches, in which nothing changed (see sim.engine.stillness)."""
    return binned.reindex(range(int(binned.index.min()), int(binned.index.max()) + 1)).ffill()


def _queue_depth(run: RunData, edges: np.ndarray) -> np.ndarray:
    if run.timeseries.empty:
        return np.full(len(edges) - 1, np.nan)
    per_time = run.timeseries.groupby("time_s")["queued"].sum()
    index = np.clip(np.digitize(per_time.index.to_numpy(float), edges) - 1, 0, len(edges) - 2)
    binned = held_between_samples(pd.Series(per_time.to_numpy(float)).groupby(index).mean())
    out = np.full(len(edges) - 1, np.nan)
    out[binned.index.to_numpy()] = binned.to_numpy()
    return out


def throughput_panels(groups: dict[str, list[RunData]], colours: dict[str, str]) -> list[str]:
    """One panel per policy, every panel on the same axes: output tokens/s (mean over seeds, shaded range over
    seeds) above requests queued."""
    edges = _bin_edges(groups)
    centres = (edges[:-1] + edges[1:]) / 2
    series = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # bins with no sample in any seed stay NaN (a gap)
        for policy, runs in groups.items():
            tokens = np.array([_throughput(r, edges) for r in runs])
            series[policy] = (tokens, np.nanmean([_queue_depth(r, edges) for r in runs], axis=0))
    top = max(1.0, max(float(t.max()) for t, _ in series.values()) * 1.05)
    depth_top = max(1.0, max((float(np.nanmax(q)) for _, q in series.values() if np.isfinite(q).any()), default=1.0) * 1.1)
    panels = []
    for policy, (tokens, depth) in series.items():
        fig, axes = figure(PANEL[0], 3.4, 2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
        upper, lower = axes[0][0], axes[1][0]
        if len(tokens) > 1:
            upper.fill_between(centres, tokens.min(axis=0), tokens.max(axis=0), color=colours[policy], alpha=0.2,
                               linewidth=0)
        upper.plot(centres, tokens.mean(axis=0), color=colours[policy], lw=1.2)
        sampled = np.isfinite(depth)  # bins without a sample are skipped, not drawn as gaps
        lower.plot(centres[sampled], depth[sampled], color=colours[policy], lw=1.0)
        upper.set_title(policy, fontsize=9, loc="left")
        upper.set_ylim(0, top)
        lower.set_ylim(0, depth_top)
        lower.set_xlim(0, edges[-1])
        upper.set_ylabel("output tokens/s")
        lower.set_ylabel("queued")
        lower.set_xlabel("simulated time (s)")
        fig.tight_layout()
        panels.append(to_svg(fig))
    return panels


def _overheads(run: RunData) -> dict[str, float]:
    lost = run.summary.get("lost_seconds", {})
    return {"reload": float(lost.get("reload", 0.0)), "unload": float(lost.get("unload", 0.0)),
            "kv": float(lost.get("kv_out", 0.0)) + float(lost.get("kv_in", 0.0)),
            "recompute": float(lost.get("recompute", 0.0))}


def overhead_bars(groups: dict[str, list[RunData]]) -> str:
    """Stacked bars per policy: request-seconds lost to reload, unload, KV transfer and recompute (mean over seeds)."""
    fig, axes = figure(9, 1.1 + 0.45 * len(groups), 1, 2, gridspec_kw={"width_ratios": [3, 2]})
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
