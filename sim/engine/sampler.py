"""The run's periodic samples of GPU memory, queues and utilisation, due on the engine's agenda.

A sample is due every ``interval_s`` simulated seconds. As a SimPy process it cost a Timeout event, a generator
resumed through SimPy's machinery and interpreted Python each time: an eighth of a long single-model run's
loop. Here it is a due time on the agenda (as a GPU's step end is: see :mod:`sim.engine.events`), handed to it
by :func:`sim.engine.arrivals.run` in the order SimPy would have processed the Timeout it replaces.
"""

from __future__ import annotations

import simpy

from sim.engine.engine import Engine
from sim.engine.events import AgendaEntry


class Sampler(AgendaEntry):
    """Takes a row per instance of every GPU (and per model with requests no instance holds) every ``interval_s``,
    and asks the progress guard whether the run still moves; it stops once the run has nothing left to do."""

    def __init__(self, env: simpy.Environment, engine: Engine, interval_s: float):
        super().__init__()
        self.env = env
        self.engine = engine
        self.interval_s = interval_s
        self._busy_before_s = [0.0] * len(engine.gpus)  # each GPU's busy seconds at the previous sample
        engine.agenda.schedule(self, env._now + interval_s)

    def entry_due(self, now: float) -> None:
        """A sample is due (SimPy's clock stands at ``now``): take it, and queue the next while the run goes on."""
        engine = self.engine
        engine.recorder.sample_gpus(now, engine.gpus, self._busy_before_s, self.interval_s)
        engine.recorder.sample_pending(now, engine.pending)
        engine.progress.check(now)
        if engine.all_done.triggered:
            return
        if engine.arrivals_done and engine.settled() and not self.env._queue and engine.agenda.first() is None:
            return  # nothing left that could run: let the run end (policy timers still pending keep it going)
        engine.agenda.schedule(self, now + self.interval_s)
