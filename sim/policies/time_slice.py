"""``time-slice``: each GPU rotates a fixed group of models, one quantum at a time.

Models are shared out to GPUs once (heaviest first, each to the GPU with the
least weight assigned so far) and only ever run on their home GPU. When the
group's models fit together they stay co-resident and the GPU interleaves
their iterations (the engine's time-sharing), so no quantum is needed. When
they do not fit, the resident model keeps the GPU for ``quantum_s`` seconds
after its load; then, if another model of the group has requests waiting, it
is unloaded with its running requests' KV swapped to host RAM, and the next
model in the rotation is loaded. An idle resident model gives way at once.

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


def home_groups(view: ClusterView) -> dict[int, list[int]]:
    """GPU index → models rotating on it: heaviest model first, each to the GPU with least weight so far."""
    load_bytes = {g.index: 0 for g in view.gpus}
    groups: dict[int, list[int]] = {g.index: [] for g in view.gpus}
    capacity = {g.index: g.capacity_bytes for g in view.gpus}
    models = sorted(range(len(view.model_names)), key=lambda m: -view.costs(m).weight_bytes())
    for model in models:
        need = view.footprint_bytes(model)
        fitting = [g for g in load_bytes if capacity[g] >= need]
        if not fitting:
            continue  # the model fits on no GPU: its requests stay unserved
        target = min(fitting, key=lambda g: (load_bytes[g], g))
        load_bytes[target] += need
        groups[target].append(model)
    return groups


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
        self.groups: dict[int, list[int]] = {}
        self.home: dict[int, Gpu] = {}
        self.cursor: dict[int, int] = {}
        self.rechecks = Rechecks()

    def setup(self, view: ClusterView) -> None:
        self.groups = home_groups(view)
        by_index = {g.index: g for g in view.gpus}
        for index, models in self.groups.items():
            for model in models:
                self.home[model] = by_index[index]
            self.cursor[index] = -1
            for position, model in enumerate(models):
                if view.load(model, by_index[index]) is None:
                    break
                self.cursor[index] = position

    def on_arrival(self, request: Request, view: ClusterView) -> None:
        if request.instance is not None:
            unblock(view, request.instance.gpu)
        gpu = self.home.get(request.model)
        if gpu is not None:
            self.rotate(view, gpu)

    def on_finish(self, request: Request, instance: Instance, view: ClusterView) -> None:
        unblock(view, instance.gpu)
        if not instance.has_work:
            self.rotate(view, instance.gpu)

    def choose_victim(self, instance: Instance, view: ClusterView) -> tuple[Request, str]:
        return youngest_victim(instance, view)

    def on_instance_ready(self, instance: Instance, view: ClusterView) -> None:
        super().on_instance_ready(instance, view)
        unblock(view, instance.gpu)
        self.rotate_at(view, instance.gpu, view.now + self.quantum_s)

    def on_unloaded(self, instance: Instance, view: ClusterView) -> None:
        self.rotate(view, instance.gpu)

    def next_in_rotation(self, view: ClusterView, gpu: Gpu) -> int | None:
        """The first model after the cursor in this GPU's group that is absent and has requests waiting."""
        group = self.groups.get(gpu.index)
        if group is None or not any_pending(view, group):
            return None  # the usual case on an arrival or a finish: the group has nothing waiting to come in
        present = {i.model for i in live_instances(gpu)}
        for step in range(1, len(group) + 1):
            position = (self.cursor[gpu.index] + step) % len(group)
            model = group[position]
            if model not in present and view.pending_count(model):
                return position
        return None

    def rotate(self, view: ClusterView, gpu: Gpu) -> None:
        """Load the next waiting model of the group: into free memory, or after the resident one's quantum."""
        position = self.next_in_rotation(view, gpu)
        if position is None or is_moving(gpu):
            return  # nothing to bring in; or a load or unload is in flight, and its completion calls back here
        model = self.groups[gpu.index][position]
        view.sync(gpu)
        # Next to a resident model, only with KV room for the oldest waiting request (else both could hold
        # queued work that neither can start).
        reserve = start_bytes(view, view.pending(model)[0]) if live_instances(gpu) else 0
        if gpu.free_bytes() - gpu.in_flight_bytes() >= view.footprint_bytes(model) + reserve:
            self.cursor[gpu.index] = position
            view.load(model, gpu)
            return
        residents = [i for i in live_instances(gpu) if i.status == "ready"]
        expired = [i for i in residents if not i.has_work or view.now >= i.ready_at_s + self.quantum_s]
        if expired:
            view.unload(earliest_loaded(expired), mode="swap")
        elif residents:
            self.rotate_at(view, gpu, min(i.ready_at_s for i in residents) + self.quantum_s)

    def rotate_at(self, view: ClusterView, gpu: Gpu, due_s: float) -> None:
        """Rotate ``gpu``'s group again at ``due_s`` (its own method: a closure in :meth:`rotate`, which runs on every
        arrival, would be allocated on each call)."""
        self.rechecks.at(view, gpu.index, due_s, lambda v: self.rotate(v, gpu))


register(TimeSlicePolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
