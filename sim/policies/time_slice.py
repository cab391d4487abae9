"""``time-slice``: each group of models rotates on its GPUs, one quantum at a time.

Models are given a home once (pinned ones first, heaviest first, each where the GPUs it spans have the least
weight so far: among its pinned ``gpus`` when it has them) and only ever run there. Models whose spans overlap (a
one-GPU model homed on a GPU of a tensor- or pipeline-parallel one) form a group that takes turns on the group's
GPUs. When the group's models fit together they stay co-resident and the GPU interleaves their iterations (the
engine's time-sharing), so no quantum is needed. When they do not fit, the resident model keeps its GPUs for
``quantum_s`` seconds after its load; then, if another model of the group has requests waiting and needs those
GPUs, it is unloaded with its running requests' KV swapped to host RAM, and the next model in the rotation is
loaded. An idle resident model gives way at once.

This is fair and starvation-free, but blind to cost: it pays the swap penalty
every quantum regardless of how much work either model has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.policies.base import Policy, mypyc_attr
from sim.policies.fcfs_swap import Rechecks, is_moving, live_instances, start_bytes, unblock, youngest_victim
from sim.policies.registry import register

if TYPE_CHECKING:
    from sim.engine.gpu import Gpu
    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.policies.view import ClusterView


def span_at(view: ClusterView, model: int, gpu: Gpu) -> list[Gpu]:
    """The GPUs an instance of ``model`` loaded at ``gpu`` spans (empty: it cannot be placed there)."""
    group = view.shard_group(model, gpu)
    return [gpu] if group is None else group


def home_spans(view: ClusterView, model: int) -> list[list[Gpu]]:
    """The spans ``model`` may call home: whole aligned groups of GPUs (their first GPU first) whose memory holds
    its footprint each; of them, those holding a GPU it is pinned to (``gpus``) when there are any."""
    need = view.footprint_bytes(model)
    spans = []
    for gpu in view.gpus:
        span = span_at(view, model, gpu)
        if span and span[0] is gpu and all(shard.capacity_bytes >= need for shard in span):
            spans.append(span)
    pins = view.placement(model).get("gpus") or []
    pinned = [span for span in spans if any(shard.index in pins for shard in span)]
    return pinned or spans


def home_groups(view: ClusterView) -> tuple[dict[int, Gpu], list[list[int]]]:
    """Model → its home (the first GPU of its span), and the groups of models whose spans overlap (each heaviest
    first; by their lowest GPU, the order in which their loads at the start queue for a node's disk).

    Pinned models first, then the others, each heaviest first, to the span whose most loaded GPU has the least
    weight so far (the lowest index on a tie); its footprint then counts on every GPU of the span. Pins go first
    so that the others share out what they leave. A model that fits nowhere gets no home: its requests stay
    unserved."""
    weight = {g.index: 0 for g in view.gpus}
    homes: dict[int, Gpu] = {}
    groups: list[list[int]] = []
    covered: list[set[int]] = []  # per group, the indices of the GPUs its models span
    models = sorted(range(len(view.model_names)), key=lambda m: -view.costs(m).weight_bytes())
    for model in sorted(models, key=lambda m: not view.placement(m).get("gpus")):
        spans = home_spans(view, model)
        if not spans:
            continue
        span = min(spans, key=lambda s: (max(weight[g.index] for g in s), s[0].index))
        indices = {g.index for g in span}
        need = view.footprint_bytes(model)
        for index in indices:
            weight[index] += need
        homes[model] = span[0]
        members = [model]
        for group in reversed(range(len(groups))):  # every group it overlaps joins its own, which takes their place
            if not covered[group].isdisjoint(indices):
                indices |= covered.pop(group)
                members += groups.pop(group)
        groups.append(sorted(members, key=models.index))
        covered.append(indices)
    firsts = [min(indices) for indices in covered]
    return homes, [groups[g] for g in sorted(range(len(groups)), key=firsts.__getitem__)]


class Rotation:
    """A group of models taking turns on the GPUs their spans cover."""

    def __init__(self, key: int, models: list[int], gpus: list[Gpu]) -> None:
        self.key = key  # its re-check timer's
        self.models = models  # in rotation order: heaviest first
        self.gpus = gpus
        self.cursor = -1  # the position in ``models`` of the model loaded last


def live_on(gpus: list[Gpu]) -> list[Instance]:
    """The ready or loading instances on ``gpus``, each once (a parallel one is listed on every GPU it spans)."""
    return [i for gpu in gpus for i in live_instances(gpu) if i.gpu is gpu]


def overlaps(instance: Instance, span: list[Gpu]) -> bool:
    """Whether ``instance`` holds memory on a GPU of ``span``."""
    for gpu in instance.shards or [instance.gpu]:
        if gpu in span:
            return True
    return False


def has_room(view: ClusterView, model: int, span: list[Gpu], reserve: int) -> bool:
    """Whether ``model`` loads on ``span`` now with ``reserve`` bytes to spare on each GPU: a GPU's instances must
    span exactly the same GPUs (the engine's rule for sharing one), and its free memory hold the footprint."""
    shards = None if len(span) == 1 else span
    need = view.footprint_bytes(model) + reserve
    for gpu in span:
        if gpu.free_bytes() - gpu.in_flight_bytes() < need:
            return False
        for other in gpu.instances:
            if other.shards != shards:
                return False
    return True


def earliest_loaded(instances: list[Instance]) -> Instance:
    """The instance that became ready first (the oldest on a tie), as ``min`` by (ready_at_s, uid) would pick it.

    A function of its own: a key function in :meth:`TimeSlicePolicy.rotate`, which runs on every arrival, would
    allocate a closure on each call."""
    return min(instances, key=lambda i: (i.ready_at_s, i.uid))


def any_pending(view: ClusterView, models: list[int]) -> bool:
    """Whether any of ``models`` has requests no instance holds (a loop: ``any(map(...))`` made Python calls)."""
    for model in models:
        if view.pending_count(model):
            return True
    return False


def any_moving(gpus: list[Gpu]) -> bool:
    """Whether a load or unload is in flight on any of ``gpus``."""
    for gpu in gpus:
        if is_moving(gpu):
            return True
    return False


@mypyc_attr(allow_interpreted_subclasses=True)
class TimeSlicePolicy(Policy):
    name = "time-slice"
    description = "Each GPU rotates its group of models with a fixed quantum, swapping KV out at quantum end."

    quantum_s: Any  # as the scenario gives it (sim.policies.registry.check_params checked it)

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {"quantum_s": 5.0}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.groups: dict[int, Rotation] = {}  # GPU index → the rotation whose models span it
        self.home: dict[int, Gpu] = {}
        self.rechecks = Rechecks()

    def setup(self, view: ClusterView) -> None:
        self.home, groups = home_groups(view)
        for key, models in enumerate(groups):
            gpus = {g.index: g for model in models for g in span_at(view, model, self.home[model])}
            rotation = Rotation(key, models, [gpus[index] for index in sorted(gpus)])
            for index in gpus:
                self.groups[index] = rotation
            for position, model in enumerate(models):
                if view.load(model, self.home[model]) is None:
                    break
                rotation.cursor = position

    def on_arrival(self, request: Request, view: ClusterView) -> None:
        if request.instance is not None:
            unblock(view, request.instance.gpu)
        gpu = self.home.get(request.model)
        if gpu is not None:
            self.rotate(view, self.groups.get(gpu.index))

    def on_finish(self, request: Request, instance: Instance, view: ClusterView) -> None:
        unblock(view, instance.gpu)
        if not instance.has_work:
            self.rotate(view, self.groups.get(instance.gpu.index))

    def choose_victim(self, instance: Instance, view: ClusterView) -> tuple[Request, str]:
        return youngest_victim(instance, view)

    def on_instance_ready(self, instance: Instance, view: ClusterView) -> None:
        super().on_instance_ready(instance, view)
        unblock(view, instance.gpu)
        rotation = self.groups.get(instance.gpu.index)
        if rotation is not None:
            self.rotate_at(view, rotation, view.now + self.quantum_s)

    def on_unloaded(self, instance: Instance, view: ClusterView) -> None:
        self.rotate(view, self.groups.get(instance.gpu.index))

    def next_in_rotation(self, view: ClusterView, rotation: Rotation) -> int | None:
        """The first model after the cursor in the rotation that is absent and has requests waiting."""
        models = rotation.models
        if not any_pending(view, models):
            return None  # the usual case on an arrival or a finish: the group has nothing waiting to come in
        present = {i.model for i in live_on(rotation.gpus)}
        for step in range(1, len(models) + 1):
            position = (rotation.cursor + step) % len(models)
            model = models[position]
            if model not in present and view.pending_count(model):
                return position
        return None

    def rotate(self, view: ClusterView, rotation: Rotation | None) -> None:
        """Load the next waiting model of the group: into free memory, or after the quantum of those in its way
        (None: a GPU no model calls home, where an autoscaler may have loaded one)."""
        if rotation is None:
            return
        position = self.next_in_rotation(view, rotation)
        if position is None or any_moving(rotation.gpus):
            return  # nothing to bring in; or a load or unload is in flight, and its completion calls back here
        model = rotation.models[position]
        home = self.home[model]
        span = span_at(view, model, home)
        for gpu in rotation.gpus:
            view.sync(gpu)  # all before any is read: a parallel instance's KV sits on every GPU it spans
        # Only the instances on its span stand in its way; the group's others keep their GPUs.
        in_way = [i for i in live_on(rotation.gpus) if overlaps(i, span)]
        # Next to a resident model, only with KV room for the oldest waiting request (else both could hold
        # queued work that neither can start).
        reserve = start_bytes(view, view.pending(model)[0]) if in_way else 0
        if has_room(view, model, span, reserve):
            rotation.cursor = position
            view.load(model, home)
            return
        residents = [i for i in in_way if i.status == "ready"]
        expired = [i for i in residents if not i.has_work or view.now >= i.ready_at_s + self.quantum_s]
        if expired:
            view.unload(earliest_loaded(expired), mode="swap")
        elif residents:
            self.rotate_at(view, rotation, min(i.ready_at_s for i in residents) + self.quantum_s)

    def rotate_at(self, view: ClusterView, rotation: Rotation, due_s: float) -> None:
        """Rotate the group again at ``due_s`` (its own method: a closure in :meth:`rotate`, which runs on every
        arrival, would be allocated on each call)."""
        self.rechecks.at(view, rotation.key, due_s, lambda v: self.rotate(v, rotation))


register(TimeSlicePolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
