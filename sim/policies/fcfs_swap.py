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

import math
from typing import TYPE_CHECKING, Any, Callable

from sim.engine.kv import blocks_for
from sim.policies.base import Policy, latest_admitted, mypyc_attr
from sim.policies.registry import register
from sim.policies.static import static_placement

if TYPE_CHECKING:
    from sim.engine.gpu import Gpu
    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.policies.view import ClusterView


def initial_residency(view: ClusterView) -> None:
    """Load as many models as fit at time 0 (the static packing), so the first arrivals find them."""
    by_index = {g.index: g for g in view.gpus}
    for model, gpu in static_placement(view):
        view.load(model, by_index[gpu])


def oldest_pending(view: ClusterView) -> Request | None:
    """The earliest-arrived request that no instance holds, or None."""
    if not view.has_pending():
        return None
    oldest: Request | None = None
    for model in range(len(view.model_names)):
        head = view.pending_head(model)
        if head is not None and (oldest is None or arrived_before(head, oldest)):
            oldest = head
    return oldest


def arrived_before(a: Request, b: Request) -> bool:
    """Whether ``a`` is older than ``b``: (arrival, id) compared, as ``min`` with that key would."""
    if a.arrival_s != b.arrival_s:
        return a.arrival_s < b.arrival_s
    return a.id < b.id


def held_requests(instance: Instance) -> list[Request]:
    """Every request ``instance`` holds: running, prefilling, waiting and swapped."""
    return [*instance.running, *instance.prefilling, *instance.waiting, *instance.swapped]


def oldest_held(instance: Instance) -> tuple[float, int]:
    """(arrival, id) of the oldest request ``instance`` holds; infinitely late when it holds none."""
    return min(((r.arrival_s, r.id) for r in held_requests(instance)), default=(float("inf"), 0))


def holds_older(instance: Instance, request: Request) -> bool:
    """Whether ``instance`` holds a request that arrived before ``request`` (which then may not evict it)."""
    return oldest_held(instance) < (request.arrival_s, request.id)


def is_moving(gpu: Gpu) -> bool:
    """A load or unload is in flight on this GPU (its memory picture is about to change)."""
    return any(i.status in ("loading", "draining") for i in gpu.instances)


def live_instances(gpu: Gpu) -> list[Instance]:
    return [i for i in gpu.instances if i.status in ("ready", "loading")]


def start_blocks(request: Request, block_size: int) -> int:
    """KV blocks ``request`` needs to start: its prompt (or the tokens it recomputes) plus the token it adds,
    or, swapped out, its cache coming back and the token it decodes in the step that brings it back."""
    tokens = request.context_tokens if request.state == "swapped" else request.prefill_target
    return blocks_for(tokens + 1, block_size)


def start_bytes(view: ClusterView, request: Request) -> int:
    """KV bytes ``request`` needs to start (:func:`start_blocks`): a model loaded next to others must leave this much."""
    size = view.config.block_size
    return start_blocks(request, size) * size * view.costs(request.model).kv_bytes_per_token


def kv_reserve_bytes(gpu: Gpu, reserve_bytes: float, leaving: Instance | None = None) -> float:
    """KV room a load onto ``gpu`` must leave: ``reserve_bytes`` when other instances stay there (0 on an empty GPU).

    Two models packed with no KV room between them can each hold queued work that neither can start.
    """
    staying = [i for i in live_instances(gpu) if i is not leaving]
    return reserve_bytes if staying else 0.0


def gpu_with_room(view: ClusterView, model: int, gpu_share: float | None = None, reserve_bytes: float = 0.0) -> Gpu | None:
    """A GPU whose free memory already holds the model's weights and the KV reserve (most free memory first), or None."""
    need = view.footprint_bytes(model, gpu_share)
    if not any(weights_room_bytes(gpu, reserve_bytes) >= need for gpu in view.gpus):
        return None  # settled without the counters a sync would bring up to now
    for gpu in view.gpus:
        view.sync(gpu)  # all before any is read: a parallel instance's KV sits on GPUs other than the one it steps on
    best: Gpu | None = None
    best_room = 0.0
    for gpu in view.gpus:
        room = room_bytes(gpu, reserve_bytes)
        if room >= need and (best is None or room > best_room or (room == best_room and gpu.index < best.index)):
            best, best_room = gpu, room  # the most room; the lowest index on a tie
    return best


def unweighted_bytes(gpu: Gpu) -> int:
    """The memory of ``gpu`` no instance's weights and reserve take: its free memory at most, whatever the KV."""
    resident = 0
    for instance in gpu.instances:
        resident += instance.resident_bytes
    return gpu.capacity_bytes - resident


def weights_room_bytes(gpu: Gpu, reserve_bytes: float) -> float:
    """What :func:`room_bytes` can be at most, whatever the KV."""
    return unweighted_bytes(gpu) - kv_reserve_bytes(gpu, reserve_bytes)


def room_bytes(gpu: Gpu, reserve_bytes: float) -> float:
    """Memory free on ``gpu`` for a load: the running step's new KV blocks count as taken, as the engine's own check
    does, and the KV reserve is kept when other instances stay."""
    return gpu.free_bytes() - gpu.in_flight_bytes() - kv_reserve_bytes(gpu, reserve_bytes)


def eviction_group(view: ClusterView, model: int, candidates: list[Instance],
                   reserve_bytes: float = 0.0) -> list[Instance] | None:
    """The first of ``candidates`` (instances on one GPU, in the order given) whose unloading leaves room there for
    ``model``'s footprint and the KV reserve, or None when even all of them do not.

    One victim is not always enough: a large model may need the memory of two small ones."""
    if not candidates:
        return None
    gpu = candidates[0].gpu
    view.sync(gpu)
    free, group = gpu.free_bytes() - gpu.in_flight_bytes(), []
    need = view.footprint_bytes(model)
    for victim in candidates:
        group.append(victim)
        free += victim.resident_bytes + victim.kv_bytes
        staying = [i for i in live_instances(gpu) if i not in group]
        if free >= need + (reserve_bytes if staying else 0.0):
            return group
    return None


def head_blocks(instance: Instance) -> int:
    """KV blocks the next queued request of ``instance`` needs to start (0 when nothing is queued)."""
    queue = instance.swapped or instance.waiting  # swapped requests come back before any waiting one starts
    return start_blocks(queue[0], instance.config.block_size) if queue else 0


def idle_with_queue(instance: Instance) -> bool:
    """Ready, running nothing, and holding queued work (what a sync cannot change)."""
    return (instance.status == "ready" and not instance.running and not instance.prefilling
            and bool(instance.swapped or instance.waiting))


def stuck(instance: Instance) -> bool:
    """Idle with queued work whose next request cannot get its KV blocks."""
    return idle_with_queue(instance) and head_blocks(instance) > instance.free_blocks()


def unblock(view: ClusterView, gpu: Gpu) -> None:
    """Free KV room on ``gpu`` while a queued request there cannot get its blocks.

    Idle co-resident instances are unloaded first: without this an idle model's weights could keep a busy
    neighbour waiting forever. When nothing on the GPU runs at all and every instance only holds queued work
    that cannot start (models packed with no KV room between them), all but the one holding the oldest request
    are unloaded, their requests going back to be placed again: otherwise none of them would ever run.
    """
    for instance in gpu.instances:
        if len(instance.waiting) > 1:  # asked on every arrival and finish: a queue of one is in order
            view.order_waiting(instance)  # the head admission will try next is the one that must fit
    if not any(idle_with_queue(instance) for instance in gpu.instances):
        return  # nobody can be stuck: no free-memory reading, no sync
    view.sync(gpu)
    for instance in gpu.instances:
        if stuck(instance):
            make_room(view, gpu, instance)
            return


def make_room(view: ClusterView, gpu: Gpu, instance: Instance) -> None:
    """:func:`unblock`'s unloads for ``instance``, stuck on ``gpu``. A function of its own: compiled, the key function
    below would make :func:`unblock`, asked on every arrival and finish, allocate a closure on each call."""
    idle = [i for i in gpu.instances if i is not instance and i.status == "ready" and not i.has_work]
    for neighbour in idle:
        view.unload(neighbour, mode="swap")
    if not idle and all(stuck(i) for i in gpu.instances):
        keep = min(gpu.instances, key=lambda i: (oldest_held(i), i.uid))
        for neighbour in gpu.instances:
            if neighbour is not keep:
                view.unload(neighbour, mode="swap")


def youngest_victim(instance: Instance, view: ClusterView) -> tuple[Request, str]:
    """The engine's default victim (the most recently admitted request, the scenario's preemption mode).

    When it is the last running request, or a prefill whose next chunk found no blocks
    while nothing decodes, the instance may be left with queued work it cannot fit next
    to an idle neighbour (loaded, say, while only the prefill's first chunk held blocks);
    re-check that right after the preemption.
    """
    if len(instance.running) <= 1:
        gpu = instance.gpu
        view.call_at(view.now, lambda v: unblock(v, gpu))
    return latest_admitted(instance), view.config.preemption_mode


class Rechecks:
    """Policy timers that re-run a decision at a later time: at most one outstanding per key, the earliest wins."""

    def __init__(self) -> None:
        self.due_s: dict[object, float] = {}

    def due_at(self, key: object) -> float:
        """When the re-check for ``key`` is due (infinity when none is)."""
        return self.due_s.get(key, math.inf)

    def at(self, view: ClusterView, key: object, time_s: float, decide: Callable[[ClusterView], object]) -> None:
        """Call ``decide(view)`` at ``time_s`` unless an earlier re-check for ``key`` is already due."""
        if view.now < self.due_s.get(key, float("inf")) <= time_s:
            return
        self.due_s[key] = time_s

        def fire(fired_view: ClusterView) -> None:
            if self.due_s.get(key) == time_s:
                del self.due_s[key]
                decide(fired_view)

        view.call_at(time_s, fire)


@mypyc_attr(allow_interpreted_subclasses=True)
class FcfsSwapPolicy(Policy):
    """Serve the global FIFO head; if its model is absent, evict the least recently used instance and load it.

    "Least recently used" is the last time a request was routed to or finished
    on an instance: those moments are the same in fast-forward and
    per-iteration mode, so decisions never depend on how steps are grouped.
    The FIFO is global over every request in the system, not only the
    unplaced ones: an instance holding a request older than the head is never
    evicted for it (else the head's model would evict the older request's
    model and be evicted back for it, forever). An instance must also have
    been ready ``min_residency_s`` before it can be evicted, so that each load
    serves at least a moment of work.
    """

    name = "fcfs-swap"
    description = "Global FIFO; swap the head request's model in by evicting the LRU instance (naive, thrashes)."

    min_residency_s: Any  # each parameter as the scenario gives it (sim.policies.registry.check_params checked it)

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {"min_residency_s": 0.5}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.last_used_s: dict[int, float] = {}
        self.rechecks = Rechecks()

    def setup(self, view: ClusterView) -> None:
        initial_residency(view)

    def route(self, request: Request, view: ClusterView) -> Instance | None:
        target = view.route(request)
        if target is not None:
            self.last_used_s[target.uid] = view.now
        return target

    def on_arrival(self, request: Request, view: ClusterView) -> None:
        if request.instance is not None:
            unblock(view, request.instance.gpu)
        self.schedule(view)

    def on_finish(self, request: Request, instance: Instance, view: ClusterView) -> None:
        self.last_used_s[instance.uid] = view.now
        unblock(view, instance.gpu)
        self.schedule(view)

    def choose_victim(self, instance: Instance, view: ClusterView) -> tuple[Request, str]:
        return youngest_victim(instance, view)

    def on_instance_ready(self, instance: Instance, view: ClusterView) -> None:
        super().on_instance_ready(instance, view)
        unblock(view, instance.gpu)
        self.last_used_s[instance.uid] = view.now
        self.schedule(view)

    def on_unloaded(self, instance: Instance, view: ClusterView) -> None:
        self.last_used_s.pop(instance.uid, None)
        self.schedule(view)

    def schedule(self, view: ClusterView) -> None:
        """Bring the FIFO head's model in: into free memory if it fits, else in place of the LRU instance."""
        head = oldest_pending(view)
        if head is None or view.instances_of(head.model):
            return
        reserve = start_bytes(view, head)
        gpu = gpu_with_room(view, head.model, reserve_bytes=reserve)
        if gpu is not None:
            view.load(head.model, gpu)
            return
        if any(is_moving(g) for g in view.gpus):
            return  # an unload in flight will free memory; decide again when it has
        self.evict_for(view, head, reserve)

    def evict_for(self, view: ClusterView, head: Request, reserve: int) -> None:
        """Unload the least recently used instances that make room for ``head``'s model, once they have been resident
        ``min_residency_s``. A method of its own: compiled, its key functions would make :meth:`schedule`, which
        usually returns early, allocate a closure on each call."""
        groups = []
        for gpu in view.gpus:
            candidates = sorted((i for i in live_instances(gpu) if i.status == "ready" and not holds_older(i, head)),
                                key=lambda i: (self.last_used_s.get(i.uid, 0.0), i.uid))
            group = eviction_group(view, head.model, candidates, reserve)
            if group is not None:
                groups.append((len(group), max(self.last_used_s.get(i.uid, 0.0) for i in group), gpu.index, group))
        if not groups:
            return  # every instance that could make room holds older requests: their completions re-plan
        group = min(groups, key=lambda entry: entry[:3])[3]
        settled_s = max(i.ready_at_s for i in group) + self.min_residency_s
        if view.now < settled_s:
            self.rechecks.at(view, "fifo", settled_s, self.schedule)
            return
        for victim in group:
            view.unload(victim, mode="swap")


register(FcfsSwapPolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
