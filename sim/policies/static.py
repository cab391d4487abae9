"""``static``: each model pinned to its own GPUs, FCFS, never swapped (one pod per GPU)."""

from __future__ import annotations

from sim.policies.base import Policy
from sim.policies.registry import register


def static_placement(view) -> list[tuple[int, int]]:
    """(model, gpu) pairs: explicit ``gpus`` from the scenario first, then GPUs shared out by demand.

    Every model gets at least one GPU while GPUs last (largest models first); spare GPUs
    go to the models with the most expected demand. With more models than GPUs, models
    are packed first-fit into GPUs whose memory still holds their weights.
    """
    gpus = list(view.gpus)
    models = range(len(view.model_names))
    pairs, taken = [], set()
    for model in models:
        for index in view.placement(model).get("gpus") or []:
            pairs.append((model, index))
            taken.add(index)
    unplaced = [m for m in models if not view.placement(m).get("gpus")]
    unplaced.sort(key=lambda m: -view.costs(m).weight_bytes())
    free = [g.index for g in gpus if g.index not in taken]
    if len(free) >= len(unplaced):
        demand = {m: view.placement(m).get("demand", 1.0) for m in unplaced}
        counts = {m: 1 for m in unplaced}
        for _ in range(len(free) - len(unplaced)):
            neediest = max(unplaced, key=lambda m: (demand[m] / counts[m], -m)) if unplaced else None
            if neediest is not None:
                counts[neediest] += 1
        for m in unplaced:
            for _ in range(counts[m]):
                pairs.append((m, free.pop(0)))
        return pairs
    remaining = {g.index: g.capacity_bytes for g in gpus}
    for m in unplaced:
        need = view.costs(m).gpu_weight_bytes(1.0)
        target = max(remaining, key=lambda i: (remaining[i], -i))
        if remaining[target] >= need:
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
