"""Model residency: loading a model's weights onto a GPU and unloading them again.

A load books the node's disk (or, from a host-RAM copy, its host-to-device
link) for the profile's reload time; an unload first preempts everything the
instance holds (KV swap or drop) and then pays the profile's unload time
before the memory is free. Requests that were paused by an unload are charged
the unload and, when their model comes back, the reload.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Generator

import simpy

from sim.costs import ModelCosts
from sim.engine.instance import Instance
from sim.engine.request import Request
from sim.engine.preemption import unexplained
from sim.engine.prefix import IdleRuns
from sim.parallel import node_load_share

if TYPE_CHECKING:  # the engine imports this module
    from sim.engine.engine import Engine
    from sim.engine.gpu import Gpu


def _paused(request: Request) -> bool:
    return not math.isnan(request.preempted_at_s)


def load(engine: Engine, model: int, gpu: Gpu, gpu_share: float = 1.0,
         cold_start: list[tuple[str, float, float]] | None = None) -> Instance | None:
    """Start loading ``model`` onto ``gpu``; None when its weights do not fit in the free memory, or the
    GPU's node is down.

    The weights come from the node's host-RAM copy when an earlier unload kept one, else from disk. A
    ``cold_start`` (stages of a new serving instance, each ``(name, start offset s, seconds)``; see
    :mod:`sim.fleet.coldstart`) replaces that: the instance is ``starting``, and takes no requests, until
    its last stage ends."""
    costs = engine.costs_on(model, gpu)
    shards = engine.shard_group(model, gpu)
    spans = shards or [gpu]
    if not spans or not engine.nodes[gpu.node].up or not _fits(engine, model, gpu_share, spans, shards):
        return None
    offloaded = _offloaded_bytes(costs, gpu_share, spans)
    if not all(engine.nodes[node].room_for_offload(bytes_, model) for node, bytes_ in offloaded.items()):
        return None  # the layers it keeps on the CPU do not fit beside the swapped KV in host RAM
    gpu = spans[0]
    env = engine.env
    engine.progress.loaded(engine.model_names[model], env.now)
    instance = Instance(engine.new_uid(), model, engine.model_names[model], costs, gpu, gpu_share, engine.config,
                        engine.reserve_bytes[model], engine.shard_weight_bytes(model, gpu_share),
                        engine.block_bytes(model), shards, engine.max_model_len[model])
    for shard in spans:
        shard.instances.append(instance)
        shard.evict_idle_cache()  # other instances' idle cached prefixes counted as free memory: the weights take it
    engine.instances.append(instance)
    engine.instances_by_model[model].append(instance)
    for node_index, bytes_ in offloaded.items():
        engine.nodes[node_index].offloaded[instance.uid] = bytes_
    engine.residents_changed(spans)  # its weights shrink its neighbours' KV room, and so their max_model_len
    node = engine.nodes[gpu.node]
    if cold_start is not None:
        instance.status = "starting"
        env.process(_start_cold(engine, instance, cold_start))
        return instance
    from_host = all(model in engine.nodes[n].host_weights for n in {shard.node for shard in spans})
    total = _book_weights(engine, costs, gpu_share, spans, from_host)
    engine.recorder.event(env.now, "load", gpu.index, instance.name, duration_s=total,
                          detail=f"share={gpu_share:g} from={'host' if from_host else 'disk'}")
    prefixes: IdleRuns = []
    if model in node.host_prefixes and instance.prefix_cache is not None:
        prefixes, blocks, _ = node.host_prefixes.pop(model)
        # The prefix blocks come back over the link while the weights load; ready when both are in.
        restore_s = node.transfer(env.now, costs.kv_transfer_s(blocks * engine.config.block_size, "host_to_device"),
                                  "host_to_device")
        engine.recorder.event(env.now, "prefix_in", gpu.index, instance.name, duration_s=restore_s,
                              detail=f"blocks={blocks}")
        total = max(total, restore_s)
    env.process(_finish_load(engine, instance, total, prefixes))
    return instance


def _start_cold(engine: Engine, instance: Instance,
                stages: list[tuple[str, float, float]]) -> Generator[simpy.Event, None, None]:
    """Run a cold start's stages, each logged as an event when it starts; the instance is ready after the last."""
    env = engine.env
    elapsed_s = 0.0
    for name, offset_s, seconds in sorted(stages, key=lambda stage: stage[1]):
        if offset_s > elapsed_s:
            yield env.timeout(offset_s - elapsed_s)
            elapsed_s = offset_s
        if instance.status != "starting":
            return  # retired before it was ready
        engine.recorder.event(env.now, "cold_start", instance.gpu.index, instance.name, duration_s=seconds, detail=name)
    total_s = max((offset_s + seconds for _, offset_s, seconds in stages), default=0.0)
    yield from _finish_load(engine, instance, total_s - elapsed_s, [])
    if instance.status == "ready":
        engine.recorder.event(env.now, "instance_ready", instance.gpu.index, instance.name)
        fleet: Any = engine.fleet
        if fleet is not None:
            fleet.instance_ready(instance)


def _offloaded_bytes(costs: ModelCosts, gpu_share: float, spans: list[Gpu]) -> dict[int, int]:
    """Host RAM the layers an instance keeps on the CPU take, by node: each node holds its GPUs' share of them."""
    cpu_bytes = costs.cpu_weight_bytes(gpu_share)
    if cpu_bytes <= 0:
        return {}
    nodes = [shard.node for shard in spans]
    return {node: cpu_bytes * nodes.count(node) // len(spans) for node in sorted(set(nodes))}


def _fits(engine: Engine, model: int, gpu_share: float, spans: list[Gpu], shards: list[Gpu] | None) -> bool:
    """Whether ``model``'s weights fit on every GPU it would span, beside instances it can share them with: a
    tensor- or pipeline-parallel instance shares its GPUs only with instances spanning exactly the same ones."""
    footprint = engine.footprint_bytes(model, gpu_share)
    for shard in spans:
        if any(other.shards != shards for other in shard.instances):
            return False
        shard.cut_window()  # settle a fast-forward window so the memory check sees now, not its start
        if footprint > shard.free_bytes() - shard.in_flight_bytes():
            return False
    return True


def _book_weights(engine: Engine, costs, gpu_share: float, spans: list[Gpu], from_host: bool) -> float:
    """Book the weight transfer of a load on the nodes it spans; returns the seconds until all of it is in.

    Each node reads its share of the weights. From disk a node's share takes its share of the one-GPU
    reload time (the node's disk is one channel); from host RAM each GPU's shard comes over its own link
    at once, which is the reload time divided by the number of shards."""
    seconds = costs.reload_s(gpu_share, from_host)
    channel = "host_to_device" if from_host else "disk"
    now = engine.env.now
    total = 0.0
    for node_index in sorted({shard.node for shard in spans}):
        on_node = sum(1 for shard in spans if shard.node == node_index)
        share = node_load_share(on_node, len(spans), from_host)
        total = max(total, engine.nodes[node_index].transfer(now, seconds * share, channel))
    return total


def _finish_load(engine: Engine, instance: Instance, seconds: float,
                 prefixes: IdleRuns) -> Generator[simpy.Event, None, None]:
    yield engine.env.timeout(seconds)
    if instance.status != "loading" and instance.status != "starting":
        return  # unloaded before its weights were in
    if prefixes and instance.prefix_cache is not None:
        instance.gpu.sync()  # a co-resident window's iterations before now evicted with the memory of before
        instance.gpu.releases += 1
        instance.prefix_cache.restore(prefixes, instance.gpu.releases)
        instance.gpu.evict_idle_cache()
    now = engine.env.now
    instance.status = "ready"
    instance.ready_at_s = instance.last_used_s = now
    engine.policy.on_instance_ready(instance, engine.view)
    # Only the paused requests this load brought back (queued here once the policy has routed) pay for it;
    # a paused request still pending, e.g. for another instance of its model, is not charged this reload. One
    # paused after the load began, or moved here from another load, pays only what its pause leaves unexplained.
    for request in (*instance.waiting, *instance.swapped):
        if _paused(request):
            charged = unexplained(request, seconds, now)
            request.add_loss("reload", charged)
            request.pause_charged += charged
    instance.gpu.kick()


def unload(engine: Engine, instance: Instance, mode: str = "swap", keep_on_host: bool = False,
           keep_prefix_cache: bool = False) -> bool:
    """Start unloading ``instance``; its requests go back to their model's pending queue.

    With ``keep_on_host`` the weights stay cached in the node's RAM (if it has room), so the
    next load of the model on that node reads them from RAM instead of disk. With
    ``keep_prefix_cache`` its cached prefix blocks move to the node's RAM over the link (if they
    fit) and come back with the model's next load on that node; otherwise they are lost."""
    if instance.status not in ("ready", "loading", "starting"):
        return False
    instance.status = "draining"
    engine.progress.unloaded(instance.name)
    engine.env.process(_drain(engine, instance, mode, keep_on_host, keep_prefix_cache))
    return True


def _keep_prefixes(engine: Engine, instance: Instance, now: float) -> float:
    """Copy the instance's cached prefix blocks (by now all idle) to its node's RAM; returns the seconds."""
    cache = instance.prefix_cache
    if cache is None or not cache.idle_blocks:
        return 0.0
    blocks = cache.idle_blocks
    node = engine.nodes[instance.gpu.node]
    # Oldest released first: the order they are evicted in.
    # The whole model's KV of those blocks, as a swapped request's is booked: a parallel instance's block_bytes is
    # one GPU's shard of a block.
    prefix_bytes = blocks * engine.config.block_size * instance.costs.kv_bytes_per_token
    if not node.keep_prefixes(instance.model, cache.idle_runs(), blocks, prefix_bytes):
        return 0.0
    seconds = node.transfer(now, instance.costs.kv_transfer_s(blocks * engine.config.block_size, "device_to_host"),
                            "device_to_host")
    engine.recorder.event(now, "prefix_out", instance.gpu.index, instance.name, duration_s=seconds, detail=f"blocks={blocks}")
    return seconds


def _drain(engine: Engine, instance: Instance, mode: str, keep_on_host: bool,
           keep_prefix_cache: bool) -> Generator[simpy.Event, None, None]:
    env, gpu = engine.env, instance.gpu
    gpu.cut_window()
    while gpu.current is not None and gpu.current.instance is instance:
        yield gpu.current_done
    now = env.now
    # Another instance's window or time-shared run may be under way: its iterations up to now allocate (and evict
    # idle cached blocks) with the memory as it was before this release, as they did one by one in exact mode.
    gpu.sync()
    transfer_s = 0.0
    for request in (*instance.running, *instance.prefilling):
        transfer_s = max(transfer_s, engine.preempt(instance, request, mode, now))
    evicted = [*instance.swapped, *instance.waiting]
    for request in evicted:
        instance.release(request)
        engine.unplace(request)
    # The KV freed here is room for the instances still running on the GPU: a window (or time-shared run) one of
    # them started while this one's last step ended is cut, so that its next boundary sees the room.
    gpu.cut_window()
    if keep_prefix_cache:
        transfer_s = max(transfer_s, _keep_prefixes(engine, instance, now))
    unload_s = instance.costs.unload_s(instance.gpu_share)
    engine.recorder.event(now, "unload", gpu.index, instance.name, duration_s=transfer_s + unload_s, detail=mode)
    engine.policy.on_evicted(instance, evicted, engine.view)
    yield env.timeout(transfer_s + unload_s)
    for request in evicted:
        if _paused(request) and request.preempted_at_s == now:
            charged = unexplained(request, unload_s, env.now)  # it may be loading (or running again) elsewhere
            request.add_loss("unload", charged)
            request.pause_charged += charged
    spans = instance.shards or [gpu]
    for shard in spans:
        shard.sync()  # the iterations before now ran beside the weights still resident
    if keep_on_host:
        for node_index in sorted({shard.node for shard in spans}):  # each node keeps its shards' share
            on_node = sum(1 for shard in spans if shard.node == node_index)
            engine.nodes[node_index].cache_weights(instance.model, instance.costs.weight_bytes() * on_node // len(spans))
    for shard in spans:
        shard.instances.remove(instance)
    engine.instances.remove(instance)
    engine.instances_by_model[instance.model].remove(instance)
    instance.status = "gone"
    for shard in spans:
        engine.nodes[shard.node].offloaded.pop(instance.uid, None)
    engine.residents_changed(spans)
    for shard in spans:
        shard.kick()
    engine.policy.on_unloaded(instance, engine.view)
