"""``slo-aware``: deadline-driven admission and preemption, on top of ``swap-aware`` residency.

Every request has a deadline from its own SLO (``view.slo_of(request)``: its SLO class's limits, each one the
class leaves unset its model's; its model's when it has no class):

* not yet started: its TTFT deadline, ``arrival_s + ttft_s``;
* started: the time its tokens so far were due, ``first_token_s + tpot_s × generated``.

Admission (``order_waiting``) is earliest-deadline-first among requests that
can still meet their deadline; those already past it go last, because
serving a lost cause first only makes savable requests miss too.

Preemption (``choose_victim``) takes the running request with the most
slack: the time left until its predicted last token is due
(``first_token_s + tpot_s × predicted_output_tokens``) minus the time its
predicted remaining tokens need at the current step time. Its KV is swapped
to host RAM (the paper: ~1% of the cost of a model swap), not recomputed.
When only prefills hold blocks, the one admitted last goes, as in vLLM (its
KV is incomplete: it is recomputed).

Residency follows ``swap-aware``, except that among absent models the one
with the most requests still able to meet their TTFT after a reload is
considered first.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sim.policies.base import QueueOrder, mypyc_attr, sort_queue
from sim.policies.fcfs_swap import unblock, youngest_victim
from sim.policies.registry import register
from sim.policies.swap_aware import SwapAwarePolicy

if TYPE_CHECKING:
    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.policies.view import ClusterView

INF = float("inf")


def due_s(request: Request, ttft_s: float, tpot_s: float) -> float:
    """When the request's next due token is due under its SLO's TTFT and TPOT bounds (0: no bound; inf when the
    one that applies is none)."""
    if math.isnan(request.first_token_s):
        return request.arrival_s + ttft_s if ttft_s else INF
    return request.first_token_s + tpot_s * request.generated if tpot_s else INF


def due_in(request: Request, bounds: list[tuple[float, float]]) -> float:
    """:func:`due_s` under the bounds of the request's SLO class, ``bounds`` being its model's by class code + 1."""
    ttft_s, tpot_s = bounds[request.slo_class + 1]
    return due_s(request, ttft_s, tpot_s)


def bounds_of(slo: Any) -> tuple[float, float]:
    """An SLO's (TTFT, TPOT) bounds, 0 for none: what :func:`due_s` takes."""
    return (slo.ttft_s or 0.0, slo.tpot_s or 0.0)


class EarliestSavableDeadlineFirst(QueueOrder):
    """Earliest deadline first, those already past it last: the sort key (deadline < now, deadline, id).

    ``bounds`` are the (TTFT, TPOT) bounds of the queue's model's requests by SLO class code + 1 (first: no class)."""

    def __init__(self, now: float, bounds: list[tuple[float, float]]):
        self.now = now
        self.bounds = bounds

    def before(self, a: Request, b: Request) -> bool:
        due_a, due_b = due_in(a, self.bounds), due_in(b, self.bounds)
        late_a, late_b = due_a < self.now, due_b < self.now
        if late_a != late_b:
            return late_b
        if due_a != due_b:
            return due_a < due_b
        return a.id < b.id


@mypyc_attr(allow_interpreted_subclasses=True)
class SloAwarePolicy(SwapAwarePolicy):
    name = "slo-aware"
    description = "Earliest-deadline-first admission from TTFT/TPOT SLOs, preempt the request with most slack (KV swap)."

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        # Each model's requests' (TTFT, TPOT) bounds by SLO class code + 1 (first: no class), looked up once per
        # (model, class): deadlines are asked for every queued request at every admission.
        self.slo_bounds: dict[int, list[tuple[float, float]]] = {}

    def class_bounds(self, model: int, view: ClusterView) -> list[tuple[float, float]]:
        """``model``'s requests' (TTFT, TPOT) bounds by SLO class code + 1, for every class arrived so far."""
        row = self.slo_bounds.get(model)
        if row is None:
            row = self.slo_bounds[model] = []
        classes = view.slo_class_count  # not len(view.slo_classes), a copy of every label at every admission
        while len(row) <= classes:  # classes arrive as the trace goes on: each one is looked up once
            row.append(bounds_of(view.slo_for_class(model, len(row) - 1)))
        return row

    def order_waiting(self, instance: Instance, view: ClusterView) -> None:
        if len(instance.waiting) < 2:
            return  # the usual case at an admission: nothing to reorder
        sort_queue(instance.waiting, EarliestSavableDeadlineFirst(view.now, self.class_bounds(instance.model, view)))

    waiting_order = "by-key"  # EarliestSavableDeadlineFirst: (late, deadline, id); late changes with the clock

    def waiting_leaders(self, instance: Instance, view: ClusterView) -> list[Request]:
        """A waiting request's deadline stays put (it generates nothing), so from now on the head is the earliest
        not yet late or, once all are, the earliest of all: a request already late leads only if it is that one."""
        bounds, now = self.class_bounds(instance.model, view), view.now
        leaders: list[Request] = []
        earliest: Request | None = None
        earliest_due = INF
        for request in instance.waiting:
            due = due_in(request, bounds)
            if due >= now:
                leaders.append(request)
            if earliest is None or due < earliest_due or (due == earliest_due and request.id < earliest.id):
                earliest, earliest_due = request, due
        if earliest is not None and earliest_due < now:
            leaders.append(earliest)
        return leaders

    def choose_victim(self, instance: Instance, view: ClusterView) -> tuple[Request, str]:
        if not instance.running:  # only prefills hold blocks (a later chunk found none): the latest, recomputed
            return youngest_victim(instance, view)
        bounds = self.class_bounds(instance.model, view)
        step_s = instance.costs.decode_step_s(len(instance.running), instance.context_tokens, instance.gpu_share)

        def slack_s(position_request: tuple[int, Request]) -> tuple[float, int]:
            position, request = position_request
            tpot_s = bounds[request.slo_class + 1][1]
            if not tpot_s or math.isnan(request.first_token_s):
                return (INF, position)
            remaining = max(0, request.predicted_output_tokens - instance.generated(request))
            last_due = request.first_token_s + tpot_s * request.predicted_output_tokens
            return (last_due - view.now - remaining * step_s, position)

        _, victim = max(enumerate(instance.running), key=slack_s)
        if len(instance.running) == 1:
            gpu = instance.gpu  # its last request leaves: an idle neighbour may now block the queue
            view.call_at(view.now, lambda v: unblock(v, gpu))
        return victim, "swap"

    def candidates(self, view: ClusterView) -> list[int]:
        """Absent models with pending requests: most requests that can still meet their TTFT after a reload first."""
        absent = [m for m in range(len(view.model_names)) if view.pending_count(m) and not view.instances_of(m)]

        def savable(model: int) -> int:
            ready_by = view.now + view.costs(model).reload_s(view.deployment_share(model))
            bounds = self.class_bounds(model, view)
            return sum(1 for r in view.pending(model) if due_in(r, bounds) >= ready_by)

        return sorted(absent, key=lambda m: (-savable(m), -self.gain_s(view, m), m))


register(SloAwarePolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
