"""The built-in policies' compiled-friendly admission orders sort exactly as ``sorted`` with their old key tuples."""

from __future__ import annotations

import math
import random
from collections import deque
from types import SimpleNamespace

import pytest

from sim.engine import build
from sim.engine.request import Request
from sim.policies.base import Policy, sort_queue
from sim.policies.slo_aware import EarliestSavableDeadlineFirst, SloAwarePolicy, bounds_of, due_in
from sim.policies.swap_aware import AgedShortestFirst
from sim.scenario import Slo


def random_queue(rng: random.Random, size: int) -> deque[Request]:
    """Requests with many ties (few distinct arrivals, predictions and first tokens), some already started, of
    SLO classes 0 and 1 or none."""
    queue: deque[Request] = deque()
    for rid in rng.sample(range(10 * size + 1), size):
        request = Request(rid, 0, float(rng.randint(0, 5)), 100, 50, rng.choice([1, 2, 8, 64]),
                          slo_class=rng.choice([-1, 0, 1]))
        if rng.random() < 0.4:
            request.first_token_s = float(rng.randint(0, 6))
            request.generated = rng.randint(0, 4)
        queue.append(request)
    return queue


@pytest.mark.parametrize("seed", range(40))
def test_aged_shortest_first_matches_its_sort_key(seed: int) -> None:
    rng = random.Random(seed)
    queue = random_queue(rng, rng.randint(0, 40))
    now, aging = float(rng.randint(5, 9)), rng.choice([0.5, 2, 0.0])
    expected = sorted(queue, key=lambda r: (r.predicted_output_tokens - aging * (now - r.arrival_s), r.arrival_s, r.id))
    sort_queue(queue, AgedShortestFirst(aging))
    assert list(queue) == expected


def random_slos(rng: random.Random) -> list[Slo]:
    """The SLOs of no class, class 0 and class 1 (by class code + 1)."""
    return [Slo(ttft_s=rng.choice([None, 1.0, 3]), tpot_s=rng.choice([None, 0.5, 2.0])) for _ in range(3)]


@pytest.mark.parametrize("seed", range(40))
def test_earliest_savable_deadline_first_matches_its_sort_key(seed: int) -> None:
    rng = random.Random(seed)
    queue = random_queue(rng, rng.randint(0, 40))
    bounds = [bounds_of(slo) for slo in random_slos(rng)]
    now = float(rng.randint(0, 9))
    expected = sorted(queue, key=lambda r: (due_in(r, bounds) < now, due_in(r, bounds), r.id))
    sort_queue(queue, EarliestSavableDeadlineFirst(now, bounds))
    assert list(queue) == expected


@pytest.mark.skipif(build() == "compiled", reason="hands the compiled policy stand-ins for an instance and a view")
@pytest.mark.parametrize("seed", range(40))
def test_slo_aware_names_every_request_its_sort_may_put_first_from_now_on(seed: int) -> None:
    """Fast-forward asks only ``waiting_leaders`` whether one could start: each request the sort puts at the head at
    any later time (at each deadline, just after it, and long after all) must be among them."""
    rng = random.Random(seed)
    queue = random_queue(rng, rng.randint(1, 40))
    slos = random_slos(rng)
    bounds = [bounds_of(slo) for slo in slos]
    now = float(rng.randint(0, 9))
    view = SimpleNamespace(now=now, slo_classes=("a", "b"), slo_class_count=2, slo_for_class=lambda model, code: slos[code + 1])
    leaders = SloAwarePolicy().waiting_leaders(SimpleNamespace(model=0, waiting=queue), view)
    assert {id(r) for r in leaders} <= {id(r) for r in queue} and len({id(r) for r in leaders}) == len(leaders)
    deadlines = sorted({due_in(r, bounds) for r in queue} - {math.inf})
    times = [now] + [t + d for t in deadlines if t >= now for d in (0.0, 1e-9, 0.5)] + [now + 1e6]
    for t in times:
        head = min(queue, key=lambda r: (due_in(r, bounds) < t, due_in(r, bounds), r.id))
        assert any(r is head for r in leaders), (t, head)
    late = [r for r in queue if due_in(r, bounds) < now]
    assert len(leaders) == len(queue) - len(late) + (1 if late else 0)  # of those late, only the earliest


def test_sort_queue_keeps_equal_requests_in_their_order() -> None:
    """Stable, as ``sorted`` is: requests no order can tell apart (the same id twice) keep their places."""
    first, second = Request(7, 0, 1.0, 10, 10, 5), Request(7, 0, 1.0, 10, 10, 5)
    queue = deque([Request(9, 0, 0.0, 10, 10, 9), first, second, Request(3, 0, 0.0, 10, 10, 1)])
    expected = sorted(queue, key=lambda r: (r.predicted_output_tokens, r.arrival_s, r.id))
    sort_queue(queue, AgedShortestFirst(0.0))
    assert list(queue) == expected and queue[1] is first and queue[2] is second


def test_a_subclass_with_an_order_of_its_own_is_not_taken_for_a_sort_by_key() -> None:
    """Fast-forward trusts a policy's ``waiting_order``; a subclass that reorders the queue its own way must not
    inherit its parent's declaration (the engine would then skip boundaries at which its order changes)."""
    from sim.policies.slo_aware import SloAwarePolicy
    from sim.policies.swap_aware import SwapAwarePolicy

    class OwnOrder(SwapAwarePolicy):
        def order_waiting(self, instance, view) -> None:
            instance.waiting.reverse()

    class SameOrder(SwapAwarePolicy):
        pass

    class Declared(SwapAwarePolicy):
        waiting_order = "by-key"

        def order_waiting(self, instance, view) -> None:
            super().order_waiting(instance, view)

    assert (SwapAwarePolicy.waiting_order, SloAwarePolicy.waiting_order) == ("fixed-key", "by-key")

    class OtherKey(SloAwarePolicy):  # another sort by key: slo-aware's leaders (by deadline) do not fit it
        waiting_order = "by-key"

        def order_waiting(self, instance, view) -> None:
            sort_queue(instance.waiting, AgedShortestFirst(0.0))

    class Tuned(SloAwarePolicy):
        pass

    assert OtherKey.waiting_leaders is Policy.waiting_leaders
    assert Tuned.waiting_leaders is SloAwarePolicy.waiting_leaders is not Policy.waiting_leaders
    assert (OwnOrder.waiting_order, SameOrder.waiting_order, Declared.waiting_order) == ("own", "fixed-key", "by-key")
