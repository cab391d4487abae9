"""Routing rules: which of a model's instances queues a new request.

A rule is what an inference gateway's endpoint picker does (the Gateway API
inference extension, llm-d's scheduler): it sees every instance of the
request's model that is ready or loading, and picks one. Every policy routes
through the scenario's rule unless it overrides ``route`` itself.

- ``least-loaded``: fewest requests held, the oldest instance on a tie.
- ``round-robin``: each model's instances in turn.
- ``prefix-aware``: llm-d's weighted scorers, each in [0, 1]: the share of the
  prompt's blocks already in the instance's prefix cache (``prefix``), its
  waiting queue against the others' (``queue``: 1 for the shortest, 0 for the
  longest) and its free KV (``kv``: 1 - KV utilisation). Default weights 3, 2
  and 2: the prefix and queue weights of llm-d's default profile, with its KV
  utilisation scorer beside them at the queue's weight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.engine.instance import Instance
from sim.engine.request import Request

if TYPE_CHECKING:  # the engine imports this module
    from sim.engine.engine import Engine

ROUTING_RULES = ("least-loaded", "round-robin", "prefix-aware")
DEFAULT_WEIGHTS = {"prefix": 3.0, "queue": 2.0, "kv": 2.0}


class Router:
    """A routing rule and whatever it remembers between requests."""

    def __init__(self, rule: str = "least-loaded", weights: dict[str, float] | None = None):
        if rule not in ROUTING_RULES:
            raise ValueError(f"unknown routing rule {rule!r}; expected one of {', '.join(ROUTING_RULES)}")
        self.rule = rule
        self.weights = {**DEFAULT_WEIGHTS, **(weights or {})}
        self._turns: dict[int, int] = {}

    def pick(self, engine: Engine, request: Request, candidates: list[Instance] | None = None) -> Instance | None:
        """The instance the rule sends ``request`` to: among those whose max_model_len holds it, when the rule's
        first choice does not and another does (an instance beside another model, or on a smaller GPU, refuses
        what a replica elsewhere serves)."""
        chosen = self._pick(engine, request, candidates)
        if chosen is not None and chosen.exceeds_max_model_len(request):
            pool = engine.instances_by_model[request.model] if candidates is None else candidates
            fitting = [i for i in pool if engine.routable(i) and not i.exceeds_max_model_len(request)]
            if fitting:
                return self._pick(engine, request, fitting)
        return chosen

    def _pick(self, engine: Engine, request: Request, candidates: list[Instance] | None) -> Instance | None:
        if self.rule == "least-loaded":
            return engine.least_loaded(request.model, candidates)
        pool = [i for i in (engine.instances_by_model[request.model] if candidates is None else candidates)
                if engine.routable(i)]
        if len(pool) <= 1:
            return pool[0] if pool else None
        if self.rule == "round-robin":
            turn = self._turns.get(request.model, 0)
            self._turns[request.model] = turn + 1
            return pool[turn % len(pool)]
        return self._best_scored(engine, request, pool)

    def _best_scored(self, engine: Engine, request: Request, pool: list[Instance]) -> Instance:
        queues = [len(i.waiting) + len(i.swapped) for i in pool]
        shortest, longest = min(queues), max(queues)
        path = engine.prefix_path(request)
        weights = self.weights
        best, best_key = pool[0], (-1.0, 0, 0)
        for instance, queued in zip(pool, queues):
            # A fast-forwarding GPU's blocks (and the cache its decode growth evicted) stand at its window's start:
            # bring them to now, as the per-iteration run has them at this arrival.
            instance.gpu.sync()
            prefix = 0.0
            if path.blocks and instance.prefix_cache is not None:
                prefix = instance.prefix_cache.match(path, path.blocks) / path.blocks
            queue = 1.0 if longest == shortest else (longest - queued) / (longest - shortest)
            held = instance.blocks
            total = held + instance.free_blocks()
            kv = 1.0 - held / total if total > 0 else 0.0
            score = weights["prefix"] * prefix + weights["queue"] * queue + weights["kv"] * kv
            key = (score, -instance.num_requests, -instance.uid)
            if key > best_key:
                best, best_key = instance, key
        return best
