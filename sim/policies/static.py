"""``static``: each model pinned to its own GPUs, FCFS, never swapped (one pod per GPU)."""

from __future__ import annotations

from sim.policies.base import Policy
from sim.policies.registry import register


KV_RESERVE_SHARE = 0.2
"""A pod packed next to another must leave this share of the GPU for KV caches."""


def static_placement(view) -> list[tuple[int, int]]:
    """(model, gpu) pairs: explicit ``gpus`` from the scenario first, then GPUs shared out by demand.

    With at least as many GPUs as models, every model gets one GPU and spare GPUs go to
    the models with the most expected demand (mix share per GPU). With fewer, models are
    placed in order of demand on the GPU with the most free memory: alone on an empty GPU
    if their weights fit, or next to others if ``KV_RESERVE_SHARE`` of the GPU stays free
    for KV. Models that fit nowhere are not served, as with a fixed pod layout.
    """
    gpus = list(view.gpus)
    models = range(len(view.model_names))
    pairs, taken = [], set()
    for model in models:
        for index in view.placement(model).get("gpus") or []:
            pairs.append((model, index))
            taken.add(index)
    unplaced = [m for m in models if not view.placement(m).get("gpus")]
    demand = {m: view.placement(m).get("demand", 1.0) for m in unplaced}
    free = [g.index for g in gpus if g.index not in taken]
    if len(free) >= len(unplaced):
        counts = {m: 1 for m in unplaced}
        for _ in range(len(free) - len(unplaced)):
            neediest = max(unplaced, key=lambda m: (demand[m] / counts[m], -m)) if unplaced else None
            if neediest is not None:
                counts[neediest] += 1
        for m in sorted(unplaced, key=lambda m: -view.costs(m).weight_bytes()):
            for _ in range(counts[m]):
                pairs.append((m, free.pop(0)))
        return pairs
    capacity = {g.index: g.capacity_bytes for g in gpus if g.index in free}
    remaining = dict(capacity)
    for m in sorted(unplaced, key=lambda m: (-demand[m], m)):
        need = view.footprint_bytes(m, view.placement(m).get("gpu_share", 1.0))
        target = max(remaining, key=lambda i: (remaining[i], -i))
        empty = remaining[target] == capacity[target]
        room = remaining[target] - (0 if empty else KV_RESERVE_SHARE * capacity[target])
        if need < room:
            pairs.append((m, target))
            remaining[target] -= need
    return pairs


@register
class StaticPolicy(Policy):
    name = "static"
    description = "Dedicated GPUs per model, FCFS, no swapping: today's one-pod-per-GPU baseline."

    def setup(self, view) -> None:
        by_index = {g.index: g for g in view.gpus}
        for model, gpu in static_placement(view):
            view.load(model, by_index[gpu], view.placement(model).get("gpu_share", 1.0))
