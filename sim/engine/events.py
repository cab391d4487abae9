"""A SimPy event that is already decided and only waits for its time."""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL, EventPriority


def scheduled_event(env: simpy.Environment, delay: float, priority: EventPriority = NORMAL) -> simpy.Event:
    """An event that fires ``delay`` seconds from now, at ``priority`` among events of the same instant.

    Cheaper than a Timeout plus a callback, and unlike a Timeout it takes a priority. This is
    ``Environment.schedule`` written out (the same heap entry, the same event ids): every GPU step
    makes one, and SimPy's method would add a Python frame to each."""
    event = simpy.Event(env)
    event._ok, event._value = True, None
    heappush(env._queue, (env._now + max(delay, 0.0), priority, next(env._eid), event))
    return event
