"""Summary statistics of a request stream, accumulated chunk by chunk.

Lengths are counted in exact histograms (one counter per token count up to
``HISTOGRAM_TOKENS``, larger values kept as a list), so percentiles are exact
without holding the trace. Percentiles are the smallest value with at least
q% of requests at or below it (numpy's ``inverted_cdf``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pandas as pd

from sim.workload.chunk import RequestChunk
from sim.workload.reuse import PrefixReuse

HISTOGRAM_TOKENS = 1 << 20
PERCENTILES = (50, 90, 99)
TIMELINE_BINS = 1 << 16
"""Arrivals are also counted per time bin (for plots); bins double in width when the span outgrows this many."""


class LengthHistogram:
    """Exact distribution of whole-number lengths >= 1."""

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)
        self.large: list[np.ndarray] = []
        self.total = 0
        self.sum = 0

    def add(self, values: np.ndarray) -> None:
        """Count more lengths."""
        small = values[values < HISTOGRAM_TOKENS]
        if len(small) < len(values):
            self.large.append(values[values >= HISTOGRAM_TOKENS])
        counts = np.bincount(small, minlength=len(self.counts))
        counts[: len(self.counts)] += self.counts
        self.counts = counts
        self.total += len(values)
        self.sum += int(values.sum())

    def percentile(self, q: float) -> int | None:
        """The smallest length with at least q% of the counted lengths at or below it."""
        if self.total == 0:
            return None
        rank = max(1, math.ceil(q / 100 * self.total))
        cumulative = np.cumsum(self.counts)
        small = int(cumulative[-1]) if len(cumulative) else 0  # every length may be above the histogram
        if rank <= small:
            return int(np.searchsorted(cumulative, rank))
        large = np.sort(np.concatenate(self.large))
        return int(large[rank - small - 1])

    def summary(self) -> dict:
        """Mean, percentiles and maximum (None when nothing was counted)."""
        if self.total == 0:
            return {"mean": None, **{f"p{q}": None for q in PERCENTILES}, "max": None}
        largest = int(np.concatenate(self.large).max()) if self.large else int(np.flatnonzero(self.counts)[-1])
        return {"mean": self.sum / self.total, **{f"p{q}": self.percentile(q) for q in PERCENTILES}, "max": largest}


class TraceStats:
    """Counts, span, rate, burstiness, model shares, requests per SLO class and length distributions of a request
    stream."""

    def __init__(self, prefix_block_tokens: int = 512):
        self.requests = 0
        self.reuse = PrefixReuse(prefix_block_tokens)
        self.has_prefix_ids = False
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.gap_sum_s = 0.0
        self.gap_square_sum_s2 = 0.0
        self.models: Counter[str] = Counter()
        self.slo_classes: Counter[str] = Counter()  # requests per SLO class label (rows without one: none)
        self.prompt = LengthHistogram()
        self.output = LengthHistogram()
        self.bin_width_s = 1.0
        self.timeline: dict[str, np.ndarray] = {}

    def add(self, chunk: RequestChunk) -> None:
        """Account for the next chunk of the stream (chunks must come in arrival order)."""
        if len(chunk) == 0:
            return
        times = chunk.arrival_s
        if self.first_s is None:
            self.first_s = float(times[0])
            gaps = np.diff(times)
        else:
            gaps = np.diff(np.concatenate([[self.last_s], times]))
        self.last_s = float(times[-1])
        self.gap_sum_s += float(gaps.sum())
        self.gap_square_sum_s2 += float(np.dot(gaps, gaps))
        self.requests += len(chunk)
        codes, names = pd.factorize(chunk.model)
        counts = np.bincount(codes, minlength=len(names))
        self.models.update(dict(zip(names.tolist(), counts.tolist())))
        self.prompt.add(chunk.prompt_tokens)
        self.output.add(chunk.output_tokens)
        self._count_times(chunk.arrival_s, codes, names.tolist())
        if chunk.slo_class is not None:
            self._count_classes(chunk.slo_class)
        if chunk.prefix_ids is not None:
            self.has_prefix_ids = True
        self.reuse.add(chunk)

    def _count_classes(self, labels: np.ndarray) -> None:
        """Add the chunk's SLO class labels (None or empty: no class) to the per-class counts."""
        codes, names = pd.factorize(labels)  # None: code -1
        counts = np.bincount(codes[codes >= 0], minlength=len(names))
        self.slo_classes.update({name: count for name, count in zip(names.tolist(), counts.tolist()) if name})

    def _count_times(self, arrival_s: np.ndarray, codes: np.ndarray, names: list[str]) -> None:
        """Add arrivals to the per-model timeline, widening its bins when the span outgrows them."""
        assert self.first_s is not None and self.last_s is not None  # add() sets both first
        while (self.last_s - self.first_s) / self.bin_width_s >= TIMELINE_BINS:
            self.bin_width_s *= 2
            for name, counts in self.timeline.items():
                if len(counts) % 2:
                    counts = np.append(counts, 0)
                self.timeline[name] = counts.reshape(-1, 2).sum(axis=1)
        bins = ((arrival_s - self.first_s) / self.bin_width_s).astype(np.int64)
        for code, name in enumerate(names):
            counts = np.bincount(bins[codes == code])
            current = self.timeline.get(name, np.zeros(0, dtype=np.int64))
            size = max(len(current), len(counts))
            merged = np.zeros(size, dtype=np.int64)
            merged[: len(current)] += current
            merged[: len(counts)] += counts
            self.timeline[name] = merged

    def summary(self) -> dict:
        """The JSON summary (``--json``): keys as documented in traces/README.md."""
        span_s = (self.last_s - self.first_s) if self.first_s is not None and self.last_s is not None else 0.0
        gaps = self.requests - 1
        cv = None
        if gaps >= 1 and self.gap_sum_s > 0:
            mean = self.gap_sum_s / gaps
            variance = max(self.gap_square_sum_s2 / gaps - mean**2, 0.0)
            cv = math.sqrt(variance) / mean
        return {
            "requests": self.requests,
            "span_s": span_s,
            "rate_per_s": self.requests / span_s if span_s > 0 else None,
            "interarrival_cv": cv,
            "first_arrival_s": self.first_s,
            "last_arrival_s": self.last_s,
            "models": {name: count / self.requests for name, count in sorted(self.models.items())},
            "model_requests": dict(sorted(self.models.items())),
            "prompt_tokens": self.prompt.summary(),
            "output_tokens": self.output.summary(),
            "prefix_reuse": self._reuse_summary(),
            # Only for a trace whose rows have classes: a trace without them summarises as before.
            **({"slo_class_requests": dict(sorted(self.slo_classes.items()))} if self.slo_classes else {}),
        }

    def _reuse_summary(self) -> dict | None:
        """The ideal prefix reuse (see :mod:`sim.workload.reuse`), when the trace names prefixes."""
        if not self.has_prefix_ids:
            return None
        return {"block_tokens": self.reuse.block_tokens, "share": self.reuse.overall(),
                "per_model": dict(sorted(self.reuse.shares().items()))}


def trace_stats(chunks: Iterable[RequestChunk], prefix_block_tokens: int = 512) -> TraceStats:
    """Statistics of a whole stream (``prefix_block_tokens``: prompt tokens per prefix id)."""
    stats = TraceStats(prefix_block_tokens)
    for chunk in chunks:
        stats.add(chunk)
    return stats
