"""The workload's requests entering the engine at their arrival times.

Arrivals are not SimPy events: :func:`run` merges the (time-sorted) request
stream into SimPy's event queue, so that a request costs no event of its own.
At an instant that has both, the arrivals come first, as URGENT events that
were scheduled earlier would: an iteration ending at the same instant already
sees them (the rule fast-forward and per-iteration modes share).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Final, Iterable, Iterator, cast

import numpy as np
import simpy
from simpy.core import EmptySchedule, StopSimulation

from sim.engine.engine import Engine
from sim.engine.events import AgendaEntry, simpy_event_first
from sim.engine.recorder import Recorder
from sim.engine.request import Request

# Final: compiled, a module's other globals are looked up in its dict at every use.
INF: Final = math.inf
SAME_INSTANT_EVENTS: Final = 2_000_000
"""Events processed between two looks at the clock; a clock that has not moved in that many is a livelock."""


class ArrivalStream:
    """The workload's requests, chunk by chunk, with the time of the next one always at hand.

    ``error_cv`` > 0 gives each request a predicted output length off by lognormal noise, for
    policies that schedule on predicted lengths."""

    def __init__(self, engine: Engine, chunks: Iterable, error_cv: float, rng: np.random.Generator,
                 on_progress: Callable[[int], None] | None):
        self.engine = engine
        self.error_cv = error_cv
        self.rng = rng
        self.on_progress = on_progress
        self.next_time = INF
        self.seen = 0
        self._chunks: Iterator = iter(chunks)
        self._arrival: list[float] = []
        self._model: list[int] = []
        self._prompt: list[int] = []
        self._output: list[int] = []
        self._predicted: list[int] = []
        self._priority: list[int] = []
        self._prefix_ids: list | None = None
        self._slo_class: list[int] | None = None
        self._first_id = 0
        self._next = 0
        self._load_chunk()

    def _load_chunk(self) -> None:
        """Move on to the next non-empty chunk; with none left, the engine is told arrivals are done."""
        for chunk in self._chunks:
            n = len(chunk)
            if n == 0:
                continue
            index = self.engine.model_index
            self._arrival = chunk.arrival_s.astype(np.float64).tolist()
            self._model = [index.get(name, -1) for name in chunk.model.tolist()]
            self._prompt = chunk.prompt_tokens.astype(np.int64).tolist()
            self._output = chunk.output_tokens.astype(np.int64).tolist()
            self._predicted = self._predict(chunk.output_tokens, n).tolist()
            priority = chunk.priority if chunk.priority is not None else np.zeros(n, np.int64)
            self._priority = np.asarray(priority, np.int64).tolist()
            self._prefix_ids = _prefix_column(chunk.prefix_ids) if self.engine.config.prefix_caching else None
            self._slo_class = _class_column(chunk.slo_class, self.engine.recorder)
            self._first_id = int(chunk.first_id)
            self._next = 0
            self.next_time = self._arrival[0]
            return
        self.next_time = INF
        # Let go of the last chunk: the sampler and fleet controller ask this stream for the next arrival, so it
        # lives as long as the run's result does.
        self._arrival, self._model, self._prompt, self._output, self._predicted, self._priority = [], [], [], [], [], []
        self._prefix_ids = self._slo_class = None
        self._chunks = iter(())
        self.engine.arrivals_done = True
        self.engine.check_done()

    def _predict(self, output_tokens: np.ndarray, n: int) -> np.ndarray:
        if self.error_cv <= 0:
            return np.asarray(output_tokens, np.int64)
        sigma = np.sqrt(np.log1p(self.error_cv**2))
        noise = self.rng.lognormal(-sigma**2 / 2, sigma, n)
        return np.maximum(1, np.rint(output_tokens * noise)).astype(np.int64)

    def release(self) -> None:
        """Hand the engine every request arriving at ``next_time`` (the simulation's now)."""
        engine, now = self.engine, self.next_time
        while self.next_time == now:
            i = self._next
            model = self._model[i]
            request = Request(self._first_id + i, max(model, 0), self._arrival[i], self._prompt[i], self._output[i],
                              self._predicted[i], self._priority[i],
                              None if self._prefix_ids is None else self._prefix_ids[i],
                              -1 if self._slo_class is None else self._slo_class[i])
            if model < 0:
                engine.drop(request, "model_not_served")
            else:
                engine.arrive(request)
            self._next = i + 1
            if self._next < len(self._arrival):
                self.next_time = self._arrival[self._next]
            else:
                self.seen += len(self._arrival)
                if self.on_progress is not None:
                    self.on_progress(self.seen)
                self._load_chunk()


def _prefix_column(prefix_ids: np.ndarray | None) -> list | None:
    """A chunk's prefix ids as one tuple (or None) per request; None when no request has any."""
    if prefix_ids is None:
        return None
    column = [_id_tuple(ids) if ids is not None and len(ids) else None for ids in prefix_ids.tolist()]
    return column if any(ids is not None for ids in column) else None


def _class_column(labels: np.ndarray | None, recorder: Recorder) -> list[int] | None:
    """A chunk's SLO classes as codes into the recorder's class names (-1: none); None when no request has one."""
    if labels is None:
        return None
    codes = [recorder.slo_class_code(label) for label in labels.tolist()]
    return codes if any(value >= 0 for value in codes) else None


def _id_tuple(ids: Iterable[object]) -> tuple[int, ...]:
    """One request's prefix ids as a tuple of Python ints. The trace readers give those already; a chunk built
    through the Python API may hold numpy arrays or numpy integers, which the compiled engine refuses
    (checked on the first id only, to keep this O(1) a request)."""
    values = tuple(ids)
    if type(values[0]) is int:
        return cast("tuple[int, ...]", values)
    return tuple(int(value) for value in values)  # type: ignore[call-overload]


def run(env: simpy.Environment, engine: Engine, arrivals: ArrivalStream) -> None:
    """Process SimPy's events and the arrivals in time order until every request is done, or until
    nothing is left that could make progress.

    This is ``Environment.run(until=engine.all_done)`` with the arrival stream merged in; moving
    the clock to an arrival sets SimPy's ``_now`` (the GPU loops read it). The engine's agenda (the GPU loops'
    step ends, the sampler's samples: :mod:`sim.engine.events`) is merged in the same way, in SimPy's order."""
    queue: list[Any] = env._queue
    agenda = engine.agenda
    engine.all_done.callbacks.append(StopSimulation.callback)
    steps, instant = 0, -1.0
    try:
        while True:
            entry: tuple[float, int, int, object] | None = queue[0] if queue else None
            due: AgendaEntry | None = agenda.first()
            simpy_next = entry is not None and (due is None or simpy_event_first(entry, due))
            next_s = INF
            if simpy_next:
                assert entry is not None
                next_s = entry[0]
            elif due is not None:
                next_s = due.due_s
            if arrivals.next_time <= next_s:
                if arrivals.next_time == INF:
                    return
                env._now = arrivals.next_time
                arrivals.release()
            else:
                if simpy_next:
                    env.step()
                else:
                    agenda.pop()
                    env._now = next_s
                    assert due is not None
                    due.entry_due(next_s)  # the time, not read back from SimPy: compiled, that is a generic lookup
                steps += 1
                if steps >= SAME_INSTANT_EVENTS:
                    # Millions of events without the clock moving: a loop of decisions that take no time.
                    if env._now == instant:
                        engine.progress.stop(env._now)
                    steps, instant = 0, env._now
    except (StopSimulation, EmptySchedule):
        return
