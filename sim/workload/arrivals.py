"""Arrival processes: Poisson, Gamma with a target CV, rate series and ServeGen window files.

Every process is a list of windows, each a renewal process restarted at the
window's start (exact for Poisson; for bursty windows the restart is the usual
approximation, as in ServeGen). Window ``i`` draws from its own random stream
(seed, ARRIVAL_STREAM, i) in fixed-size batches, so the times depend only on
the seed, never on how many rows the caller asks for at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import MmsimError
from sim.files import read_text
from sim.workload.config import (MAX_RATE_PER_S, MAX_TIME_S, GammaArrivals, PoissonArrivals, RateSeriesArrivals,
                                 ServeGenArrivals)
from sim.workload.textfiles import resolve_input

ARRIVAL_STREAM = 0
BATCH = 4096
"""Inter-arrival times drawn per step; fixed so that results do not depend on chunk sizes."""
SERVEGEN_COLUMNS = ["window_start_s", "rate_rps", "cv", "dist", "param1", "param2"]


def random_stream(seed: int, *key: int) -> np.random.Generator:
    """An independent generator for one purpose (``key``) of a seeded run."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


@dataclass(frozen=True)
class Window:
    """A stretch of time with one inter-arrival distribution (``shape`` per ``dist``; mean 1/rate)."""

    start_s: float
    rate_per_s: float
    dist: str = "exponential"
    shape: float = 1.0

    def gaps(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` inter-arrival times in seconds."""
        mean_s = 1.0 / self.rate_per_s
        if self.dist == "exponential":
            return rng.exponential(mean_s, count)
        if self.dist == "gamma":
            return rng.gamma(self.shape, mean_s / self.shape, count)
        return rng.weibull(self.shape, count) * (mean_s / math.gamma(1.0 + 1.0 / self.shape))


def gamma_window(start_s: float, rate_per_s: float, cv: float) -> Window:
    """A window with gamma inter-arrivals of the given CV (shape 1/cv²); CV 1 is Poisson."""
    if cv == 1.0:
        return Window(start_s, rate_per_s)
    return Window(start_s, rate_per_s, "gamma", 1.0 / cv**2)


def windows_for(spec, base_dir: Path | None = None, duration_s: float | None = None) -> list[Window]:
    """The windows of an arrival spec, rescaled to its ``rate_per_s`` target where one is given.

    The target is the time-average rate over [0, duration_s), or over the
    windows when there is no duration.
    """
    if isinstance(spec, PoissonArrivals):
        return [Window(0.0, spec.rate_per_s)]
    if isinstance(spec, GammaArrivals):
        return [gamma_window(0.0, spec.rate_per_s, spec.cv)]
    if isinstance(spec, RateSeriesArrivals):
        windows = [gamma_window(w[0], w[1], w[2] if len(w) == 3 else 1.0) for w in spec.windows]
    elif isinstance(spec, ServeGenArrivals):
        windows = read_servegen(resolve_input(spec.path, base_dir, "arrivals.path"))
    else:
        raise TypeError(f"not an arrival spec: {spec!r}")
    if spec.rate_per_s is not None:
        mean = mean_rate(windows, duration_s)
        if mean <= 0:
            raise MmsimError("cannot rescale to rate_per_s: every window has rate 0", field="arrivals.rate_per_s")
        windows = [Window(w.start_s, w.rate_per_s * spec.rate_per_s / mean, w.dist, w.shape) for w in windows]
    return windows


def mean_rate(windows: list[Window], duration_s: float | None = None) -> float:
    """Time-average rate over [0, duration_s); without a duration, over the windows with the last
    counted as long as the one before it (time before the first window has rate 0)."""
    starts = np.array([w.start_s for w in windows])
    if duration_s is None:
        if len(windows) == 1:
            return windows[0].rate_per_s
        duration_s = starts[-1] + starts[-1] - starts[-2]
    ends = np.minimum(np.append(starts[1:], np.inf), duration_s)
    lengths = np.clip(ends - starts, 0, None)
    return float(np.dot(lengths, [w.rate_per_s for w in windows]) / duration_s)


def read_servegen(path: Path) -> list[Window]:
    """Windows of a ServeGen ``chunk-N-trace.csv``; the fitted shape is kept, the scale follows ``rate_rps``.

    ServeGen fits each window's inter-arrivals (Gamma and Weibull: param1 is the
    shape); its fitted scales are not always consistent with the window's
    measured rate, so the rate column sets the mean.
    """
    text = read_text(path, "ServeGen window file")
    windows: list[Window] = []
    for line, content in enumerate(text.splitlines(), start=1):
        if not content.strip():
            continue
        where = {"source": str(path), "field": f"line {line}"}
        fields = [field.strip() for field in content.split(",")]
        if len(fields) != len(SERVEGEN_COLUMNS):
            raise MmsimError(f"expected {len(SERVEGEN_COLUMNS)} fields ({','.join(SERVEGEN_COLUMNS)}), "
                             f"found {len(fields)}", **where)
        try:
            start_s, rate, shape = float(fields[0]), float(fields[1]), float(fields[4] or 0)
        except ValueError:
            raise MmsimError("window_start_s, rate_rps and param1 must be numbers", **where) from None
        if not (0 <= start_s <= MAX_TIME_S and 0 <= rate <= MAX_RATE_PER_S):
            raise MmsimError(f"window_start_s must be from 0 to {MAX_TIME_S:g} and rate_rps from 0 to "
                             f"{MAX_RATE_PER_S:g}", **where)
        if windows and start_s <= windows[-1].start_s:
            raise MmsimError("window_start_s must increase from line to line", **where)
        dist = fields[3].lower()
        if rate == 0 or dist == "":
            windows.append(Window(start_s, 0.0))
        elif dist == "exponential":
            windows.append(Window(start_s, rate))
        elif dist in ("gamma", "weibull"):
            if not 1e-3 <= shape <= 1e3:
                raise MmsimError(f"param1 (the {fields[3]} shape) must be from 0.001 to 1000", **where)
            windows.append(Window(start_s, rate, dist, shape))
        else:
            raise MmsimError(f"unknown dist {fields[3]!r}; expected Gamma, Weibull, Exponential or empty", **where)
    if not windows:
        raise MmsimError("no windows in the file", source=str(path))
    return windows


class ArrivalStream:
    """Arrival times of a list of windows, handed out ``take(n)`` at a time until ``duration_s`` (if any)."""

    def __init__(self, windows: list[Window], seed: int, duration_s: float | None = None):
        self._times = self._generate(windows, seed, math.inf if duration_s is None else duration_s)
        self._pending = np.empty(0)

    @staticmethod
    def _generate(windows: list[Window], seed: int, duration_s: float) -> Iterator[np.ndarray]:
        """Batches of arrival times, window after window, each from its own random stream."""
        for index, window in enumerate(windows):
            end_s = min(windows[index + 1].start_s if index + 1 < len(windows) else math.inf, duration_s)
            if window.rate_per_s <= 0 or window.start_s >= end_s:
                continue
            rng = random_stream(seed, ARRIVAL_STREAM, index)
            now_s = window.start_s
            while True:
                with np.errstate(over="ignore"):  # absurdly low rates overflow to inf: past the end, harmless
                    times = now_s + np.cumsum(window.gaps(rng, BATCH))
                inside = times[times < end_s]
                if len(inside):
                    yield inside
                if len(inside) < BATCH:
                    break
                now_s = times[-1]

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` arrival times (fewer only when the process has ended)."""
        parts, have = [self._pending], len(self._pending)
        while have < count:
            batch = next(self._times, None)
            if batch is None:
                break
            parts.append(batch)
            have += len(batch)
        times = np.concatenate(parts)
        self._pending = times[count:]
        return times[:count]
