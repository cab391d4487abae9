"""The cluster's hardware: node pools laid out as nodes and GPUs, each GPU with its pool's profile and price.

Every node a pool may ever have exists from the start, so that GPU and node indexes never change; the
nodes beyond a pool's ``nodes`` are down (unbilled, invisible to policies) until an autoscaler
provisions them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import simpy

from sim.engine.gpu import Gpu
from sim.engine.transfers import Node
from sim.errors import MmsimError
from sim.fleet.config import ColdStart, MigConfig, Pool
from sim.profile import MigSlice, Profile, load_profile

GIB = 2**30


@dataclass(frozen=True)
class PoolLayout:
    """Where one pool's nodes and GPUs sit in the cluster's lists, and what they are."""

    index: int
    config: Pool
    profile: Profile
    price_per_gpu_hour: float
    cold_start: ColdStart
    gpus_per_node: int  # GPUs (or MIG slices) per node
    first_node: int
    first_gpu: int

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def compute_share(self) -> float:
        """The share of a GPU's SMs and memory bandwidth each of the pool's devices has: a MIG slice's, or 1."""
        mig = self.config.mig
        return self.profile.hardware.gpu.mig_profiles[mig.profile].compute_share if mig else 1.0

    @property
    def node_indexes(self) -> range:
        return range(self.first_node, self.first_node + self.config.max_nodes)


def pool_layouts(scenario, base_dir: Path) -> list[PoolLayout]:
    """Each pool's profile, price and stage settings, and its place in the node and GPU lists."""
    layouts = []
    first_node = first_gpu = 0
    for index, pool in enumerate(scenario.pools):
        field = "cluster" if scenario.cluster.pools is None else f"cluster.pools.{index}"
        try:
            profile = load_profile(pool.profile, base_dir)
        except MmsimError as error:
            raise MmsimError(str(error), field=f"{field}.profile" if scenario.cluster.pools else "profile") from None
        per_node = (pool.gpus_per_node or profile.hardware.gpu.gpus_per_node) * (pool.mig.slices_per_gpu if pool.mig else 1)
        layouts.append(PoolLayout(index, pool, profile, pool.price(profile.name), pool.cold_start or scenario.cold_start,
                                  per_node, first_node, first_gpu))
        first_node += pool.max_nodes
        first_gpu += pool.max_nodes * per_node
    return layouts


def build_hardware(env: simpy.Environment, scenario, layouts: list[PoolLayout]) -> tuple[list[Gpu], list[Node]]:
    """Nodes and GPUs (or MIG slices) of every pool, with usable memory per vLLM's utilisation cap."""
    _check_parallel(scenario, layouts)
    usable = scenario.engine.gpu_memory_utilization
    gpus: list[Gpu] = []
    nodes: list[Node] = []
    for layout in layouts:
        slices = _slices(layout, scenario.cluster.pools is not None)
        for n in range(layout.config.max_nodes):
            node = Node(len(nodes), int(layout.config.host_memory_gb * GIB), layout.index, up=n < layout.config.nodes)
            if node.up:  # a node serving from the start has every model's weights on its disk (the paper's reloads)
                node.disk_ready_s.update({model: 0.0 for model in range(len(scenario.models))})
            nodes.append(node)
            for _ in range(layout.gpus_per_node // len(slices)):
                for slice_bytes, share in slices:
                    gpus.append(Gpu(env, len(gpus), node.index, int(slice_bytes * usable), share, layout.index))
    _check_pins(scenario, gpus, nodes)
    return gpus, nodes


def _check_pins(scenario, gpus: list[Gpu], nodes: list[Node]) -> None:
    """A model's ``gpus`` must name GPUs serving from the start: policies index the cluster's GPUs by them, and
    one past the end, or on a node an autoscaler has not provisioned yet, would fail mid-run or be ignored."""
    for entry in scenario.models:
        for index in entry.gpus or []:
            if index >= len(gpus):
                raise MmsimError(f"GPU {index} is not in the cluster, whose GPUs are 0 to {len(gpus) - 1}",
                                 field=f"models.{entry.deployment}.gpus")
            if not nodes[gpus[index].node].up:
                raise MmsimError(f"GPU {index} is on node {gpus[index].node}, which is down at the start "
                                 "(beyond its pool's nodes); pin models to GPUs of nodes that start up",
                                 field=f"models.{entry.deployment}.gpus")


def _slices(layout: PoolLayout, in_pools: bool) -> list[tuple[int, float]]:
    """(memory bytes, compute share) of the devices one physical GPU of the pool is split into."""
    pool, gpu_info = layout.config, layout.profile.hardware.gpu
    memory = int(pool.gpu_memory_gb * GIB) if pool.gpu_memory_gb else gpu_info.memory_bytes
    if not pool.mig:
        return [(memory, 1.0)]
    mig = gpu_info.mig_profiles.get(pool.mig.profile)
    if mig is None:
        raise MmsimError(f"profile {layout.profile.name} has no MIG profile {pool.mig.profile!r} "
                         f"(has: {', '.join(gpu_info.mig_profiles) or 'none'})", field=_mig_field(layout, in_pools, "profile"))
    _check_slices_fit(layout, pool.mig, mig, in_pools)
    return [(mig.memory_bytes, mig.compute_share)] * pool.mig.slices_per_gpu


def _check_slices_fit(layout: PoolLayout, config: MigConfig, mig: MigSlice, in_pools: bool) -> None:
    """Refuse more slices than one GPU holds: their SMs and their memory must add up to at most the GPU's (which
    gives NVIDIA's limits: on an A100 or H100, 7 of 1g, 3 of 2g, 2 of 3g, 1 of 7g)."""
    slices, gpu_info = config.slices_per_gpu, layout.profile.hardware.gpu
    compute, memory = slices * mig.compute_share, slices * mig.memory_bytes
    if compute <= 1 + 1e-6 and memory <= gpu_info.memory_bytes:
        return
    most = min(int((1 + 1e-6) / mig.compute_share), gpu_info.memory_bytes // mig.memory_bytes)
    raise MmsimError(f"{slices} MIG slices of {config.profile} do not fit one {gpu_info.name}: they "
                     f"would have {compute:.2f} of its compute and {memory / GIB:.0f} of its "
                     f"{gpu_info.memory_bytes / GIB:.0f} GiB; at most {most} fit",
                     field=_mig_field(layout, in_pools, "slices_per_gpu"))


def _mig_field(layout: PoolLayout, in_pools: bool, key: str) -> str:
    """Where the scenario sets the pool's MIG ``key``: under its pool, or the cluster's own ``mig``."""
    return f"cluster.pools.{layout.index}.mig.{key}" if in_pools else f"cluster.mig.{key}"


def _check_parallel(scenario, layouts: list[PoolLayout]) -> None:
    """Each model's tp x pp GPUs must tile the nodes of some pool: tensor-parallel ranks within a node, groups
    aligned. A model that tiles one pool and not another is placed only in the first."""
    for entry in scenario.models:
        problems = [_tiling_problem(entry, layout) for layout in layouts]
        if all(problems):
            raise MmsimError(str(problems[0]), field=f"models.{entry.deployment}")


def tiles(entry, layout: PoolLayout) -> bool:
    """Whether instances of the model ``entry`` deploys can be laid on the pool's GPUs."""
    return _tiling_problem(entry, layout) is None


def _tiling_problem(entry, layout: PoolLayout) -> str | None:
    tp, size = entry.tensor_parallel, entry.tensor_parallel * entry.pipeline_parallel
    per_node, total = layout.gpus_per_node, layout.gpus_per_node * layout.config.max_nodes
    if size == 1:
        return None
    where = f" of pool {layout.name}" if layout.config.name != "default" else ""
    if layout.config.mig:
        return "tensor or pipeline parallelism over MIG slices is not supported"
    if per_node % tp:
        return f"tensor_parallel {tp} does not divide the {per_node} GPUs of a node{where}"
    if (per_node % size if size <= per_node else size % per_node) or size > total:
        return (f"tensor_parallel x pipeline_parallel = {size} GPUs does not tile the nodes{where} of "
                f"{per_node} GPUs ({total} in all)")
    return None
