"""The run's periodic samples of GPU memory, queues and utilisation, due on the engine's agenda.

A sample is due every ``interval_s`` simulated seconds. As a SimPy process it cost a Timeout event, a generator
resumed through SimPy's machinery and interpreted Python each time: an eighth of a long single-model run's
loop. Here it is a due time on the agenda (as a GPU's step end is: see :mod:`sim.engine.events`), handed to it
by :func:`sim.engine.arrivals.run`. A sample comes after everything else due at its time: it shows the state
the instant leaves, whichever events were scheduled first (which, passing over a still stretch, changes).

A still stretch (:mod:`sim.engine.stillness`) is passed over: a trace whose next request comes a year later
would otherwise take six million identical samples on every GPU before it.
"""

from __future__ import annotations

from typing import Callable

import simpy

from sim.engine.engine import Engine
from sim.engine.events import AgendaEntry
from sim.engine.stillness import INF, first_on_grid, next_change_s


class Sampler(AgendaEntry):
    """Takes a row per instance of every GPU (and per model with requests no instance holds) every ``interval_s``,
    and asks the progress guard whether the run still moves; it stops once the run has nothing left to do.

    While the run is still (nothing computing or loading, and the guard has nothing to catch), the next sample
    is the first one on the grid at or after the next event (``next_arrival_s`` gives the workload's); that
    sample's busy share is over the whole time since the previous sample."""

    def __init__(self, env: simpy.Environment, engine: Engine, interval_s: float,
                 next_arrival_s: Callable[[], float]):
        super().__init__()
        self.env = env
        self.engine = engine
        self.interval_s = interval_s
        self.next_arrival_s = next_arrival_s  # the next request's arrival time (inf: none)
        self._busy_before_s = [0.0] * len(engine.gpus)  # each GPU's busy seconds at the previous sample
        self._elapsed_s = interval_s  # simulated seconds the next sample's busy share is over
        engine.agenda.schedule_last(self, env._now + interval_s)

    def entry_due(self, now: float) -> None:
        """A sample is due (SimPy's clock stands at ``now``): take it, and queue the next while the run goes on."""
        engine = self.engine
        engine.recorder.sample_gpus(now, engine.gpus, self._busy_before_s, self._elapsed_s)
        engine.recorder.sample_pending(now, engine.pending)
        engine.progress.check(now)
        if engine.all_done.triggered:
            return
        self._elapsed_s = self.interval_s
        if not engine.settled():
            engine.agenda.schedule_last(self, now + self.interval_s)
            return
        next_arrival_s = self.next_arrival_s()
        first = engine.agenda.first()
        fleet = engine.fleet
        resting = fleet.resting_tick(next_arrival_s) if fleet is not None else None  # type: ignore[attr-defined]
        change_s = next_change_s(self.env, next_arrival_s, first.due_s if first is not None else INF, resting)
        if change_s == INF:
            return  # nothing left that could run: let the run end
        quiet = engine.outstanding == 0 or engine.progress.quiet()
        due_s = now + self.interval_s
        if change_s > due_s and quiet:
            # Nothing happens before change_s and the guard would find nothing to stop: skip to the first grid
            # sample at or after it.
            due_s = first_on_grid(now, self.interval_s, change_s)
            self._elapsed_s = due_s - now
        if quiet and engine.outstanding:
            engine.progress.seen_quiet(min(due_s, change_s))  # quiet until then: nothing happens before
        engine.agenda.schedule_last(self, due_s)
