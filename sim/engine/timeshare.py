"""A time-shared run: one GPU step standing for consecutive decode iterations of the GPU's co-resident
instances, in the round-robin order they take turns in, with their closed-form timing.

Co-resident instances run one iteration of one instance per step (:meth:`Gpu._next_instance`). When every
active instance either only decodes or is stuck (nothing running, nothing able to start), and nothing can
join any batch, the boundaries between those iterations change nothing by themselves, as inside a single
instance's fast-forward window. The order of turns is then a function of the GPU's round-robin position
alone (a stuck instance is passed over, as :meth:`Gpu._next_step` passes it), so it repeats with a period of
at most the number of active instances. The run goes on up to the first iteration that finishes a request,
and stops short of the first whose new KV blocks would not fit the memory all of them allocate from.
Anything from outside that could change a batch cuts it at the next iteration boundary, as it cuts a window
(:meth:`Gpu.cut_window`).

The GPU's ``current`` step stays an ordinary one-iteration :class:`Step` of the instance whose iteration is
running (as of the last sync), so what reads it (the KV in flight, an unload waiting for its instance's
iteration, a load's memory check) works as in per-iteration mode; the run holds the iterations after it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from sim.costs import StepCoefficients
from sim.engine import batching
from sim.engine.instance import Instance
from sim.engine.kv import blocks_for
from sim.engine.step import Step, last_at_most

if TYPE_CHECKING:  # the engine and the GPU import this module
    from mypy_extensions import i64

    from sim.engine.engine import Engine
    from sim.engine.gpu import Gpu

NEVER: Final = 1 << 62


class TimeSharedRun:
    """``iterations`` decode iterations of ``members``, in turn from ``start_s``. Iteration j (from 0) is
    ``members[order[j]]``'s while j < len(order); after that ``order[period_start:]`` repeats. A member's
    batch (``batches``) decodes from ``contexts`` tokens, growing by the batch each of its iterations, each
    costing ``coefficients`` at its context. ``turns[j]`` is the GPU's round-robin position while iteration
    j runs; ``counts[j * len(members) + r]`` how many of the first j iterations are member r's. ``applied``:
    how many of them syncs have applied to the members' counters (never the last: it ends as a step of its own);
    the one after them is running. Every time is a sum from ``start_s``, and the busy seconds of each member and of
    each GPU they span (``spans``) are those before the run plus its iterations' in closed form, whatever was applied
    before: a sync only reads the clock. ``instances``: the GPU's active instances, members or stuck."""

    __slots__ = ("instances", "members", "coefficients", "batches", "contexts", "order", "turns", "period_start",
                 "counts", "iterations", "start_s", "applied", "spans", "member_busy_s", "span_busy_s", "_asked_s",
                 "_done_by_asked")

    def __init__(self, instances: list[Instance], members: list[Instance], order: list[int], turns: list[int],
                 period_start: int, start_s: float):
        self.instances = instances
        self.members = members
        self.coefficients: list[StepCoefficients] = [m.decode_coefficients(len(m.running)) for m in members]
        self.batches: list[int] = [len(m.running) for m in members]
        self.contexts: list[int] = [m.context_tokens for m in members]
        self.order = order
        self.turns = turns
        self.period_start = period_start
        self.counts: list[int] = []
        self._count()
        self.iterations = 0
        self.start_s = start_s
        self.applied = 0
        self.spans: list[Gpu] = members[0].shards or [members[0].gpu]  # the same GPUs for every member
        self.member_busy_s: list[float] = [m.busy_s for m in members]  # busy seconds before the run
        self.span_busy_s: list[float] = [gpu.busy_s for gpu in self.spans]
        # done_by's last question and answer: policies sync a GPU many times at one instant (e.g. swap-aware
        # pricing each victim), and each answer is a search over elapsed_s.
        self._asked_s = math.nan
        self._done_by_asked = 0

    def _count(self) -> None:
        """Count each member's iterations in every prefix of the listed order (``counts``)."""
        k = len(self.members)
        counts = [0] * ((len(self.order) + 1) * k)
        for position, member in enumerate(self.order):
            base = position * k
            for r in range(k):
                counts[base + k + r] = counts[base + r] + (1 if r == member else 0)
        self.counts = counts

    @property
    def turn(self) -> int:
        """The GPU's round-robin position while the running iteration (the first not applied) runs."""
        return self.turns[self.position(self.applied)]

    def position(self, iteration: int) -> int:
        """Where iteration ``iteration`` (from 0) of the run stands in the listed order."""
        length, start = len(self.order), self.period_start
        return iteration if iteration < length else start + (iteration - length) % (length - start)

    def own(self, r: int, iterations: int) -> int:
        """How many of the first ``iterations`` iterations are member ``r``'s."""
        # Native 64-bit arithmetic (compiled): asked for every member at every probe of a search; no value nears 2**62.
        k: i64 = len(self.members)
        length: i64 = len(self.order)
        start: i64 = self.period_start
        member: i64 = r
        done: i64 = iterations
        counts = self.counts
        if done <= length:
            return counts[done * k + member]
        extra: i64 = done - length
        period: i64 = length - start
        cycles: i64 = extra // period
        before: i64 = counts[start * k + member]
        listed: i64 = counts[length * k + member]
        return listed + cycles * (listed - before) + counts[(start + extra - cycles * period) * k + member] - before

    def occurrence(self, r: int, nth: int) -> int:
        """The index of member ``r``'s ``nth`` iteration (from 1) in the run, or NEVER."""
        k, length, start, order = len(self.members), len(self.order), self.period_start, self.order
        listed = self.counts[length * k + r]
        if nth <= listed:
            position = 0
            while True:
                if order[position] == r:
                    nth -= 1
                    if nth == 0:
                        return position
                position += 1
        cycle = listed - self.counts[start * k + r]
        if cycle == 0:
            return NEVER
        extra = nth - listed
        cycles = (extra - 1) // cycle
        within = extra - cycles * cycle
        position = start
        while True:
            if order[position] == r:
                within -= 1
                if within == 0:
                    return length + cycles * (length - start) + position - start
            position += 1

    def elapsed_s(self, iterations: int) -> float:
        """Seconds from ``start_s`` to the end of the run's ``iterations``-th iteration: each member's own
        iterations among them, in closed form."""
        total = 0.0
        r = 0
        while r < len(self.members):  # not ``for r in range``: compiled, a while loop's counter stays unboxed
            own = self.own(r, iterations)
            if own > 0:
                total += self.coefficients[r].steps_s(self.contexts[r], self.batches[r], own)
            r += 1
        return total

    def done_by(self, seconds: float) -> int:
        """Iterations finished ``seconds`` after the start, short of the last one (which ends as a step of its
        own): the largest m below ``iterations`` with ``elapsed_s(m) <= seconds``, which never decreases with m.
        Found by galloping from an estimate, then bisecting."""
        if seconds == self._asked_s:
            return self._done_by_asked
        self._done_by_asked = self._search_done_by(seconds)
        self._asked_s = seconds
        return self._done_by_asked

    def _search_done_by(self, seconds: float) -> int:
        last = self.iterations - 1
        guess = min(max(self._guess_iterations(seconds), 0), last)
        step = 1
        if self.elapsed_s(guess) <= seconds:
            low, high = guess, last
            while low + step < last and self.elapsed_s(low + step) <= seconds:
                low += step
                step *= 2
            high = min(low + step, last)
        else:
            low, high = 0, guess - 1
            while high - step > 0 and self.elapsed_s(high - step) > seconds:
                high -= step
                step *= 2
            low = max(high - step, 0)
        return last_at_most(self.elapsed_s, seconds, low, high)

    def _guess_iterations(self, seconds: float) -> int:
        """Approximately solve ``elapsed_s(m) = seconds`` (a hint only), with ``elapsed_s`` taken as quadratic
        through its values after one and two passes over the listed order."""
        length = len(self.order)
        once, twice = self.elapsed_s(length), self.elapsed_s(2 * length)
        square = (twice - 2 * once) / (2 * length * length)
        linear = once / length - square * length
        if square <= 0:
            return int(seconds / linear) if linear > 0 else self.iterations
        return int((math.sqrt(linear * linear + 4 * square * seconds) - linear) / (2 * square))

    def blocks_bytes(self, iterations: int) -> int:
        """Bytes of the KV blocks the run's first ``iterations`` iterations allocate (counters as at its start)."""
        total = 0
        r = 0
        while r < len(self.members):
            own = self.own(r, iterations)
            if own > 0:
                member = self.members[r]
                total += member.phases.new_blocks(member.iteration, own) * member.block_bytes
            r += 1
        return total

    def fitting(self, limit: int, free_bytes: int) -> int:
        """The most iterations (at most ``limit``) whose new blocks fit in ``free_bytes``: each takes its blocks
        from what the ones before it left, since decodes allocate and nothing frees before the run's end. An
        instance preempts when its iteration's blocks exceed the free ones, and ``b * k > free`` exactly when
        ``k > free // b``, so counting bytes decides what each member's check in blocks would."""
        if self.blocks_bytes(limit) <= free_bytes:
            return limit
        # The first iteration fits: its instance has just planned it. Bytes stay exact as floats (below 2**53).
        return last_at_most(lambda iterations: float(self.blocks_bytes(iterations)), float(free_bytes), 1, limit - 1)

    def apply(self, engine: Engine, done: int) -> None:
        """The first ``done`` iterations (more than ``applied``, but not all) have ended: apply the ones not yet
        applied to the members' counters, and set busy and last-used times and the progress guard's last
        progress as each iteration's end would have."""
        start = self.start_s
        applied = self.applied
        members = self.members
        total_busy_s = 0.0
        r = 0
        while r < len(members):
            own = self.own(r, done)
            if own > 0:
                member = members[r]
                busy = self.coefficients[r].steps_s(self.contexts[r], self.batches[r], own)
                member.busy_s = self.member_busy_s[r] + busy
                total_busy_s += busy
                member.last_used_s = start + self.elapsed_s(self.occurrence(r, own) + 1)  # its last iteration's end
                member.advance(own - self.own(r, applied))
            r += 1
        spans = self.spans
        for g in range(len(spans)):
            spans[g].busy_s = self.span_busy_s[g] + total_busy_s
        ended = start + self.elapsed_s(done)
        if engine.last_progress_s < ended:  # another GPU's step may have ended later
            engine.last_progress_s = ended
        self.applied = done

    def running_step(self) -> Step:
        """The iteration running (the first not applied) as a one-iteration step of its instance, timed as the
        run times it."""
        applied = self.applied
        r = self.order[self.position(applied)]
        member, coefficients, batch = self.members[r], self.coefficients[r], self.batches[r]
        context = self.contexts[r] + batch * self.own(r, applied)
        step = Step(member, 1, coefficients, batch, context + batch, [], coefficients.step_s(context), 0.0)
        step.start_s = self.start_s + self.elapsed_s(applied)
        return step


def start_run(engine: Engine, active: list[Instance], turn: int, step: Step, free_bytes: int) -> TimeSharedRun | None:
    """The run from ``step`` (a plain decode iteration, just planned and starting now, whose instance the GPU
    picked at round-robin position ``turn``) through the iterations of ``active`` (the GPU's active instances)
    that follow it, when two or more of them can run with nothing changing at the boundaries between; else
    None. ``free_bytes``: the GPU memory free before ``step``'s blocks."""
    n = len(active)
    members: list[Instance] = []
    member_of = [-1] * n  # each active instance's index in ``members``; -1: stuck
    for i in range(n):
        instance = active[i]
        if not holds_still(engine, instance):
            return None
        if instance.running:
            member_of[i] = len(members)
            members.append(instance)
    order, turns, period_start = turn_order(member_of, members.index(step.instance), turn)
    run = TimeSharedRun(active, members, order, turns, period_start, step.start_s)
    limit = NEVER
    for r in range(len(members)):
        member = members[r]
        # Its first request to finish does so at its (first - iteration)-th iteration from now.
        limit = min(limit, run.occurrence(r, member.finishing.first() - member.iteration) + 1)
    if limit < 2:
        return None
    run.iterations = run.fitting(limit, free_bytes)
    if run.iterations < 2:
        return None
    step.first_iteration_s = run.coefficients[order[0]].step_s(run.contexts[order[0]])  # the run's own timing
    return run


def turn_order(member_of: list[int], first: int, turn: int) -> tuple[list[int], list[int], int]:
    """The members whose iterations follow member ``first``'s (picked at round-robin position ``turn``), as
    :meth:`Gpu._next_instance` and :meth:`Gpu._next_step` pick them while nothing changes: at each boundary the
    position moves on by one in the list of active instances; a stuck one (``member_of`` -1) is passed over, the
    position moving on by one in the list without it. Returns the member (index) of each iteration, the
    position at each, and the iteration from which they repeat: the next position depends on the last alone,
    so the order repeats within len(member_of) + 1 iterations."""
    n = len(member_of)
    following_turn, following = [0] * n, [0] * n  # from each position, the next, and the member picked there
    for position in range(n):
        remaining = list(range(n))
        picked = (position + 1) % n
        while member_of[remaining[picked]] < 0:
            remaining.pop(picked)  # blocked: the list goes on without it, the position keeping its number
            picked = (picked + 1) % len(remaining)
        following_turn[position], following[position] = picked, member_of[remaining[picked]]
    order, turns = [first], [turn]
    seen = [-1] * n
    seen[turn] = 0
    while True:
        turn, member = following_turn[turn], following[turn]
        order.append(member)
        turns.append(turn)
        if seen[turn] >= 0:
            return order, turns, seen[turn] + 1
        seen[turn] = len(turns) - 1


def holds_still(engine: Engine, instance: Instance) -> bool:
    """Whether ``instance`` has no prefill in flight and nothing can join its batch (or, with nothing running,
    start at all: the GPU then passes it over) at any of its boundaries inside a run. Swapped and waiting
    requests start by free KV room (which only shrinks while the members decode), batch size and token budget
    (which stay) and the prefix cache's hits (which evictions only take away). Asked of every active instance
    at the run's start, with the numbers of now, whatever its last boundary saw. A policy that reorders the
    waiting queue may put another request at its head at any boundary: if it sorts by key, none of them may
    be able to start; if not, the queue must be empty. One whose order never changes with the clock (fixed key)
    is sorted now, which is the order its sort at any boundary makes of these requests: then, as under FCFS, only
    the head must be unable to start (an arrival that could start cuts the run)."""
    if instance.prefilling:
        return False
    config = engine.config
    if len(instance.running) >= config.max_num_seqs:
        return True
    if instance.swapped:  # while one is out, nothing waiting starts
        return blocks_for(instance.swapped[0].context_tokens + 1, config.block_size) > instance.spare_blocks()
    if not instance.waiting:
        return True
    if not engine.waiting_head_holds:  # the head now may not be the head the next sort makes: ask of them all
        return engine.sorts_waiting_by_key and not batching.any_waiting_starts(engine, instance, budget_whole=False)
    if engine.reorders_waiting:  # requests that arrived since its last admission are not in their places yet
        engine.view.order_waiting(instance)
    return not batching.head_starts(engine, instance, instance.waiting[0])

