"""A deployment's limits, checked as the engine is built: its ``max_model_len``, and the host RAM the layers a
partly offloaded copy keeps on the CPU need. A setting no GPU or node can honour is refused (exit 2, naming the
model's field), as its vLLM would refuse to start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.engine.memory import fitting_tokens
from sim.errors import MmsimError

if TYPE_CHECKING:  # the engine imports this module
    from sim.engine.engine import Engine


def deployment_max_model_len(engine: Engine, model: int, gpu_share: float, wanted: int | None) -> int:
    """vLLM's ``max_model_len``: the longest prompt + output a deployment accepts. By default what fits the KV room
    beside its footprint on the largest GPU; a longer setting is refused."""
    fits = fitting_tokens(max(g.capacity_bytes for g in engine.gpus), engine.footprint_bytes(model, gpu_share),
                          engine.block_bytes(model), engine.config.block_size)
    if wanted is None or fits == 0:
        return fits
    if wanted > fits:
        raise MmsimError(f"max_model_len {wanted:,} is more than the {fits:,} tokens of KV room beside the model's "
                         f"weights and activation reserve on the largest GPU", field=f"models.{engine.model_names[model]}")
    return wanted


def check_offload_fits_host(engine: Engine, model: int, gpu_share: float) -> None:
    """A deployment's layers kept on the CPU live in its node's RAM: refuse one no node's RAM holds (it ran, its CPU
    layers taking no memory). A parallel instance's node holds its GPUs' share of them."""
    costs = engine.costs[model]
    tensor, pipeline = engine.parallel[model]
    span = tensor * pipeline
    per_node = max(sum(1 for gpu in engine.gpus if gpu.node == node.index) for node in engine.nodes)
    cpu_bytes = costs.cpu_weight_bytes(gpu_share) * min(span, per_node) // span
    largest = max(node.host_memory_bytes for node in engine.nodes)
    if cpu_bytes > largest:
        raise MmsimError(f"gpu_share {gpu_share:g} keeps {cpu_bytes / 2**30:.1f} GiB of the model's layers on the "
                         f"CPU, more than the {largest / 2**30:.1f} GiB of a node's host memory "
                         "(cluster.host_memory_gb); raise the share or the host memory",
                         field=f"models.{engine.model_names[model]}.gpu_share")
