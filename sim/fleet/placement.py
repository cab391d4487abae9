"""Which pool a model's instances should go to, when pools of different GPU types are on offer.

``hardware-aware`` ranks the pools a model fits by what a decoded token costs there (price per GPU-hour
x GPUs per instance / tokens per second of a decode step at a reference batch), among the pools whose
step time meets the model's TPOT SLO first; the paper's point is that these differ per model and GPU
type. ``blind`` takes the pools in the scenario's order, as a scheduler unaware of GPU types would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.fleet.hardware import tiles

if TYPE_CHECKING:
    from sim.engine.engine import Engine
    from sim.fleet.hardware import PoolLayout

REFERENCE_BATCH = 32
REFERENCE_CONTEXT_TOKENS = 1024


def pool_preference(engine: Engine, scenario, layouts: list[PoolLayout], model: int, rule: str) -> list[PoolLayout]:
    """The pools that can hold an instance of ``model``, best first under ``rule``."""
    entry = scenario.models[model]
    footprint = engine.footprint_bytes(model, entry.gpu_share)
    usable = [layout for layout in layouts if tiles(entry, layout) and footprint < _gpu_bytes(engine, layout)]
    if rule == "blind":
        return usable
    return sorted(usable, key=lambda layout: token_cost_rank(engine, scenario, layout, model))


def token_cost_rank(engine: Engine, scenario, layout: PoolLayout, model: int) -> tuple[bool, float, int]:
    """(misses the TPOT SLO, US$ per million decoded tokens, pool order): smaller is better."""
    entry = scenario.models[model]
    costs = engine.pool_costs[layout.index][model]
    batch = min(REFERENCE_BATCH, scenario.engine.max_num_seqs)
    step_s = costs.decode_step_s(batch, REFERENCE_CONTEXT_TOKENS, entry.gpu_share)
    gpus = entry.tensor_parallel * entry.pipeline_parallel
    dollars_per_million = layout.price_per_gpu_hour * gpus / 3600 * step_s / batch * 1e6
    tpot_s = scenario.slo_for(entry.deployment).tpot_s
    return (tpot_s is not None and step_s > tpot_s, dollars_per_million, layout.index)


def _gpu_bytes(engine: Engine, layout: PoolLayout) -> int:
    return engine.gpus[layout.first_gpu].capacity_bytes
