"""Timing of torch work: warm-up, repeats, and median, min and max of the repeats.

On a CUDA device a measurement is bracketed by CUDA events (GPU time of the
queued kernels, launch gaps included); on the CPU by ``time.perf_counter``
around the call. Either way the device is synchronised before the clock starts,
so no earlier work leaks into a sample.

Each measurement keeps median, min and max. Fits use ``typical_s``: the median
of CUDA-event timings, but the minimum of wall-clock timings on the CPU, because
host timings on a shared machine are inflated by whatever else runs there (with
all cores in torch's thread pool one busy core stalls every parallel region),
and the best of several repeats is the estimate least disturbed by it.
Validation uses the same statistic, so both sides of the comparison agree.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

_SMALLEST_SUBNORMAL = 5e-324


@dataclass(frozen=True)
class Timing:
    """Repeated measurements of one operation, in seconds, and which statistic stands for them."""

    samples_s: tuple[float, ...]
    statistic: str = "median"  # "median" (CUDA events) or "min" (host wall clock)

    @classmethod
    def of(cls, samples_s: list[float] | tuple[float, ...], device: torch.device) -> Timing:
        return cls(tuple(samples_s), typical_statistic(device))

    @property
    def typical_s(self) -> float:
        return self.median_s if self.statistic == "median" else self.min_s

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def max_s(self) -> float:
        return max(self.samples_s)

    def scaled(self, factor: float) -> Timing:
        """The same measurements times ``factor`` (e.g. one layer's share of a run of several)."""
        return Timing(tuple(s * factor for s in self.samples_s), self.statistic)

    def record(self, **fields: object) -> dict:
        """A JSON-ready sample for the profile: the given fields plus the timing summary."""
        return dict(fields, typical_s=self.typical_s, statistic=self.statistic, median_s=self.median_s, min_s=self.min_s,
                    max_s=self.max_s, repeats=len(self.samples_s))


def typical_statistic(device: torch.device) -> str:
    """Median for CUDA-event timings, minimum for host wall-clock timings (see the module docstring)."""
    return "median" if device.type == "cuda" else "min"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], object], device: torch.device, warmup: int = 1, repeats: int = 3) -> Timing:
    """Time ``fn`` ``repeats`` times after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        samples.append(time_once(fn, device))
    return Timing.of(samples, device)


def measure_rounds(makers: list[Callable[[], Callable[[], object]]], device: torch.device, warmup: int, repeats: int,
                   tick: Callable[[int, int], None]) -> list[Timing]:
    """Time several operations in ``repeats`` rounds, each operation once per round.

    Each maker builds its operation (allocating its inputs, untimed) and returns
    the call to time; the inputs are dropped after the call, so only one
    operation's memory is held at a time. Interleaving spreads each operation's
    repeats over the whole benchmark, so a burst of load from another process
    inflates one repeat of several points, not every repeat of one point (which
    would bend the fitted curve). ``tick(round, index)`` follows each call;
    the first round also runs ``warmup`` untimed calls of each operation.
    """
    samples: list[list[float]] = [[] for _ in makers]
    for round_index in range(repeats):
        for index, make in enumerate(makers):
            fn = make()
            for _ in range(warmup if round_index == 0 else 0):
                fn()
            synchronize(device)
            samples[index].append(time_once(fn, device))
            del fn
            tick(round_index, index)
    return [Timing.of(s, device) for s in samples]


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call: CUDA events on a GPU, the wall clock on the CPU (see the module docstring)."""
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


def idle_cores() -> int:
    """Cores we may run on, less those other processes keep busy (the 1-minute load average), at least one.

    Torch's CPU kernels split work across threads and wait for the slowest; a
    thread sharing its core with another busy process stalls the whole
    operation, so on a loaded machine fewer threads run faster and far steadier.
    """
    cores = usable_cores()
    try:
        busy = int(os.getloadavg()[0])
    except OSError:
        busy = 0
    return max(1, cores - busy)


@contextmanager
def configured(device: torch.device, threads: int | None = None) -> Iterator[None]:
    """Within the block: ``device`` current (CUDA events record on the current device), torch's CPU thread pool
    sized to ``threads`` (or the idle cores), and denormals flushed (they slow CPU math).

    Both settings are process-wide, so they are put back on the way out: flushing denormals left on would change
    float arithmetic for everything the caller's process runs after a calibration.
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    threads_before, flushing_before = torch.get_num_threads(), flushing_denormals()
    torch.set_num_threads(threads or idle_cores())
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(flushing_before)
        torch.set_num_threads(threads_before)


def flushing_denormals() -> bool:
    """Whether this thread's floating-point unit treats subnormal numbers as zero."""
    smallest_subnormal = _SMALLEST_SUBNORMAL
    return smallest_subnormal == 0.0
