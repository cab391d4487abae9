"""Timing of torch work: warm-up, repeats, median and spread.

On a CUDA device a measurement is bracketed by CUDA events (GPU time of the
queued kernels, launch gaps included); on the CPU by ``time.perf_counter``
around the call. Either way the device is synchronised before the clock starts,
so no earlier work leaks into a sample.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Repeated measurements of one operation, in seconds."""

    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def max_s(self) -> float:
        return max(self.samples_s)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the repeats were."""
        return (self.max_s - self.min_s) / self.median_s if self.median_s > 0 else 0.0

    def scaled(self, factor: float) -> Timing:
        """The same measurements times ``factor`` (e.g. one layer's share of a run of several)."""
        return Timing(tuple(s * factor for s in self.samples_s))

    def record(self, **fields: object) -> dict:
        """A JSON-ready sample for the profile: the given fields plus the timing summary."""
        return dict(fields, median_s=self.median_s, min_s=self.min_s, max_s=self.max_s, repeats=len(self.samples_s))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], object], device: torch.device, warmup: int = 1, repeats: int = 3,
            setup: Callable[[], object] | None = None) -> Timing:
    """Time ``fn`` ``repeats`` times after ``warmup`` untimed calls; ``setup`` runs untimed before each call."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        samples.append(_time_once(fn, device))
    return Timing(tuple(samples))


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def wall_time(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one call including a final synchronise (for work that mixes host and device)."""
    synchronize(device)
    begin = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - begin


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def configure_cpu_threads() -> int:
    """Use every core we may run on for torch's intra-op pool, and flush denormals (they slow CPU math)."""
    cores = usable_cores()
    torch.set_num_threads(cores)
    torch.set_flush_denormal(True)
    return cores
