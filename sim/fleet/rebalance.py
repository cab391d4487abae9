"""The gateway's flow control as a new replica comes up: requests queued at the model's busier instances that
have not started move to it, so that it serves more than the requests arriving after it is ready."""

from __future__ import annotations

from collections import deque
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine.engine import Engine
    from sim.engine.instance import Instance
    from sim.engine.request import Request

BY_ID = attrgetter("id")


def share_queues(engine: Engine, instance: Instance) -> None:
    """A cold start is over: requests queued at the model's busier instances that have not started move to
    it, the youngest first, until no queue is longer than the new one's by more than one; it serves them
    oldest first. This is the gateway's flow control (the inference extension holds what pods cannot take
    yet); without it the new instance would serve only requests arriving after it is ready."""
    donors = [i for i in engine.instances_by_model[instance.model] if i is not instance and i.status == "ready"]
    for donor in donors:
        donor.gpu.cut_window()
    # Never scheduled: it holds no KV blocks and may move. Youngest by arrival (ids follow arrival order), not
    # by queue position: a policy that reorders its queue does so at each step, so the order at an instant
    # depends on whether the GPU is fast-forwarding.
    movable = {donor.uid: [r for r in donor.waiting if r.first_scheduled_s != r.first_scheduled_s] for donor in donors}
    taking = _shares([(len(d.waiting), len(movable[d.uid])) for d in donors], len(instance.waiting))
    lengths_after = {d.uid: len(d.waiting) - count for d, count in zip(donors, taking)}
    moved: list[Request] = []
    for donor, count in zip(donors, taking):
        if count:
            leaving = sorted(movable[donor.uid], key=BY_ID)[-count:]
            gone = set(map(id, leaving))
            waiting = donor.waiting
            while waiting and id(waiting[-1]) in gone and len(waiting) > lengths_after[donor.uid]:
                waiting.pop()  # the youngest usually queue last: off the end, without a pass over the rest
            if len(waiting) > lengths_after[donor.uid]:
                donor.waiting = deque(r for r in waiting if id(r) not in gone)
            moved += leaving
    for request in sorted(moved, key=BY_ID):
        engine.assign(request, instance)
    for donor in donors:
        donor.gpu.kick()


def _shares(queues: list[tuple[int, int]], receiving: int) -> list[int]:
    """How many requests each donor (its queue length, and how many of them may move) gives a receiving queue
    of ``receiving``: down to a common level T, the highest at which the receiving queue, grown by what the
    donors above T give (each at most what it may move), is at least T - 1 long. No donor is then more than
    one longer than the receiving queue unless nothing more of it may move. Found by bisection: O(donors x
    log(queue length)), however many requests move."""
    def given(level: int) -> int:
        return sum(min(movable, max(0, length - level)) for length, movable in queues)

    low, high = 0, max((length for length, _ in queues), default=0)
    while low < high:
        level = (low + high + 1) // 2
        if receiving + given(level) >= level - 1:
            low = level
        else:
            high = level - 1
    return [min(movable, max(0, length - low)) for length, movable in queues]
