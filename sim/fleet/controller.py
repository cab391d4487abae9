"""The fleet controller: every ``autoscaler.interval_s`` it reads each model's signals, asks the autoscaler
for a replica count and makes it so, provisioning and releasing nodes on the way.

Scale-up takes a whole free GPU (or aligned GPU group) for each new instance, as Kubernetes allocates
GPUs, on a node that is up, else on one being provisioned, else on a new node of the pool the placement
rule prefers; the instance then goes through its cold-start stages (:mod:`sim.fleet.coldstart`). A
scale-down follows the highest count asked for over ``scale_down_window_s`` (HPA's stabilisation) and
retires instances: cold starts are cancelled first, then the least busy ready instances stop taking
requests and unload once empty. A node with nothing on it for ``node_idle_s`` is released, down to its
pool's ``min_nodes``. Every decision is logged as an event with the signal that drove it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Generator

import simpy

from sim.engine.stillness import INF, first_on_grid, next_change_s
from sim.fleet.autoscalers import Autoscaler, ModelSignals, checked_answer, checked_rest
from sim.fleet.coldstart import DiskTimeline, TransferBooking, expected_start_s, instance_stages
from sim.fleet.rebalance import share_queues
from sim.fleet.window import WindowMax
from sim.files import counted
from sim.fleet.cost import physical_gpus_per_node
from sim.parallel import node_load_share

if TYPE_CHECKING:
    from sim.engine.engine import Engine
    from sim.engine.gpu import Gpu
    from sim.engine.instance import Instance
    from sim.fleet.hardware import PoolLayout

SERVING = ("ready", "loading", "starting")


class FleetController:
    """Holds each model at the replica count its autoscaler asks for."""

    def __init__(self, engine: Engine, scenario, layouts: list[PoolLayout], autoscaler: Autoscaler):
        self.engine = engine
        self.config = scenario.autoscaler
        self.layouts = layouts
        self.autoscaler = autoscaler
        self.gpu_shares = [m.gpu_share for m in scenario.models]
        models = range(len(engine.model_names))
        self.preference = [[layouts[p] for p in engine.placement[m]["pools"]] for m in models]
        self.lead_time_s = [self._lead_time_s(m) for m in models]
        self.arrivals_seen = [0] * len(engine.model_names)
        self.active_since_s = [0.0] * len(engine.model_names)  # last time a model had a request about
        self.busy_seen: dict[int, float] = {}  # instance uid -> its busy seconds at the last decision
        self.capacity = [self._capacity(m) for m in models]
        # The stabilisation window starts out holding the replicas the run starts with, as if they had been
        # asked for: a fleet is not scaled down within its first window.
        window_s = self.config.scale_down_window_s
        self.wanted = [WindowMax(window_s, 0.0, len(engine.instances_by_model[m])) for m in models]
        self.booked: dict[int, list[int]] = {}  # node being provisioned -> models to start there once it is up
        self.disks = DiskTimeline()  # when cold starts' GPU transfers hold each node's disk
        self.empty_since: dict[int, float] = {}
        self.peak_nodes = [sum(1 for n in engine.nodes if n.pool == layout.index and n.billed) for layout in layouts]
        self.next_arrival_s: Callable[[], float] = lambda: INF  # the workload's next arrival, set by the run
        self.tick: simpy.Event | None = None  # the pending decision
        self.rest_arrival_s = -1.0  # the arrival the pending decision was put off to, in a still stretch
        self.still_since_s = INF  # the first of the decisions in a row that were still
        self.still_answers: list = []  # the autoscaler's answers since then (each the same)
        timeouts = [self.config.idle_timeout_s(name) or 0.0 for name in engine.model_names]
        self.rules_horizon_s = max([self.config.scale_down_window_s, self.config.node_idle_s] + timeouts) \
            + 2 * self.config.interval_s

    def run(self) -> Generator[simpy.Event, None, None]:
        env, engine = self.engine.env, self.engine
        wait_s = self.config.interval_s
        while not engine.all_done.triggered:
            self.tick = env.timeout(wait_s)
            yield self.tick
            still = self.decide(env.now)
            if engine.arrivals_done and self._settled():
                return  # nothing is running, loading or provisioning: further decisions change nothing
            wait_s = self._wait_s(env.now, still)

    def resting_tick(self, next_arrival_s: float) -> simpy.Event | None:
        """The pending decision, if it was put off to ``next_arrival_s`` as one that changes nothing before it."""
        return self.tick if self.rest_arrival_s == next_arrival_s else None

    def _wait_s(self, now: float, still: bool) -> float:
        """Seconds to the next decision: an interval, or in a still stretch the first decision on the grid at or
        after the next change (see :mod:`sim.engine.stillness`).

        A decision is still when it changed nothing, nothing was about and the autoscaler would answer the
        same again. Once decisions have been still for the longest of the scenario's time rules (stabilisation
        window, idle timeouts, node release), those rules have done all they will: each decision until
        something happens is the same as this one."""
        interval_s = self.config.interval_s
        self.rest_arrival_s = -1.0
        if not (still and self._settled() and not self.engine.retiring):
            self.still_since_s = INF
            return interval_s
        self.still_since_s = min(self.still_since_s, now)
        if now - self.still_since_s < self.rules_horizon_s:
            return interval_s
        next_arrival_s = self.next_arrival_s()
        change_s = next_change_s(self.engine.env, next_arrival_s, INF, None)
        if change_s == INF or change_s <= now + interval_s:
            return interval_s
        self.rest_arrival_s = next_arrival_s
        return first_on_grid(now, interval_s, change_s) - now

    # -- deciding ------------------------------------------------------------------------------------
    def decide(self, now: float) -> bool:
        """Bring each model to its replica count; whether the decision was still (see :meth:`_wait_s`)."""
        logged = len(self.engine.recorder.events)
        still = True
        answers = []
        unserved: set[int] | None = None
        for model in range(len(self.engine.model_names)):
            signals = self.signals(model, now)
            answer = checked_answer(self.autoscaler, signals, self.autoscaler.desired(signals))
            # Who waits for a first replica is asked again after each change in this tick: a model decided earlier
            # may have taken its first replica (and some of the room), or been scaled to zero.
            if unserved is None:
                unserved = self._unserved()
            wanted, reason = self._bounded(model, signals, now, answer, self._sharing(model, unserved - {model}))
            rest = checked_rest(self.autoscaler, signals)
            still = still and not (signals.in_system or signals.arrival_rate_per_s or signals.utilisation) \
                and rest is not False
            answers.append((answer, rest))
            current = signals.replicas
            if wanted != current:
                direction = "scale_up" if wanted > current else "scale_down"
                self.engine.recorder.event(now, direction, -1, signals.model,
                                           detail=f"replicas {current}->{wanted}: {reason}")
                if wanted > current:
                    self._scale_up(model, wanted - current, now)
                else:
                    self._scale_down(model, current - wanted)
                unserved = None
        self._unload_emptied()
        self._release_idle_nodes(now)
        if answers != self.still_answers:  # an autoscaler that leaves it to us rests once it answers the same
            self.still_answers = answers
            self.still_since_s = INF
        return still and len(self.engine.recorder.events) == logged

    def _unserved(self) -> set[int]:
        """Models with requests waiting and no replica, serving, starting or booked."""
        engine = self.engine
        booked = {model for models in self.booked.values() for model in models}
        return {model for model, queue in enumerate(engine.pending) if queue and model not in booked
                and not any(i.status in SERVING and i not in engine.retiring for i in engine.instances_by_model[model])}

    def _sharing(self, model: int, others: set[int]) -> list[int]:
        """Those of ``others`` that may run in one of ``model``'s pools, in model order."""
        pools = {layout.index for layout in self.preference[model]}
        return [other for other in sorted(others) if any(layout.index in pools for layout in self.preference[other])]

    def _room_for(self, model: int, unserved_others: list[int]) -> int:
        """Instances of ``model`` its pools hold (at ``max_nodes``) beside what the other models hold now and one
        instance of each model of ``unserved_others``: GPUs under another model's instance (serving or starting,
        not being retired) or booked for one on a node being provisioned are not ``model``'s to take."""
        engine, size = self.engine, self._size(model)
        pools = {layout.index for layout in self.preference[model]}
        taken: dict[int, set[int]] = {pool: set() for pool in pools}
        own: set[int] = set()
        for other, instances in enumerate(engine.instances_by_model):
            for instance in instances:
                if instance.status in SERVING and instance not in engine.retiring:
                    for gpu in instance.shards or [instance.gpu]:
                        if other == model:
                            own.add(gpu.index)
                        elif gpu.pool in pools:
                            taken[gpu.pool].add(gpu.index)
        booked = dict.fromkeys(pools, 0)
        for node_index, models in self.booked.items():
            pool = engine.nodes[node_index].pool
            if pool in pools:
                booked[pool] += sum(self._size(other) for other in models if other != model)
        free = sum(max(0, layout.config.max_nodes * layout.gpus_per_node - len(taken[layout.index] - own)
                       - booked[layout.index]) // size for layout in self.preference[model])
        reserved = sum(self._size(other) for other in unserved_others)
        return free - -(-reserved // size)  # a reserved GPU of a group takes the whole group from ``model``

    def _bounded(self, model: int, signals: ModelSignals, now: float, answer: tuple[int, str],
                 unserved_others: list[int] | None = None) -> tuple[int, str]:
        """The autoscaler's ``answer`` within the scenario's bounds, scale-to-zero and the stabilisation window.

        While other models sharing its pools have requests waiting and no replica (``unserved_others``), a model
        takes at most what its pools hold beside the other models' instances and one instance of each of those,
        and at least one: a first replica comes before a model's next (without it, one model's scale-up could
        take every GPU and leave another's requests waiting to the end). One that holds more is scaled down to
        it at once, past the window."""
        config = self.config
        wanted, reason = answer
        timeout_s = config.idle_timeout_s(self.engine.model_names[model])
        if timeout_s is not None and now - self.active_since_s[model] >= timeout_s:
            self.wanted[model].clear()
            return 0, f"idle {now - self.active_since_s[model]:.0f} s (scale to zero after {timeout_s:g} s)"
        floor = config.min_replicas if timeout_s is None else max(config.min_replicas, 1)
        if signals.queued and floor < 1:
            floor = 1  # a request waits for a model with no replica: start one (Knative's activator)
        wanted = min(max(wanted, floor), config.max_replicas)
        if wanted > self.capacity[model]:
            wanted, reason = self.capacity[model], reason + f"; capped at the {self.capacity[model]} instances the pools hold"
        room_left: int | None = None
        making_room = ""
        if unserved_others:
            room_left = max(1, self._room_for(model, unserved_others))
            making_room = f"; room left for the first replica of {counted(len(unserved_others), 'other model')}"
        cut = False
        if room_left is not None and wanted > room_left:
            cut, wanted, reason = True, room_left, reason + making_room
        held = self.wanted[model].push(now, wanted)
        if wanted < signals.replicas and held > wanted:
            kept = min(held, signals.replicas)
            if room_left is not None and kept > room_left:  # the window would keep the room: down to it at once
                return room_left, reason if cut else reason + making_room
            return kept, reason + f"; held by the {config.scale_down_window_s:g} s window"
        return wanted, reason

    def signals(self, model: int, now: float) -> ModelSignals:
        engine = self.engine
        queued, running, ready, replicas, held, room, busy_s = len(engine.pending[model]), 0, 0, 0, 0, 0, 0.0
        for instance in engine.instances_by_model[model]:
            instance.gpu.sync()
            queued += len(instance.waiting) + len(instance.swapped)
            running += len(instance.running) + len(instance.prefilling)
            if instance.status not in SERVING or instance in engine.retiring:
                continue
            replicas += 1
            instance_busy_s = instance.busy_by(now)  # the step running counted so far: a long prefill is one step
            if instance.status == "ready":
                ready += 1
                held += instance.blocks
                room += instance.blocks + instance.free_blocks()
                busy_s += instance_busy_s - self.busy_seen.get(instance.uid, instance_busy_s)
            self.busy_seen[instance.uid] = instance_busy_s
        replicas += sum(models.count(model) for models in self.booked.values())
        arrived = engine.arrivals_by_model[model] - self.arrivals_seen[model]
        self.arrivals_seen[model] = engine.arrivals_by_model[model]
        if arrived or queued or running:
            self.active_since_s[model] = now
        interval_s = self.config.interval_s
        return ModelSignals(engine.model_names[model], now, interval_s, replicas, ready, queued, running,
                            held / room if room else 0.0, min(1.0, busy_s / (ready * interval_s)) if ready else 0.0,
                            arrived / interval_s, self.lead_time_s[model])

    # -- scaling up ----------------------------------------------------------------------------------
    def _scale_up(self, model: int, count: int, now: float) -> None:
        """Take back instances being retired first (they are warm), then start new ones."""
        engine = self.engine
        for instance in [i for i in engine.instances_by_model[model] if i in engine.retiring][:count]:
            engine.retiring.discard(instance)
            count -= 1
            if instance.status == "ready":  # it takes requests again, the ones left unplaced meanwhile first
                engine.policy.on_instance_ready(instance, engine.view)
        for _ in range(count):
            if not self._start(model, now) and not self._book(model, now):
                self.engine.recorder.event(now, "scale_blocked", -1, self.engine.model_names[model],
                                           detail="no free GPU and every pool at max_nodes")
                return

    def _start(self, model: int, now: float) -> bool:
        """Start an instance on free GPUs of a node that is up, in the placement rule's order of pools."""
        for layout in self.preference[model]:
            for gpu in self._free_groups(model, layout):
                if self._start_on(model, gpu, now):
                    return True
        return False

    def _start_on(self, model: int, gpu: Gpu, now: float) -> bool:
        """Start an instance at ``gpu``; its GPU transfer waits for the disks of the nodes it spans, each read
        for its share of the weights as a policy's load reads them (:func:`sim.engine.residency.load`)."""
        engine = self.engine
        layout = self.layouts[gpu.pool]
        spans = engine.shard_group(model, gpu)
        shard_nodes = [shard.node for shard in spans] if spans else [gpu.node]
        disks = [(engine.nodes[node], node_load_share(shard_nodes.count(node), len(shard_nodes), False))
                 for node in sorted(set(shard_nodes))]
        transfer = TransferBooking(self.disks, disks, now)
        stages = instance_stages(layout.cold_start, engine.costs_on(model, gpu), engine.nodes[gpu.node], model, now,
                                 self._size(model), transfer)
        instance = engine.load(model, gpu, self.gpu_shares[model], cold_start=stages)
        if instance is None:
            return False
        transfer.book(instance.uid)
        return True

    def _book(self, model: int, now: float) -> bool:
        """Book room on a node being provisioned, else provision a new node for the model."""
        engine = self.engine
        for layout in self.preference[model]:
            for node_index, models in self.booked.items():
                if engine.nodes[node_index].pool == layout.index and self._room_left(node_index, models + [model]):
                    models.append(model)
                    return True
            for node_index in layout.node_indexes:
                node = engine.nodes[node_index]
                if not node.billed and self._room_left(node_index, [model]):
                    self._provision(node_index, model, layout, now)
                    return True
        return False

    def _provision(self, node_index: int, model: int, layout: PoolLayout, now: float) -> None:
        engine = self.engine
        node = engine.nodes[node_index]
        node.provision(now)
        self.booked[node_index] = [model]
        first_gpu = layout.first_gpu + (node_index - layout.first_node) * layout.gpus_per_node
        engine.recorder.event(now, "cold_start", first_gpu, engine.model_names[model],
                              duration_s=layout.cold_start.provision_s, detail="provision")
        engine.recorder.event(now, "billing", first_gpu, "", detail=f"pool={layout.name} gpus=+{physical_gpus_per_node(layout)}")
        billed = sum(1 for n in engine.nodes if n.pool == layout.index and n.billed)
        self.peak_nodes[layout.index] = max(self.peak_nodes[layout.index], billed)
        engine.env.process(self._bring_up(node_index, layout.cold_start.provision_s))

    def _bring_up(self, node_index: int, seconds: float) -> Generator[simpy.Event, None, None]:
        engine = self.engine
        yield engine.env.timeout(seconds)
        engine.nodes[node_index].up = True
        engine.refresh_live_gpus()
        engine.recorder.event(engine.env.now, "node_up", -1, "", detail=f"node={node_index}")
        for model in self.booked.pop(node_index):
            layout = self.layouts[engine.nodes[node_index].pool]
            started = any(self._start_on(model, gpu, engine.env.now)
                          for gpu in self._free_groups(model, layout) if gpu.node == node_index)
            if not started:
                self._scale_up(model, 1, engine.env.now)

    def _room_left(self, node_index: int, models: list[int]) -> bool:
        """Whether a node's GPUs hold one instance of each of ``models`` (whole GPUs each; the pools a model
        is offered, its placement order, are those whose GPUs its footprint fits)."""
        layout = self.layouts[self.engine.nodes[node_index].pool]
        return sum(self._size(m) for m in models) <= layout.gpus_per_node

    def _free_groups(self, model: int, layout: PoolLayout) -> list[Gpu]:
        """First GPUs of the aligned groups of ``model``'s size on the pool's up nodes that nothing occupies."""
        engine, size = self.engine, self._size(model)
        gpus = engine.gpus[layout.first_gpu:layout.first_gpu + layout.gpus_per_node * layout.config.max_nodes]
        free = []
        for start in range(0, len(gpus) - size + 1, size):
            group = gpus[start:start + size]
            if all(engine.nodes[g.node].up and not g.instances for g in group):
                if len({g.node for g in group}) == 1 or size > layout.gpus_per_node:
                    free.append(group[0])
        return free

    def _capacity(self, model: int) -> int:
        """The most instances of ``model`` the pools could hold, each on whole GPUs of its own."""
        return sum(layout.config.max_nodes * layout.gpus_per_node // self._size(model) for layout in self.preference[model])

    def _size(self, model: int) -> int:
        tp, pp = self.engine.parallel[model]
        return tp * pp

    def _lead_time_s(self, model: int) -> float:
        if not self.preference[model]:
            return 0.0
        layout = self.preference[model][0]
        costs = self.engine.pool_costs[layout.index][model]
        return expected_start_s(layout.cold_start, costs, new_node=True, gpus_per_instance=self._size(model))

    def instance_ready(self, instance: Instance) -> None:
        """A cold start is over: the model's queued requests are shared out to it (:func:`share_queues`)."""
        share_queues(self.engine, instance)

    # -- scaling down --------------------------------------------------------------------------------
    def _scale_down(self, model: int, count: int) -> None:
        for models in self.booked.values():
            while count and model in models:
                models.remove(model)
                count -= 1
        engine = self.engine
        live = [i for i in engine.instances_by_model[model] if i.status in SERVING and i not in engine.retiring]
        starting = [i for i in live if i.status != "ready"]
        ready = sorted((i for i in live if i.status == "ready"), key=lambda i: (i.num_requests, -i.uid))
        for instance in (starting[::-1] + ready)[:count]:
            engine.retiring.add(instance)
            if instance.status != "ready":
                self.disks.cancel(instance.uid, engine.env.now)  # a cancelled start transfers nothing
        self._unload_emptied()

    def _unload_emptied(self) -> None:
        engine = self.engine
        # Oldest first, never the set's own order: that follows memory addresses, so instances emptied together
        # unloaded in an order that hung on what the process had run before (compare and sweeps run many in one).
        for instance in sorted(engine.retiring, key=lambda i: i.uid):
            if instance.status == "gone" or instance.status == "draining":
                engine.retiring.discard(instance)
            elif instance.num_requests == 0:
                engine.retiring.discard(instance)
                engine.unload(instance, mode="recompute")

    def _release_idle_nodes(self, now: float) -> None:
        engine = self.engine
        for layout in self.layouts:
            for node_index in layout.node_indexes:
                node = engine.nodes[node_index]
                if not node.up or node_index in self.booked:
                    continue
                gpus = engine.gpus[layout.first_gpu + (node_index - layout.first_node) * layout.gpus_per_node:][
                    :layout.gpus_per_node]
                if any(g.instances for g in gpus):
                    self.empty_since.pop(node_index, None)
                    continue
                since = self.empty_since.setdefault(node_index, now)
                billed = sum(1 for n in engine.nodes if n.pool == layout.index and n.billed)
                if now - since >= self.config.node_idle_s and billed > layout.config.min_nodes:
                    node.release(now)
                    self.empty_since.pop(node_index)
                    engine.refresh_live_gpus()
                    engine.recorder.event(now, "node_release", -1, "", detail=f"node={node_index}")
                    engine.recorder.event(now, "billing", -1, "",
                                          detail=f"pool={layout.name} gpus=-{physical_gpus_per_node(layout)}")

    def _settled(self) -> bool:
        return self.engine.settled() and not self.booked
