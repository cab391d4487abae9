"""A one-page picture of a trace: arrival rate over time per model, model shares, length distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import MmsimError
from sim.workload.stats import LengthHistogram, TraceStats
from sim.workload.writer import atomic_path

PLOT_SUFFIXES = (".png", ".svg")
RATE_POINTS = 200
"""Time bins in the rate plot: enough to show bursts, few enough to read."""


def plot_stats(stats: TraceStats, target: Path, title: str) -> None:
    """Write the picture to ``target`` (.png or .svg), atomically."""
    target = Path(target)
    if target.suffix.lower() not in PLOT_SUFFIXES:
        raise MmsimError(f"plot file must end in {' or '.join(PLOT_SUFFIXES)}", source=str(target))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ((rate_axes, share_axes), (prompt_axes, output_axes)) = plt.subplots(2, 2, figsize=(11, 7))
    figure.suptitle(title)
    _rate(rate_axes, stats)
    names = list(stats.models)
    share_axes.bar(names, [stats.models[name] / max(stats.requests, 1) for name in names])
    share_axes.set_ylabel("share of requests")
    share_axes.tick_params(axis="x", labelrotation=20)
    _lengths(prompt_axes, stats.prompt, "prompt tokens")
    _lengths(output_axes, stats.output, "output tokens")
    figure.tight_layout()
    with atomic_path(target) as temporary:
        figure.savefig(temporary, format=target.suffix[1:].lower())
    plt.close(figure)


def _rate(axes, stats: TraceStats) -> None:
    """Requests per second over time, one line per model, on at most RATE_POINTS bins."""
    length = max((len(counts) for counts in stats.timeline.values()), default=0)
    group = max(1, -(-length // RATE_POINTS))
    for name, counts in sorted(stats.timeline.items()):
        padded = np.zeros(-(-length // group) * group, dtype=np.int64)
        padded[: len(counts)] = counts
        per_bin = padded.reshape(-1, group).sum(axis=1)
        width_s = stats.bin_width_s * group
        axes.step(np.arange(len(per_bin)) * width_s, per_bin / width_s, where="post", label=name)
    axes.set_xlabel("time since first request (s)")
    axes.set_ylabel("requests per second")
    if stats.timeline:
        axes.legend(fontsize="small")


def _lengths(axes, histogram: LengthHistogram, label: str) -> None:
    """Histogram on logarithmic bins (lengths span orders of magnitude); lengths over a million are left out."""
    present = np.flatnonzero(histogram.counts)
    if len(present) == 0:
        return
    top = int(present[-1]) + 1
    edges = np.unique(np.append(np.geomspace(1, top, 50).round().astype(np.int64), top))
    axes.stairs(np.add.reduceat(histogram.counts[:top], edges[:-1]), edges)
    axes.set_xscale("log")
    axes.set_xlabel(label)
    axes.set_ylabel("requests")
