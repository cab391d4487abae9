"""SimPy's event queue, used directly: entries that are not SimPy events, and processing an event on the spot.

A GPU step's end costs one queue entry and no SimPy event: the entry's event is the GPU itself, which
:func:`sim.engine.arrivals.run` hands the entry to (a SimPy event and its callback list, made every step,
cost more than the step's own bookkeeping). The entry is SimPy's own (time, priority, event id), so it is
ordered among SimPy's events exactly as an event scheduled there would be.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Final

import simpy
from simpy.core import NORMAL

NORMAL_PRIORITY: Final = NORMAL  # Final: compiled, other globals are looked up in the module's dict at every use
HEAPPUSH: Final = heapq.heappush


class EntryQueue:
    """An environment's event queue and event ids, held for the entries of one owner."""

    def __init__(self, env: simpy.Environment):
        self.queue: list[Any] = env._queue
        self.next_eid: Callable[[], int] = env._eid.__next__  # not next(...): compiled, a builtins lookup each call

    def schedule(self, at_s: float, owner: object) -> int:
        """Queue an entry for ``owner`` at ``at_s``, at SimPy's NORMAL priority (as a Timeout's); returns its event
        id, which tells this entry from the owner's earlier ones."""
        eid = self.next_eid()
        HEAPPUSH(self.queue, (at_s, NORMAL_PRIORITY, eid, owner))
        return eid


def process_now(event: simpy.Event) -> None:
    """Trigger ``event`` and run its callbacks now, as ``Environment.step`` would had it just come due; unlike
    ``succeed``, which queues it behind whatever else is due at this instant."""
    event._ok, event._value = True, None
    callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]  # SimPy's mark of "processed"
    for callback in callbacks:
        callback(event)
