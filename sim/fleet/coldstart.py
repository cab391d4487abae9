"""The cold-start pipeline of a new serving instance, as timed stages.

An instance started on a node goes through container init, image pull, runtime start, weight fetch,
CPU deserialisation, GPU transfer and warm-up, one after another. A node keeps what earlier starts left
there: an image already pulled (or being pulled) is not pulled again, and weights already fetched to its
disk are not fetched again. The GPU transfer holds the node's disk, the channel a policy's load books
(:meth:`sim.engine.transfers.Node.transfer`), so two starts on one node transfer one after the other
(:class:`DiskTimeline`). ``lazy_pull`` lets the container start once part of the image is in (the
rest arrives in the background); ``weight_streaming`` runs fetch, deserialisation and GPU transfer at
once. A new node adds its provisioning before all of it (see :mod:`sim.fleet.controller`).
"""

from __future__ import annotations

from bisect import insort
from typing import Sequence

from sim.costs import ModelCosts
from sim.engine.transfers import Node
from sim.fleet.config import ColdStart

GB = 1e9
INF = float("inf")

Stage = tuple[str, float, float]
"""(stage name, start offset from the decision in seconds, seconds)."""


CHANNEL = "disk"
"""The node channel a cold start's GPU transfer holds: a policy's load from disk books it for the same seconds."""


class DiskTimeline:
    """When cold starts' GPU transfers hold each node's disk.

    A cold start's stages are set when it is decided, so its transfer is booked then, for when it is due. The
    node's own timeline (:meth:`Node.transfer`) only queues a booking behind the last one; this one also keeps
    the stretches the transfers booked ahead hold, so that a transfer due before one booked earlier takes the
    free stretch before it if it fits there (else it follows it: a booked transfer is never pushed back). Loads
    booked on the node meanwhile (a policy's) hold, as far as is known here, everything from the last look to
    where the node's timeline then ends."""

    def __init__(self) -> None:
        self.held: dict[int, list[tuple[float, float, int]]] = {}  # node -> (start s, end s, instance uid), by start
        self.seen: dict[int, float] = {}  # node -> where its disk's timeline ended at the last look

    def slot(self, node: Node, due_s: float, seconds: float, now: float) -> float:
        """The earliest start at or after ``due_s`` of ``seconds`` on ``node``'s disk that nothing booked holds."""
        start = due_s
        for begin, end, _ in self._held(node, now):
            if start + seconds <= begin:
                break
            start = max(start, end)
        return start

    def book(self, node: Node, start_s: float, seconds: float, uid: int) -> None:
        """Hold ``seconds`` of ``node``'s disk from ``start_s`` (a :meth:`slot`) for instance ``uid``."""
        insort(self.held[node.index], (start_s, start_s + seconds, uid))
        if start_s >= node.free_at[CHANNEL]:  # past the end of the node's timeline (else in a stretch before it)
            node.transfer(start_s, seconds, CHANNEL)
            self.seen[node.index] = node.free_at[CHANNEL]

    def cancel(self, uid: int, now: float) -> None:
        """A cold start was cancelled: its transfer, if not begun and not the last on its node's timeline (that
        cannot be taken back), frees its stretch."""
        for node_index, held in self.held.items():
            self.held[node_index] = [h for h in held
                                     if h[2] != uid or h[0] <= now or h[1] >= self.seen.get(node_index, 0.0)]

    def _held(self, node: Node, now: float) -> list[tuple[float, float, int]]:
        held = self.held.setdefault(node.index, [])
        ends_s, seen_s = node.free_at[CHANNEL], self.seen.get(node.index, -INF)
        if ends_s > seen_s:  # loads booked since the last look: after it, up to the timeline's end
            insort(held, (max(seen_s, now), ends_s, -1))
            self.seen[node.index] = ends_s
        if held and held[0][1] <= now:
            held[:] = [h for h in held if h[1] > now]
        return held


class TransferBooking:
    """One cold start's GPU transfer on the disks of the nodes its GPUs are on, each for its share of the
    seconds as a load's reads are shared (:func:`sim.parallel.node_load_share`): planned by
    :func:`instance_stages`, booked by :meth:`book` once the instance exists."""

    def __init__(self, timeline: DiskTimeline, disks: Sequence[tuple[Node, float]], now: float):
        self.timeline, self.disks, self.now = timeline, disks, now
        self.planned: list[tuple[Node, float, float]] = []

    def plan(self, due_s: float, seconds: float) -> tuple[float, float]:
        """How long the transfer due at ``due_s`` waits for the first of its disks, and how long from then until
        the last is done."""
        self.planned = [(node, self.timeline.slot(node, due_s, seconds * share, self.now), seconds * share)
                        for node, share in self.disks if seconds * share > 0]
        if not self.planned:
            return 0.0, seconds
        start = min(begin for _, begin, _ in self.planned)
        return start - due_s, max(begin - start + held for _, begin, held in self.planned)

    def book(self, uid: int) -> None:
        for node, begin, held in self.planned:
            self.timeline.book(node, begin, held, uid)


def instance_stages(cold: ColdStart, costs: ModelCosts, node: Node, model: int, now: float,
                    gpus_per_instance: int = 1, transfer: TransferBooking | None = None) -> list[Stage]:
    """The stages of starting ``model`` on ``node`` at ``now``; books the node's image pull and weight fetch
    so that later starts there reuse them. With ``transfer`` the GPU transfer waits for the node's disk
    (it starts once transfers booked before it are done; it is booked by ``transfer.book``); without, the
    disk is taken to be free."""
    stages: list[Stage] = [("container_init", 0.0, cold.container_init_s)]
    at = cold.container_init_s
    pull_s = _image_pull_s(cold, node, now + at)
    stages.append(("image_pull", at, pull_s))
    at += pull_s
    stages.append(("runtime_start", at, cold.runtime_start_s))
    at += cold.runtime_start_s
    weight_bytes = costs.weight_bytes()
    fetch_s = _weight_fetch_s(cold, node, model, weight_bytes, now + at)
    # Each rank of a tensor/pipeline-parallel instance deserialises its own shard, in parallel.
    deserialise_s = weight_bytes / gpus_per_instance / (cold.deserialise_gb_per_s * GB)
    transfer_s = cold.gpu_transfer_s if cold.gpu_transfer_s is not None else costs.reload_s()
    if cold.weight_streaming:
        # The transfer streams beside the fetch and the deserialisation, from when they start (or its disk is free).
        wait_s, held_s = (0.0, transfer_s) if transfer is None else transfer.plan(now + at, transfer_s)
        stages += [("weight_fetch", at, fetch_s), ("deserialise", at, deserialise_s),
                   ("gpu_transfer", at + wait_s, held_s)]
        at += max(fetch_s, deserialise_s, wait_s + held_s)
    else:
        for name, seconds in (("weight_fetch", fetch_s), ("deserialise", deserialise_s)):
            stages.append((name, at, seconds))
            at += seconds
        wait_s, held_s = (0.0, transfer_s) if transfer is None else transfer.plan(now + at, transfer_s)
        at += wait_s
        stages.append(("gpu_transfer", at, held_s))
        at += held_s
    stages.append(("warm_up", at, cold.warm_up_s))
    return stages


def stages_seconds(stages: list[Stage]) -> float:
    """Seconds from the decision until the last stage ends."""
    return max((offset_s + seconds for _, offset_s, seconds in stages), default=0.0)


def expected_start_s(cold: ColdStart, costs: ModelCosts, new_node: bool, gpus_per_instance: int = 1) -> float:
    """What a start on a fresh node takes, stage by stage, with nothing cached there: the lead time an
    autoscaler that provisions ahead must look forward by."""
    fresh = Node(-1, 0, up=False)
    seconds = stages_seconds(instance_stages(cold, costs, fresh, 0, 0.0, gpus_per_instance))
    return seconds + (cold.provision_s if new_node else 0.0)


def _image_pull_s(cold: ColdStart, node: Node, start_s: float) -> float:
    """Seconds the start waits for the image: none if it is there, the rest of a pull under way, else a pull
    (with ``lazy_pull``, only its first ``lazy_pull_fraction``; the rest completes in the background)."""
    full_s = cold.image_gb / cold.registry_gb_per_s
    if node.image_ready_s < float("inf"):  # pulled, or a pull under way: wait for it (or its lazy part)
        needed_s = node.image_ready_s - ((1.0 - cold.lazy_pull_fraction) * full_s if cold.lazy_pull else 0.0)
        return max(0.0, needed_s - start_s)
    node.image_ready_s = start_s + full_s
    return full_s * cold.lazy_pull_fraction if cold.lazy_pull else full_s


def _weight_fetch_s(cold: ColdStart, node: Node, model: int, weight_bytes: int, start_s: float) -> float:
    ready_s = node.disk_ready_s.get(model)
    if ready_s is not None:
        return max(0.0, ready_s - start_s)
    fetch_s = weight_bytes / (cold.weight_fetch_gb_per_s * GB)
    node.disk_ready_s[model] = start_s + fetch_s
    return fetch_s
