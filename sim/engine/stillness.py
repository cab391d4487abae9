"""Still stretches: spans of simulated time in which nothing can change until the next request arrives.

A trace whose next request comes a year after the last one finished would otherwise take a sample every few
seconds, and an autoscaler decision every ``interval_s``, through the whole year: millions of rows and
decisions that all say the same. The sampler (:mod:`sim.engine.sampler`) and the fleet controller
(:mod:`sim.fleet.controller`) pass over such a stretch to the first time on their own grid at or after the
next thing that happens, so the samples and decisions they do take are the ones they would have taken.
"""

from __future__ import annotations

import math

import simpy

INF = math.inf


def next_change_s(env: simpy.Environment, next_arrival_s: float, agenda_first_s: float, resting: object) -> float:
    """When anything next happens: the next arrival, the engine's first agenda entry, or a SimPy event other
    than ``resting`` (a pending event known to change nothing, e.g. a resting controller's next decision)."""
    soonest = min(next_arrival_s, agenda_first_s)
    for entry in env._queue:
        if entry[0] < soonest and entry[3] is not resting:
            soonest = entry[0]
    return soonest


def first_on_grid(now: float, interval_s: float, change_s: float) -> float:
    """The first time ``now + k * interval_s`` (k >= 1) at or after ``change_s``."""
    return now + interval_s * max(1, math.ceil((change_s - now) / interval_s))
