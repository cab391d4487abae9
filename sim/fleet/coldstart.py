"""The cold-start pipeline of a new serving instance, as timed stages.

An instance started on a node goes through container init, image pull, runtime start, weight fetch,
CPU deserialisation, GPU transfer and warm-up, one after another. A node keeps what earlier starts left
there: an image already pulled (or being pulled) is not pulled again, and weights already fetched to its
disk are not fetched again. ``lazy_pull`` lets the container start once part of the image is in (the
rest arrives in the background); ``weight_streaming`` runs fetch, deserialisation and GPU transfer at
once. A new node adds its provisioning before all of it (see :mod:`sim.fleet.controller`).
"""

from __future__ import annotations

from sim.costs import ModelCosts
from sim.engine.transfers import Node
from sim.fleet.config import ColdStart

GB = 1e9

Stage = tuple[str, float, float]
"""(stage name, start offset from the decision in seconds, seconds)."""


def instance_stages(cold: ColdStart, costs: ModelCosts, node: Node, model: int, now: float,
                    gpus_per_instance: int = 1) -> list[Stage]:
    """The stages of starting ``model`` on ``node`` at ``now``; books the node's image pull and weight fetch
    so that later starts there reuse them."""
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
        stages += [("weight_fetch", at, fetch_s), ("deserialise", at, deserialise_s), ("gpu_transfer", at, transfer_s)]
        at += max(fetch_s, deserialise_s, transfer_s)
    else:
        for name, seconds in (("weight_fetch", fetch_s), ("deserialise", deserialise_s), ("gpu_transfer", transfer_s)):
            stages.append((name, at, seconds))
            at += seconds
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
