"""Per-policy timelines of the cluster: GPU memory by model (stacked) and which models sit on which GPU,
with loads, unloads and swaps marked. Drawn for the first seed of each policy."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from sim.reports.data import RunData
from sim.reports.svg import figure, to_svg

GIB = 2**30
TIME_BINS = 200
MARK_BINS = 500
SWAP_KINDS = {"preempt_swap": ("v", "#1d4ed8", "KV swap out"), "swap_in": ("^", "#0e7490", "KV swap in"),
              "preempt_recompute": ("x", "#b91c1c", "recompute preemption")}


def _span(run: RunData) -> float:
    ends = [float(run.summary.get("simulated_seconds") or 0.0)]
    if len(run.timeseries):
        ends.append(float(run.timeseries["time_s"].max()))
    if len(run.events):
        ends.append(float((run.events["time_s"] + run.events["duration_s"]).max()))
    return max(ends + [1e-6])


def memory_stacked(groups: dict[str, list[RunData]], models: list[str], model_colours: dict[str, str]) -> str:
    """One small panel per policy: GiB of weights + KV cache per model summed over all GPUs, stacked, over time."""
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = figure(12, 2.6 * rows + 0.4, rows, cols, sharey=True)
    flat = axes.ravel()
    for ax, (policy, runs) in zip(flat, groups.items()):
        frame = runs[0].timeseries
        frame = frame[(frame["gpu"] >= 0) & (frame["model"] != "")]
        ax.set_title(policy, fontsize=9, loc="left")
        if frame.empty:
            ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes, color="#9ca3af")
            continue
        edges = np.linspace(0, _span(runs[0]), TIME_BINS + 1)
        frame = frame.assign(gib=(frame["weight_bytes"] + frame["kv_bytes"]) / GIB)
        per_time = frame.pivot_table(index="time_s", columns="model", values="gib", aggfunc="sum", fill_value=0.0)
        index = np.clip(np.digitize(per_time.index.to_numpy(float), edges) - 1, 0, TIME_BINS - 1)
        binned = per_time.groupby(index).mean()
        centres = (edges[binned.index.to_numpy()] + edges[binned.index.to_numpy() + 1]) / 2
        present = [m for m in models if m in binned.columns]
        ax.stackplot(centres, [binned[m].to_numpy() for m in present], colors=[model_colours[m] for m in present],
                     labels=present, linewidth=0)
        ax.set_xlabel("simulated time (s)")
    for ax in flat[len(groups):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("GPU memory (GiB)")
    handles = [Patch(color=model_colours[m], label=m) for m in models]
    fig.legend(handles=handles, ncols=min(6, len(models)), loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8)
    fig.tight_layout()
    return to_svg(fig)


def _merge(intervals: list[tuple[float, float]], gap: float) -> list[tuple[float, float]]:
    """Join intervals closer than ``gap``: invisible at plot scale, and it keeps thrashing runs small."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start - merged[-1][1] <= gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e - s) for s, e in merged]


def residency(run: RunData) -> tuple[dict, dict]:
    """(gpu, model) → resident intervals and → loading/unloading intervals, from the event log
    (pairs that never logged a load are taken from the time-series samples)."""
    end = _span(run)
    resident: dict[tuple[int, str], list] = {}
    moving: dict[tuple[int, str], list] = {}
    events = run.events[run.events["kind"].isin(("load", "unload"))].sort_values("time_s", kind="stable")
    since: dict[tuple[int, str], float] = {}
    for time_s, kind, gpu, model, duration in zip(events["time_s"], events["kind"], events["gpu"], events["model"],
                                                  events["duration_s"]):
        key = (int(gpu), str(model))
        moving.setdefault(key, []).append((float(time_s), float(time_s) + float(duration)))
        if kind == "load":
            since[key] = float(time_s) + float(duration)
        elif key in since:
            resident.setdefault(key, []).append((since.pop(key), float(time_s)))
    for key, start in since.items():
        resident.setdefault(key, []).append((start, end))
    samples = run.timeseries[(run.timeseries["gpu"] >= 0) & (run.timeseries["model"] != "")]
    for (gpu, model), times in samples.groupby(["gpu", "model"])["time_s"]:
        key = (int(gpu), str(model))
        if key not in moving:
            resident[key] = [(float(times.min()), float(times.max()))]
    gap = end / 1500
    return ({k: _merge(v, gap) for k, v in resident.items()}, {k: _merge(v, gap) for k, v in moving.items()})


def _gpus(run: RunData) -> list[int]:
    found = set(run.timeseries.loc[run.timeseries["gpu"] >= 0, "gpu"].astype(int))
    found |= set(run.events.loc[run.events["gpu"] >= 0, "gpu"].astype(int))
    return sorted(found)


def residency_timeline(groups: dict[str, list[RunData]], models: list[str], model_colours: dict[str, str]) -> str:
    """For each policy, one row per GPU with a lane per model: resident (solid), loading/unloading (hatched),
    and swap / recompute preemptions as marks."""
    gpu_counts = [max(1, len(_gpus(runs[0]))) for runs in groups.values()]
    per_gpu = max(0.32, 0.06 * len(models) + 0.2)  # keep each model's lane readable when many models share a GPU
    heights = [per_gpu * n + 0.5 for n in gpu_counts]
    fig, axes = figure(12, sum(heights) + 0.6, len(groups), 1, gridspec_kw={"height_ratios": heights})
    lane = 0.8 / max(1, len(models))
    for ax, (policy, runs) in zip(axes[:, 0], groups.items()):
        run = runs[0]
        gpus = _gpus(run)
        row_of = {g: i for i, g in enumerate(gpus)}
        resident, moving = residency(run)
        for table, style in ((resident, {"alpha": 1.0}), (moving, {"alpha": 0.45, "hatch": "////"})):
            for (gpu, model), bars in table.items():
                if gpu not in row_of or model not in models:
                    continue
                y = row_of[gpu] - 0.4 + models.index(model) * lane
                ax.broken_barh(bars, (y, lane * 0.9), facecolors=model_colours[model], edgecolor="none", **style)
        span = _span(run)
        marks = run.events[run.events["kind"].isin(tuple(SWAP_KINDS)) & run.events["gpu"].isin(gpus)]
        for kind, (marker, colour, label) in SWAP_KINDS.items():
            rows = marks[marks["kind"].eq(kind)]
            if rows.empty:
                continue
            # One mark per GPU per time bin: thousands of preemptions would otherwise bloat the page.
            thinned = pd.DataFrame({"gpu": rows["gpu"].astype(int), "bin": (rows["time_s"] / span * MARK_BINS).astype(int)})
            thinned = thinned.drop_duplicates()
            ax.scatter((thinned["bin"] + 0.5) * span / MARK_BINS, [row_of[g] + 0.47 for g in thinned["gpu"]],
                       marker=marker, s=8, color=colour, linewidths=0.7, label=label, zorder=3)
        ax.set_yticks(range(len(gpus)), [f"GPU {g}" for g in gpus])
        ax.set_ylim(-0.55, len(gpus) - 0.4)
        ax.invert_yaxis()
        ax.set_xlim(0, span)
        ax.set_title(policy, fontsize=9, loc="left")
        ax.grid(axis="y", visible=False)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", bbox_to_anchor=(1.0, 1.25), ncols=3, fontsize=7)
    axes[-1][0].set_xlabel("simulated time (s)")
    handles = [Patch(color=model_colours[m], label=m) for m in models]
    handles.append(Patch(facecolor="#9ca3af", alpha=0.45, hatch="////", label="loading / unloading"))
    fig.legend(handles=handles, ncols=min(6, len(handles)), loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8)
    fig.tight_layout()
    return to_svg(fig)
