"""``swap-aware``: swap a model in only when the work waiting for it pays for the swap penalty.

The paper's lesson is that preempting a model costs a per-(model, hardware)
constant dominated by the weight reload (KV transfer is ~1%). This policy
treats ``costs(m).swap_penalty_s()`` (unload + reload) as known and decides in
request-seconds:

* gain of loading model m = Σ over its pending requests of (predicted output
  tokens × one-sequence decode step at its prompt length) + Σ of the seconds
  they have already waited. The waiting term grows without bound, so no model
  starves.
* cost of loading m in place of victim v = m's reload × its pending requests
  (each waits for the load) + v's swap penalty × the requests v holds (each is
  paused for unload and later reload); an idle victim costs only its unload.
* m is swapped in when gain ≥ ``benefit_ratio`` × cost; into free memory it is
  loaded at once (nothing is evicted).
* victim rule: among ready instances whose removal makes room for m, that have
  been resident at least ``min_residency_s`` (no thrashing) and that are not
  about to finish — an instance whose held work drains (longest predicted
  remaining output × its current step time) in less than its own reload time is
  never evicted, waiting for it is cheaper — pick the smallest eviction cost;
  ties go to the instance with the most predicted remaining work (the penalty
  is the smallest fraction of what it still has to do).

Only predicted output lengths are used, never the true ones. A load is always
for the model's whole pending queue (the base hook routes them all when it is
ready), which amortises the reload over a batch.
"""

from __future__ import annotations

from sim.policies.base import Policy
from sim.policies.fcfs_swap import (Rechecks, gpu_with_room, initial_residency, is_moving, room_after_evicting, route_least_loaded,
                                     unblock, youngest_victim)
from sim.policies.registry import register


def held_requests(instance) -> list:
    return [*instance.running, *instance.prefilling, *instance.waiting, *instance.swapped]


def drain_s(view, instance) -> float:
    """Predicted seconds until everything ``instance`` holds has finished, at its current batch's step time."""
    held = held_requests(instance)
    if not held:
        return 0.0
    view.sync(instance.gpu)
    remaining = max(max(1, r.predicted_output_tokens - instance.generated(r)) for r in held)
    step_s = instance.costs.decode_step_s(len(held), instance.context_tokens, instance.gpu_share)
    return remaining * step_s


def pending_gain_s(view, model: int) -> float:
    """Request-seconds a load of ``model`` unlocks: predicted service of its pending requests plus their wait so far."""
    costs = view.costs(model)
    gain = 0.0
    for request in view.pending(model):
        gain += request.predicted_output_tokens * costs.decode_step_s(1, request.prompt_tokens)
        gain += view.now - request.arrival_s
    return gain


@register
class SwapAwarePolicy(Policy):
    name = "swap-aware"
    description = "Swap a model in only when its waiting work pays for the (model, GPU) swap penalty; cheapest victim."

    @classmethod
    def param_defaults(cls) -> dict:
        return {"benefit_ratio": 2.0, "min_residency_s": 20.0, "recheck_s": 1.0}

    def __init__(self, **params):
        super().__init__(**params)
        self.rechecks = Rechecks()

    def setup(self, view) -> None:
        initial_residency(view)

    def route(self, request, view):
        return route_least_loaded(request, view)

    def on_arrival(self, request, view) -> None:
        if request.instance is None:  # not routed: its model has no instance that takes it
            self.plan(view)
        else:
            unblock(view, request.instance.gpu)

    def on_finish(self, request, instance, view) -> None:
        unblock(view, instance.gpu)
        if any(view.pending_count(m) for m in range(len(view.model_names))):
            self.plan(view)

    def choose_victim(self, instance, view):
        return youngest_victim(instance, view)

    def on_instance_ready(self, instance, view) -> None:
        super().on_instance_ready(instance, view)
        unblock(view, instance.gpu)
        self.plan(view)

    def on_unloaded(self, instance, view) -> None:
        self.plan(view)

    # -- the decision ------------------------------------------------------------------------------
    def candidates(self, view) -> list[int]:
        """Absent models with pending requests, most gain first."""
        absent = [m for m in range(len(view.model_names)) if view.pending_count(m) and not view.instances_of(m)]
        return sorted(absent, key=lambda m: (-pending_gain_s(view, m), m))

    def place_in_free_memory(self, view, model: int) -> bool:
        """Load ``model`` where its full weights already fit (costs no eviction); whether it did."""
        gpu = gpu_with_room(view, model)
        return gpu is not None and view.load(model, gpu) is not None

    def eviction_cost_s(self, view, victim) -> float:
        held = len(held_requests(victim))
        if held == 0:
            return victim.costs.unload_s(victim.gpu_share)
        return held * victim.costs.swap_penalty_s()

    def victim_for(self, view, model: int):
        """The cheapest instance to evict for ``model`` (see the module rule), and the earliest time one may become eligible."""
        eligible, wait_until = [], float("inf")
        for gpu in view.gpus:
            for instance in gpu.instances:
                if instance.status != "ready" or not room_after_evicting(view, model, instance):
                    continue
                settled_at = instance.ready_at_s + self.min_residency_s
                if view.now < settled_at:
                    wait_until = min(wait_until, settled_at)
                    continue
                drain = drain_s(view, instance)
                if 0 < drain < instance.costs.reload_s(instance.gpu_share):
                    continue  # about to finish: its completion re-plans
                eligible.append((self.eviction_cost_s(view, instance), -drain, instance.uid, instance))
        if not eligible:
            return None, wait_until
        return min(eligible)[3], wait_until

    def plan(self, view) -> None:
        """Load absent models into free memory; swap at most one in when its gain pays for the penalty."""
        waiting = False
        for model in self.candidates(view):
            if self.place_in_free_memory(view, model):
                continue
            if any(is_moving(g) for g in view.gpus):
                continue  # memory is about to change; the unload or load finishing re-plans
            victim, wait_until = self.victim_for(view, model)
            if victim is None:
                if wait_until < float("inf"):
                    self.rechecks.at(view, "plan", wait_until, self.plan)
                continue
            waiting = True
            cost_s = view.costs(model).reload_s() * view.pending_count(model) + self.eviction_cost_s(view, victim)
            if pending_gain_s(view, model) >= self.benefit_ratio * cost_s:
                view.unload(victim, mode="swap")
                return
        if waiting:
            # The gain grows as requests wait: look again shortly.
            self.rechecks.at(view, "plan", view.now + self.recheck_s, self.plan)
