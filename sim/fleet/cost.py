"""What a run's fleet cost: GPU-hours billed per pool (from each node's provisioning until its release, or
the run's end), at the pool's price, and that cost per request and per token served."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sim.engine.engine import Engine
    from sim.fleet.hardware import PoolLayout


def physical_gpus_per_node(layout: PoolLayout) -> int:
    """GPUs billed per node: a MIG slice is part of a GPU, and the GPU is what is rented."""
    mig = layout.config.mig
    return layout.gpus_per_node // mig.slices_per_gpu if mig else layout.gpus_per_node


def fleet_summary(engine: Engine, layouts: list[PoolLayout], events, completed: int, output_tokens: int,
                  autoscaler: str, peak_nodes: list[int] | None = None) -> dict:
    """GPU-hours and cost per pool and in all, cost per 1,000 completed requests and per million output
    tokens, the GPUs' busy share of the time billed, and the autoscaler's decisions."""
    end_s = engine.env.now
    pools: dict[str, dict] = {}
    for layout in layouts:
        nodes = [engine.nodes[n] for n in layout.node_indexes]
        gpu_hours = sum(node.seconds_billed(end_s) for node in nodes) * physical_gpus_per_node(layout) / 3600
        pools[layout.name] = {
            "profile": layout.profile.name, "gpus_per_node": physical_gpus_per_node(layout),
            "price_per_gpu_hour": layout.price_per_gpu_hour,
            "nodes_at_start": layout.config.nodes,
            "nodes_peak": peak_nodes[layout.index] if peak_nodes else layout.config.nodes,
            "nodes_max": layout.config.max_nodes,
            "gpu_hours": gpu_hours, "cost_usd": gpu_hours * layout.price_per_gpu_hour,
        }
    cost = sum(pool["cost_usd"] for pool in pools.values())
    kinds, details = events.text("kind"), events.text("detail")
    decisions = {kind: int((kinds == kind).sum()) for kind in ("scale_up", "scale_down", "scale_blocked")}
    stages = details[kinds == "cold_start"]
    return {
        "autoscaler": autoscaler,
        "gpu_hours": sum(pool["gpu_hours"] for pool in pools.values()),
        "cost_usd": cost,
        "cost_per_1k_requests_usd": cost / completed * 1000 if completed else None,
        "cost_per_million_output_tokens_usd": cost / output_tokens * 1e6 if output_tokens else None,
        "busy_share_of_billed": _busy_share_of_billed(engine, end_s),
        "cold_starts": int((stages == "container_init").sum()),
        "nodes_provisioned": int((stages == "provision").sum()),
        "nodes_released": int((kinds == "node_release").sum()),
        **decisions,
        "pools": pools,
    }


def _busy_share_of_billed(engine: Engine, end_s: float) -> float:
    """Busy GPU-seconds over billed GPU-seconds: how much of what was paid for computed something."""
    billed = np.array([engine.nodes[g.node].seconds_billed(end_s) for g in engine.gpus])
    busy = np.array([g.busy_s for g in engine.gpus])
    return float(busy.sum() / billed.sum()) if billed.sum() > 0 else 0.0
