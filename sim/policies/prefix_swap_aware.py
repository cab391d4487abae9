"""``prefix-swap-aware``: swap-aware residency with prefix-aware routing, and prefix caches that survive swaps.

Requests go to the instance of their model that scores best on llm-d's weighted
scorers (cached prefix, queue, free KV: :mod:`sim.engine.routing`), whatever rule
the scenario names; residency is ``swap-aware``'s. When it unloads a model it
keeps the instance's cached prefix blocks in the node's RAM (if they fit), so a
model swapped back in on that node finds its tenants' prompts again, and an
eviction's cost counts the prompt tokens its cache would otherwise lose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.engine.routing import Router
from sim.policies.base import mypyc_attr
from sim.policies.registry import register
from sim.policies.swap_aware import SwapAwarePolicy

if TYPE_CHECKING:
    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.policies.view import ClusterView


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixSwapAwarePolicy(SwapAwarePolicy):
    name = "prefix-swap-aware"
    description = ("swap-aware residency with prefix-aware routing (llm-d's scorers); prefix caches kept in host RAM "
                   "across a swap")

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.router = Router("prefix-aware")
        self.keeps_prefix_cache = True

    def route(self, request: Request, view: ClusterView) -> Instance | None:
        target = view.route_by(self.router, request)
        if target is not None:
            self.last_used_s[target.uid] = view.now
        return target

    def eviction_cost_s(self, view: ClusterView, victim: Instance, reload_s: float | None = None) -> float:
        """swap-aware's cost, plus the prefill of the cached prompt blocks an unload would lose when the node's
        RAM cannot keep them."""
        cost = super().eviction_cost_s(view, victim, reload_s)
        cached = view.cached_prefix_bytes(victim)
        if cached and not view.host_room_for(victim.gpu.node, cached):
            tokens = cached // victim.block_bytes * view.config.block_size
            cost += view.costs(victim.model).prefill_s(tokens)
        return cost


register(PrefixSwapAwarePolicy)
