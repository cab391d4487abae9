"""The engine's own agenda beside SimPy's event queue, and processing a SimPy event on the spot.

A GPU's step end and the sampler's next sample are not SimPy events: each such owner has at most one due
time, kept in an agenda keyed by (time, event id). A SimPy event, its callback list and a queue tuple made
every step cost more than the step's own bookkeeping. The event ids are drawn from SimPy's own counter, so
:func:`sim.engine.arrivals.run` orders the agenda among SimPy's events exactly as SimPy would order
NORMAL-priority events scheduled at the same moments.

Two agendas keep the same order: compiled, :class:`HeapAgenda` is a binary heap of the owners themselves, whose
entry moves in place when a fast-forward window is cut short; interpreted, that heap's Python loops cost
more than :class:`LazyAgenda`'s C ``heapq`` of tuples, where a moved entry leaves a stale tuple behind to be
passed over. :func:`make_agenda` picks the one that suits the build.
"""

from __future__ import annotations

import heapq
from abc import abstractmethod
from typing import Any, Callable, Final

import simpy
from simpy.core import NORMAL

NORMAL_PRIORITY: Final = NORMAL  # Final: compiled, other globals are looked up in the module's dict at every use
HEAPPUSH: Final = heapq.heappush
HEAPPOP: Final = heapq.heappop
FIRST_LAST_ID: Final = 1 << 62
"""Event ids of entries due after everything else at their time: beyond any id SimPy's counter will reach."""


class AgendaEntry:
    """Something with at most one due time on the agenda: ``entry_due`` runs when it comes."""

    __slots__ = ("due_s", "due_eid", "slot")

    def __init__(self) -> None:
        self.due_s = 0.0
        self.due_eid = -1
        self.slot = -1  # its place in the agenda's heap; -1: nothing due

    @abstractmethod
    def entry_due(self, now: float) -> None:
        """Its due time ``now`` has come (SimPy's clock stands at it, and it is off the agenda)."""


def _before(a: AgendaEntry, b: AgendaEntry) -> bool:
    return a.due_s < b.due_s or (a.due_s == b.due_s and a.due_eid < b.due_eid)


class EventIds:
    """SimPy's event-id counter (``env._eid``, which SimPy draws from with ``next``) as an object whose next id
    a compiled agenda reads and moves on as a field: calling an ``itertools.count`` cost more than the rest of
    putting an entry on the agenda."""

    def __init__(self, first: int) -> None:
        self.next_id = first

    def __iter__(self) -> EventIds:
        return self

    def __next__(self) -> object:  # not int: mypyc would give the type's iterator slot an unboxed result
        drawn = self.next_id
        self.next_id = drawn + 1
        return drawn


class Agenda:
    """The due entries of one environment, earliest (then lowest event id) first: what both builds' agendas do.

    An entry made due now gets the next id of SimPy's counter, so that it comes after every SimPy event and
    agenda entry scheduled before now for the same time, as a Timeout scheduled now would."""

    @abstractmethod
    def schedule(self, entry: AgendaEntry, at_s: float) -> None:
        """Make ``entry`` due at ``at_s``, instead of any time it was due at."""

    @abstractmethod
    def schedule_last(self, entry: AgendaEntry, at_s: float) -> None:
        """Make ``entry`` due at ``at_s`` after everything else due then, whenever that is scheduled."""

    @abstractmethod
    def first(self) -> AgendaEntry | None:
        """The entry due first, or None when nothing is due."""

    @abstractmethod
    def pop(self) -> AgendaEntry:
        """Take the entry :meth:`first` gave off the agenda."""


class HeapAgenda(Agenda):
    """The agenda as a binary heap of the entries themselves, each knowing its slot: a moved entry sifts in place."""

    def __init__(self, env: simpy.Environment):
        self.heap: list[AgendaEntry] = []
        counter = env._eid
        # A second agenda on the same environment shares the counter, or their ids would no longer be SimPy's.
        self.ids = counter if isinstance(counter, EventIds) else EventIds(next(counter))
        env._eid = self.ids  # type: ignore[assignment]  # typed as itertools.count; SimPy only calls next on it
        self.last_ids = 0

    def schedule(self, entry: AgendaEntry, at_s: float) -> None:
        ids = self.ids
        entry.due_s = at_s
        entry.due_eid = ids.next_id
        ids.next_id += 1
        self._place(entry)

    def schedule_last(self, entry: AgendaEntry, at_s: float) -> None:
        entry.due_s = at_s
        entry.due_eid = FIRST_LAST_ID + self.last_ids
        self.last_ids += 1
        self._place(entry)

    def _place(self, entry: AgendaEntry) -> None:
        """Put an entry whose due time was just set where it belongs in the heap."""
        if entry.slot < 0:
            entry.slot = len(self.heap)
            self.heap.append(entry)
            self._sift_up(entry.slot)
        else:
            self._sift_down(self._sift_up(entry.slot))

    def first(self) -> AgendaEntry | None:
        return self.heap[0] if self.heap else None

    def pop(self) -> AgendaEntry:
        first = self.heap[0]
        self._remove(0)
        return first

    def _remove(self, slot: int) -> None:
        heap = self.heap
        gone, last = heap[slot], heap.pop()
        gone.slot = -1
        if last is not gone:
            heap[slot] = last
            last.slot = slot
            self._sift_down(self._sift_up(slot))

    def _sift_up(self, slot: int) -> int:
        heap = self.heap
        entry = heap[slot]
        while slot > 0:
            parent = (slot - 1) >> 1
            above = heap[parent]
            if not _before(entry, above):
                break
            heap[slot] = above
            above.slot = slot
            slot = parent
        heap[slot] = entry
        entry.slot = slot
        return slot

    def _sift_down(self, slot: int) -> None:
        heap = self.heap
        size, entry = len(heap), heap[slot]
        while True:
            child = 2 * slot + 1
            if child >= size:
                break
            if child + 1 < size and _before(heap[child + 1], heap[child]):
                child += 1
            below = heap[child]
            if not _before(below, entry):
                break
            heap[slot] = below
            below.slot = slot
            slot = child
        heap[slot] = entry
        entry.slot = slot


class LazyAgenda(Agenda):
    """The same agenda as a ``heapq`` of (time, event id, entry) tuples: an entry that moves leaves its old tuple
    behind, passed over when it reaches the top (its event id is no longer the entry's)."""

    def __init__(self, env: simpy.Environment):
        self.tuples: list[tuple[float, int, AgendaEntry]] = []
        self.next_eid: Callable[[], int] = env._eid.__next__  # interpreted, the C counter is the cheaper one
        self.last_ids = 0

    def schedule(self, entry: AgendaEntry, at_s: float) -> None:
        self._push(entry, at_s, self.next_eid())

    def schedule_last(self, entry: AgendaEntry, at_s: float) -> None:
        self.last_ids += 1
        self._push(entry, at_s, FIRST_LAST_ID + self.last_ids - 1)

    def _push(self, entry: AgendaEntry, at_s: float, eid: int) -> None:
        entry.due_s = at_s
        entry.due_eid = eid
        entry.slot = 0
        HEAPPUSH(self.tuples, (at_s, eid, entry))

    def first(self) -> AgendaEntry | None:
        tuples = self.tuples
        while tuples and tuples[0][1] != tuples[0][2].due_eid:
            HEAPPOP(tuples)
        return tuples[0][2] if tuples else None

    def pop(self) -> AgendaEntry:
        entry = HEAPPOP(self.tuples)[2]
        entry.slot = -1
        entry.due_eid = -1
        return entry


def make_agenda(env: simpy.Environment) -> Agenda:
    """The agenda that is fastest in this build (see the module's docstring)."""
    from sim.engine import build

    return HeapAgenda(env) if build() == "compiled" else LazyAgenda(env)


def simpy_event_first(entry: tuple[float, int, int, Any], due: AgendaEntry) -> bool:
    """Whether SimPy's queue entry ``entry`` comes before the agenda's entry ``due``: SimPy's order, the agenda's
    entries counting as NORMAL-priority events."""
    at_s = entry[0]
    if at_s != due.due_s:
        return at_s < due.due_s
    priority = entry[1]
    return priority < NORMAL_PRIORITY or (priority == NORMAL_PRIORITY and entry[2] < due.due_eid)


def process_now(event: simpy.Event) -> None:
    """Trigger ``event`` and run its callbacks now, as ``Environment.step`` would had it just come due; unlike
    ``succeed``, which queues it behind whatever else is due at this instant."""
    event._ok, event._value = True, None
    callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]  # SimPy's mark of "processed"
    for callback in callbacks:
        callback(event)
