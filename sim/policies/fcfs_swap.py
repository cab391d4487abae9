"""``fcfs-swap``: one FIFO over all models; a missing model is swapped in by evicting the LRU instance.

This is the naive swapper the paper warns about: it pays the full swap
penalty (unload + reload) whenever the oldest waiting request belongs to a
model that is not resident, however little work that model has and however
much the victim still has. It thrashes under a mixed workload; it is the
baseline the cost-aware policies are measured against.

The helpers here (fitting GPUs, victims, the "last used" clock) are shared by
the other swapping policies.
"""

from __future__ import annotations

from sim.engine.kv import blocks_for
from sim.policies.base import Policy
from sim.policies.registry import register
from sim.policies.static import static_placement


def initial_residency(view) -> None:
    """Load as many models as fit at time 0 (the static packing), so the first arrivals find them."""
    by_index = {g.index: g for g in view.gpus}
    for model, gpu in static_placement(view):
        view.load(model, by_index[gpu])


def oldest_pending(view):
    """The earliest-arrived request that no instance holds, or None."""
    heads = [view.pending(m)[0] for m in range(len(view.model_names)) if view.pending_count(m)]
    return min(heads, key=lambda r: (r.arrival_s, r.id)) if heads else None


def is_moving(gpu) -> bool:
    """A load or unload is in flight on this GPU (its memory picture is about to change)."""
    return any(i.status in ("loading", "draining") for i in gpu.instances)


def live_instances(gpu) -> list:
    return [i for i in gpu.instances if i.status in ("ready", "loading")]


def kv_reserve_bytes(gpu, reserve_bytes: float, leaving=None) -> float:
    """KV room a load onto ``gpu`` must leave: ``reserve_bytes`` when other instances stay there (0 on an empty GPU).

    Two models packed with no KV room between them can each hold queued work that neither can start.
    """
    staying = [i for i in live_instances(gpu) if i is not leaving]
    return reserve_bytes if staying else 0.0


def gpu_with_room(view, model: int, gpu_share: float = 1.0, reserve_bytes: float = 0.0):
    """A GPU whose free memory already holds the model's weights and the KV reserve (most free memory first), or None."""
    need = view.costs(model).gpu_weight_bytes(gpu_share)
    for gpu in view.gpus:
        view.sync(gpu)
    # The running step's new KV blocks count as taken, as the engine's own check does.
    room = {g.index: g.free_bytes() - g.in_flight_bytes() - kv_reserve_bytes(g, reserve_bytes) for g in view.gpus}
    fitting = [g for g in view.gpus if room[g.index] >= need]
    return max(fitting, key=lambda g: (room[g.index], -g.index)) if fitting else None


def room_after_evicting(view, model: int, victim, reserve_bytes: float = 0.0) -> bool:
    """Whether unloading ``victim`` (weights and KV) leaves room on its GPU for ``model``'s weights and the KV reserve."""
    view.sync(victim.gpu)
    freed = victim.weight_bytes + victim.kv_bytes
    reserve = kv_reserve_bytes(victim.gpu, reserve_bytes, leaving=victim)
    return victim.gpu.free_bytes() + freed >= view.costs(model).gpu_weight_bytes(1.0) + reserve


def head_blocks(instance) -> int:
    """KV blocks the next queued request of ``instance`` needs to start (0 when nothing is queued)."""
    size = instance.config.block_size
    if instance.swapped:
        return blocks_for(instance.swapped[0].context_tokens, size)
    if instance.waiting:
        return blocks_for(instance.waiting[0].prefill_target + 1, size)
    return 0


def unblock(view, gpu) -> None:
    """Unload idle co-resident instances while a queued request on ``gpu`` cannot get its KV blocks.

    Without this an idle model's weights could keep a busy neighbour waiting forever.
    """
    view.sync(gpu)
    for instance in list(gpu.instances):
        if instance.status != "ready" or instance.running or instance.prefilling:
            continue
        need = head_blocks(instance)
        if need and need > instance.free_blocks():
            for idle in gpu.instances:
                if idle is not instance and idle.status == "ready" and not idle.has_work:
                    view.unload(idle, mode="swap")
            return


def youngest_victim(instance, view):
    """The engine's default victim (the youngest running request, the scenario's preemption mode).

    When it is the last running request, the instance may be left with queued work
    it cannot fit next to an idle neighbour; re-check that right after the preemption.
    """
    if len(instance.running) == 1:
        gpu = instance.gpu
        view.call_at(view.now, lambda v: unblock(v, gpu))
    return instance.running[-1], view.config.preemption_mode


class Rechecks:
    """Policy timers that re-run a decision at a later time: at most one outstanding per key, the earliest wins."""

    def __init__(self):
        self.due_s: dict = {}

    def at(self, view, key, time_s: float, decide) -> None:
        """Call ``decide(view)`` at ``time_s`` unless an earlier re-check for ``key`` is already due."""
        if view.now < self.due_s.get(key, float("inf")) <= time_s:
            return
        self.due_s[key] = time_s

        def fire(fired_view):
            if self.due_s.get(key) == time_s:
                del self.due_s[key]
                decide(fired_view)

        view.call_at(time_s, fire)


@register
class FcfsSwapPolicy(Policy):
    """Serve the global FIFO head; if its model is absent, evict the least recently used instance and load it.

    "Least recently used" is the last time a request was routed to or finished
    on an instance: those moments are the same in fast-forward and
    per-iteration mode, so decisions never depend on how steps are grouped.
    An instance must have been ready ``min_residency_s`` before it can be
    evicted, only so that each load serves at least a moment of work (without
    it two models could evict each other before either ran a step).
    """

    name = "fcfs-swap"
    description = "Global FIFO; swap the head request's model in by evicting the LRU instance (naive, thrashes)."

    @classmethod
    def param_defaults(cls) -> dict:
        return {"min_residency_s": 0.5}

    def __init__(self, **params):
        super().__init__(**params)
        self.last_used_s: dict[int, float] = {}
        self.rechecks = Rechecks()

    def setup(self, view) -> None:
        initial_residency(view)

    def route(self, request, view):
        target = view.least_loaded(request.model)
        if target is not None:
            self.last_used_s[target.uid] = view.now
        return target

    def on_arrival(self, request, view) -> None:
        if request.instance is not None:
            unblock(view, request.instance.gpu)
        self.schedule(view)

    def on_finish(self, request, instance, view) -> None:
        self.last_used_s[instance.uid] = view.now
        unblock(view, instance.gpu)
        self.schedule(view)

    def choose_victim(self, instance, view):
        return youngest_victim(instance, view)

    def on_instance_ready(self, instance, view) -> None:
        super().on_instance_ready(instance, view)
        unblock(view, instance.gpu)
        self.last_used_s[instance.uid] = view.now
        self.schedule(view)

    def on_unloaded(self, instance, view) -> None:
        self.last_used_s.pop(instance.uid, None)
        self.schedule(view)

    def schedule(self, view) -> None:
        """Bring the FIFO head's model in: into free memory if it fits, else in place of the LRU instance."""
        head = oldest_pending(view)
        if head is None or view.instances_of(head.model):
            return
        gpu = gpu_with_room(view, head.model)
        if gpu is not None:
            view.load(head.model, gpu)
            return
        if any(is_moving(g) for g in view.gpus):
            return  # an unload in flight will free memory; decide again when it has
        victims = [i for g in view.gpus for i in live_instances(g)
                   if i.status == "ready" and room_after_evicting(view, head.model, i)]
        evictable = [i for i in victims if view.now >= i.ready_at_s + self.min_residency_s]
        if evictable:
            victim = min(evictable, key=lambda i: (self.last_used_s.get(i.uid, 0.0), i.uid))
            view.unload(victim, mode="swap")
        elif victims:
            self.rechecks.at(view, "fifo", min(i.ready_at_s for i in victims) + self.min_residency_s, self.schedule)

