"""``static``: each model pinned to its own GPUs, FCFS, never swapped (one pod per GPU)."""

from __future__ import annotations

import heapq
from collections import deque
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
    pairs: list[tuple[int, int]] = []
    taken: set[int] = set()
    _place_explicit(view, pairs, taken)
    _place_groups(view, gpus, pool_rank, pairs, taken)
    unplaced = [m for m in range(len(view.model_names))
                if not view.placement(m).get("gpus") and view.gpus_per_instance(m) == 1]
    free = [g for g in gpus if g.index not in taken]
    if len(free) >= len(unplaced):
        _share_out_gpus(view, unplaced, free, pool_rank, pairs)
    else:
        _pack_gpus(view, unplaced, free, pairs)
    return pairs


def _place_explicit(view: ClusterView, pairs: list[tuple[int, int]], taken: set[int]) -> None:
    """The scenario's explicit ``gpus`` per model: one instance per aligned group they name."""
    for model in range(len(view.model_names)):
        size = view.gpus_per_instance(model)
        firsts: set[int] = set()
        for index in view.placement(model).get("gpus") or []:
            first = index - index % size
            if first in firsts:
                continue  # another index of the same group (gpus: [0, 1] at TP2): one instance spans both
            firsts.add(first)
            pairs.append((model, first))
            taken.update(range(first, first + size))


def _place_groups(view: ClusterView, gpus: list, pool_rank: list[dict[int, int]], pairs: list[tuple[int, int]],
                  taken: set[int]) -> None:
    """Each multi-GPU model's replicas, each on the first whole aligned group of free GPUs in its pool order."""
    for model in range(len(view.model_names)):
        size = view.gpus_per_instance(model)
        if size == 1 or view.placement(model).get("gpus"):
            continue
        replicas = view.placement(model).get("replicas")
        rank = pool_rank[model]
        starts = [index for _, index in sorted((rank[g.pool], g.index) for g in gpus
                                               if g.pool in rank and _group_starts_at(view, model, g))]
        position = 0  # a start passed over stays taken (``taken`` only grows): the search resumes after it
        for _ in range(replicas if isinstance(replicas, int) and replicas > 0 else 1):
            while position < len(starts) and not taken.isdisjoint(range(starts[position], starts[position] + size)):
                position += 1
            if position == len(starts):
                break
            first = starts[position]
            pairs.append((model, first))
            taken.update(range(first, first + size))


def _share_out_gpus(view: ClusterView, unplaced: list[int], free: list, pool_rank: list[dict[int, int]],
                    pairs: list[tuple[int, int]]) -> None:
    """At least a GPU per model: each model gets one, the spare ones go to the most demand per GPU, and the
    largest models choose first, lowest index in their best pool first."""
    demand = {m: view.placement(m).get("demand", 1.0) for m in unplaced}
    counts = {m: 1 for m in unplaced}
    neediest = [(-demand[m], m) for m in unplaced]  # demand per GPU, by (-(demand / count), model)
    heapq.heapify(neediest)
    for _ in range(len(free) - len(unplaced) if unplaced else 0):
        _, model = heapq.heappop(neediest)
        counts[model] += 1
        heapq.heappush(neediest, (-demand[model] / counts[model], model))
    by_pool: dict[int, deque[int]] = {}
    for gpu in free:  # in index order
        by_pool.setdefault(gpu.pool, deque()).append(gpu.index)
    for m in sorted(unplaced, key=lambda m: -view.costs(m).weight_bytes()):
        wanted = counts[m]
        for pool in sorted(pool_rank[m], key=lambda pool: pool_rank[m][pool]):
            queue = by_pool.get(pool)
            while wanted and queue:
                pairs.append((m, queue.popleft()))
                wanted -= 1


def _pack_gpus(view: ClusterView, unplaced: list[int], free: list, pairs: list[tuple[int, int]]) -> None:
    """Fewer GPUs than models: by demand, each on the GPU with the most free memory, alone if it fits or beside
    others while ``KV_RESERVE_SHARE`` of the GPU stays free; a model that fits nowhere is not served."""
    capacity = {g.index: g.capacity_bytes for g in free}
    remaining = dict(capacity)
    if not remaining:
        return  # no GPU is up (an elastic pool may start with no node): an autoscaler adds them
    demand = {m: view.placement(m).get("demand", 1.0) for m in unplaced}
    for m in sorted(unplaced, key=lambda m: (-demand[m], m)):
        need = view.footprint_bytes(m, view.placement(m).get("gpu_share", 1.0))
        target = max(remaining, key=lambda i: (remaining[i], -i))
        empty = remaining[target] == capacity[target]
        room = remaining[target] - (0 if empty else KV_RESERVE_SHARE * capacity[target])
        if need < room:
            pairs.append((m, target))
            remaining[target] -= need


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
    keeps_placement = True

    def setup(self, view: ClusterView) -> None:
        by_index = {g.index: g for g in view.gpus}
        for model, gpu in static_placement(view):
            view.load(model, by_index[gpu], view.placement(model).get("gpu_share", 1.0))


register(StaticPolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
