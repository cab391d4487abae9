"""``static``: each model pinned to its own GPUs, FCFS, never swapped (one pod per GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.policies.base import Policy, mypyc_attr
from sim.policies.registry import register

if TYPE_CHECKING:
    from sim.policies.view import ClusterView


KV_RESERVE_SHARE = 0.2
"""A pod packed next to another must leave this share of the GPU for KV caches."""


def static_placement(view: ClusterView) -> list[tuple[int, int]]:
    """(model, gpu) pairs: explicit ``gpus`` from the scenario first, then GPUs shared out by demand.

    With at least as many GPUs as models, every model gets one GPU and spare GPUs go to
    the models with the most expected demand (mix share per GPU). With fewer, models are
    placed in order of demand on the GPU with the most free memory: alone on an empty GPU
    if their weights fit, or next to others if ``KV_RESERVE_SHARE`` of the GPU stays free
    for KV. Models that fit nowhere are not served, as with a fixed pod layout. A model whose instances span
    several GPUs (tensor or pipeline parallel) takes, per instance, the first whole aligned group of free GPUs.
    In a cluster of several pools each model takes GPUs of the pools it fits, in its placement order
    (``cluster.placement``: hardware-aware or blind; see :mod:`sim.fleet.placement`).
    """
    gpus = list(view.gpus)
    pool_rank = _pool_ranks(view, gpus)
    models = range(len(view.model_names))
    pairs: list[tuple[int, int]] = []
    taken: set[int] = set()
    for model in models:
        size = view.gpus_per_instance(model)
        for index in view.placement(model).get("gpus") or []:
            first = index - index % size
            if (model, first) in pairs:
                continue  # another index of the same group (gpus: [0, 1] at TP2): one instance spans both
            pairs.append((model, first))
            taken.update(range(first, first + size))
    for model in models:
        size = view.gpus_per_instance(model)
        if size == 1 or view.placement(model).get("gpus"):
            continue
        replicas = view.placement(model).get("replicas")
        starts = sorted((g for g in gpus if g.pool in pool_rank[model] and _group_starts_at(view, model, g)),
                        key=lambda g: (pool_rank[model][g.pool], g.index))
        for _ in range(replicas if isinstance(replicas, int) and replicas > 0 else 1):
            first = next((g.index for g in starts if not taken & set(range(g.index, g.index + size))), None)
            if first is None:
                break
            pairs.append((model, first))
            taken.update(range(first, first + size))
    unplaced = [m for m in models if not view.placement(m).get("gpus") and view.gpus_per_instance(m) == 1]
    demand = {m: view.placement(m).get("demand", 1.0) for m in unplaced}
    free = [g.index for g in gpus if g.index not in taken]
    if len(free) >= len(unplaced):
        counts = {m: 1 for m in unplaced}
        for _ in range(len(free) - len(unplaced)):
            neediest = max(unplaced, key=lambda m: (demand[m] / counts[m], -m)) if unplaced else None
            if neediest is not None:
                counts[neediest] += 1
        pool_of = {g.index: g.pool for g in gpus}
        for m in sorted(unplaced, key=lambda m: -view.costs(m).weight_bytes()):
            for _ in range(counts[m]):
                usable = [i for i in free if pool_of[i] in pool_rank[m]]
                if not usable:
                    break
                best = min(usable, key=lambda i: (pool_rank[m][pool_of[i]], i))
                free.remove(best)
                pairs.append((m, best))
        return pairs
    capacity = {g.index: g.capacity_bytes for g in gpus if g.index in free}
    remaining = dict(capacity)
    if not remaining:
        return pairs  # no GPU is up (an elastic pool may start with no node): an autoscaler adds them
    for m in sorted(unplaced, key=lambda m: (-demand[m], m)):
        need = view.footprint_bytes(m, view.placement(m).get("gpu_share", 1.0))
        target = max(remaining, key=lambda i: (remaining[i], -i))
        empty = remaining[target] == capacity[target]
        room = remaining[target] - (0 if empty else KV_RESERVE_SHARE * capacity[target])
        if need < room:
            pairs.append((m, target))
            remaining[target] -= need
    return pairs


def _group_starts_at(view: ClusterView, model: int, gpu) -> bool:
    group = view.shard_group(model, gpu)
    return group is not None and len(group) > 0 and group[0] is gpu


def _pool_ranks(view: ClusterView, gpus: list) -> list[dict[int, int]]:
    """Per model, each pool it may use -> its rank in the model's placement order. A cluster of one pool
    ranks it first for every model, so that placement there is what it always was."""
    pools = {g.pool for g in gpus}
    ranks = []
    for model in range(len(view.model_names)):
        order = view.placement(model).get("pools")
        ranks.append({pool: rank for rank, pool in enumerate(order)} if order is not None and len(pools) > 1
                     else {pool: 0 for pool in pools})
    return ranks


@mypyc_attr(allow_interpreted_subclasses=True)
class StaticPolicy(Policy):
    name = "static"
    description = "Dedicated GPUs per model, FCFS, no swapping: today's one-pod-per-GPU baseline."

    def setup(self, view: ClusterView) -> None:
        by_index = {g.index: g for g in view.gpus}
        for model, gpu in static_placement(view):
            view.load(model, by_index[gpu], view.placement(model).get("gpu_share", 1.0))


register(StaticPolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
