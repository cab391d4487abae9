"""Per-policy timelines of the cluster: GPU memory by model (stacked) and which models sit on which GPU,
with loads, unloads and swaps marked. Drawn for the first seed of each policy."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from sim.reports.data import RunData
from sim.reports.plots import held_between_samples
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


def _memory(run: RunData, models: list[str]) -> tuple[np.ndarray, pd.DataFrame] | None:
    """Bin centres and GiB per model (columns) over time for one run, or None without samples."""
    frame = run.timeseries
    frame = frame[(frame["gpu"] >= 0) & (frame["model"] != "")]
    if frame.empty:
        return None
    edges = np.linspace(0, _span(run), TIME_BINS + 1)
    frame = frame.assign(gib=(frame["weight_bytes"] + frame["kv_bytes"]) / GIB)
    per_time = frame.pivot_table(index="time_s", columns="model", values="gib", aggfunc="sum", fill_value=0.0,
                                 observed=True)
    index = np.clip(np.digitize(per_time.index.to_numpy(float), edges) - 1, 0, TIME_BINS - 1)
    binned = held_between_samples(per_time.groupby(index).mean())
    centres = (edges[binned.index.to_numpy()] + edges[binned.index.to_numpy() + 1]) / 2
    return centres, binned[[m for m in models if m in binned.columns]]


def memory_stacked(groups: dict[str, list[RunData]], models: list[str], model_colours: dict[str, str]) -> list[str]:
    """One panel per policy on shared axes: GiB of weights + KV cache per model summed over all GPUs, stacked,
    over time (first seed). The model legend is the page's, above the panels."""
    data = {policy: _memory(runs[0], models) for policy, runs in groups.items()}
    top = max([float(d[1].sum(axis=1).max()) for d in data.values() if d is not None] + [1.0]) * 1.05
    end = max(_span(runs[0]) for runs in groups.values())
    panels = []
    for policy, found in data.items():
        fig, axes = figure(4.4, 2.8)
        ax = axes[0][0]
        ax.set_title(policy, fontsize=9, loc="left")
        if found is None:
            ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes, color="#9ca3af")
        else:
            centres, binned = found
            ax.stackplot(centres, [binned[m].to_numpy() for m in binned.columns],
                         colors=[model_colours[m] for m in binned.columns], linewidth=0)
        ax.set_xlim(0, end)
        ax.set_ylim(0, top)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("GPU memory (GiB)")
        fig.tight_layout()
        panels.append(to_svg(fig))
    return panels


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


def residency_timeline(groups: dict[str, list[RunData]], models: list[str], model_colours: dict[str, str]) -> list[str]:
    """For each policy one figure, every one on the same time axis: a row per GPU with a lane per model, resident
    (solid) or loading/unloading (hatched), and swap / recompute preemptions as marks, with their legend on it."""
    per_gpu = max(0.32, 0.06 * len(models) + 0.2)  # keep each model's lane readable when many models share a GPU
    lane = 0.8 / max(1, len(models))
    end = max(_span(runs[0]) for runs in groups.values())
    panels = []
    for policy, runs in groups.items():
        run = runs[0]
        gpus = _gpus(run)
        fig, axes = figure(9, per_gpu * max(1, len(gpus)) + 1.0)
        ax = axes[0][0]
        row_of = {g: i for i, g in enumerate(gpus)}
        resident, moving = residency(run)
        for table, style in ((resident, {"alpha": 1.0}), (moving, {"alpha": 0.45, "hatch": "////"})):
            for (gpu, model), bars in table.items():
                if gpu not in row_of or model not in models:
                    continue
                y = row_of[gpu] - 0.4 + models.index(model) * lane
                ax.broken_barh(bars, (y, lane * 0.9), facecolors=model_colours[model], edgecolor="none", **style)
        marks = run.events[run.events["kind"].isin(tuple(SWAP_KINDS)) & run.events["gpu"].isin(gpus)]
        for kind, (marker, colour, label) in SWAP_KINDS.items():
            rows = marks[marks["kind"].eq(kind)]
            if rows.empty:
                continue
            # One mark per GPU per time bin: thousands of preemptions would otherwise bloat the page.
            thinned = pd.DataFrame({"gpu": rows["gpu"].astype(int), "bin": (rows["time_s"] / end * MARK_BINS).astype(int)})
            thinned = thinned.drop_duplicates()
            ax.scatter((thinned["bin"] + 0.5) * end / MARK_BINS, [row_of[g] + 0.47 for g in thinned["gpu"]],
                       marker=marker, s=8, color=colour, linewidths=0.7, label=label, zorder=3)
        ax.set_yticks(range(len(gpus)), [f"GPU {g}" for g in gpus])
        ax.set_ylim(-0.55, max(1, len(gpus)) - 0.4)
        ax.invert_yaxis()
        ax.set_xlim(0, end)
        ax.set_title(policy, fontsize=9, loc="left")
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("simulated time (s)")
        handles = ax.get_legend_handles_labels()[0]
        handles.append(Patch(facecolor="#9ca3af", alpha=0.45, hatch="////", label="loading / unloading"))
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=4, fontsize=7)
        fig.tight_layout()
        panels.append(to_svg(fig))
    return panels
