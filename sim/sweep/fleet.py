"""The cheapest fleet meeting an SLO target: how many nodes of each pool, for each policy.

Candidates are fixed fleets, every pool held at ``n`` nodes (``nodes = min_nodes = max_nodes = n``, a
pool at 0 left out) for each ``n`` from the pool's ``min_nodes`` to its ``max_nodes``; the scenario's
autoscaler, if any, still sets replicas within them. A fleet's price is its hourly price,
sum(nodes x GPUs per node x price per GPU-hour), known before any run. Mixes are tried in order of
that price (then fewer GPUs, then the node counts), so the first that meets the target is the
cheapest that does: every cheaper mix was run and missed it. The answer is exact whatever the
attainment curve, with no monotonicity assumed; more nodes only ever raise the price (it is a sum of
non-negative terms), so the order is also a walk up from the smallest fleets.

The run's own ``cost_usd`` is reported beside the price but is not the criterion: it is the price
times the run's length, and a slower fleet drains its last requests later, so it ranks mixes by how
long the simulated window's tail lasts, and it is only known after the run, so no mix could be
skipped.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import MmsimError
from sim.fleet.cost import physical_gpus_per_node
from sim.fleet.hardware import pool_layouts
from sim.runner import check_run_size
from sim.scenario import parse_scenario, read_yaml
from sim.sweep.execute import Backend
from sim.sweep.points import make_task, run_points

DEFAULT_MAX_MIXES = 1000


@dataclass(frozen=True)
class PoolRange:
    """What the search needs of a pool."""

    name: str
    min_nodes: int
    max_nodes: int
    gpus_per_node: int  # physical GPUs: what is billed
    price_per_gpu_hour: float


@dataclass(frozen=True)
class Mix:
    """Nodes per pool (in the scenario's order), its GPUs and its price per hour."""

    nodes: tuple[int, ...]
    gpus: int
    hourly_usd: float


@dataclass
class FleetQuery:
    policies: list[str]
    target: float
    seeds: list[int]
    load: float = 1.0
    max_mixes: int = DEFAULT_MAX_MIXES


@dataclass
class FleetAnswer:
    """The cheapest mix for one policy (``nodes`` None when none of the mixes meets the target)."""

    policy: str
    nodes: dict[str, int] | None
    gpus: int | None
    hourly_usd: float | None
    figures: dict | None
    mixes_total: int
    mixes_run: int
    evaluations: list[dict] = field(default_factory=list)


def mixes(pools: list[PoolRange], limit: int) -> list[Mix]:
    """Every mix with at least one GPU, cheapest first; more than ``limit`` is an error, before enumerating."""
    count = math.prod(pool.max_nodes - pool.min_nodes + 1 for pool in pools)
    if count > limit:
        ranges = ", ".join(f"{p.name} {p.min_nodes}..{p.max_nodes}" for p in pools)
        raise MmsimError(f"the pools' node ranges ({ranges}) give {count} mixes, more than --max-mixes {limit}; "
                         "narrow min_nodes..max_nodes or raise --max-mixes", field="cluster.pools")
    found = []
    for nodes in itertools.product(*(range(p.min_nodes, p.max_nodes + 1) for p in pools)):
        gpus = sum(n * p.gpus_per_node for n, p in zip(nodes, pools))
        if gpus:
            hourly = sum(n * p.gpus_per_node * p.price_per_gpu_hour for n, p in zip(nodes, pools))
            found.append(Mix(nodes, gpus, hourly))
    # Rounded so that float noise in equal prices cannot reorder ties.
    return sorted(found, key=lambda m: (round(m.hourly_usd, 9), m.gpus, m.nodes))


def first_meeting(candidates: list, attainments, target: float, batch: int) -> tuple[int | None, int]:
    """(index of the first candidate whose attainment meets ``target``, candidates run), trying ``batch`` at a
    time in order: ``attainments(chunk)`` gives a chunk's attainments. Those run past the answer in its chunk
    change nothing, so the answer does not depend on ``batch``."""
    for start in range(0, len(candidates), batch):
        chunk = candidates[start:start + batch]
        for offset, attained in enumerate(attainments(chunk)):
            if attained >= target:
                return start + offset, start + len(chunk)
    return None, len(candidates)


def pool_ranges(scenario, base_dir: Path) -> list[PoolRange]:
    return [PoolRange(layout.name, layout.config.min_nodes, layout.config.max_nodes, physical_gpus_per_node(layout),
                      layout.price_per_gpu_hour) for layout in pool_layouts(scenario, base_dir)]


def fix_pools(nodes: tuple[int, ...]):
    """An edit of a scenario dict: pool i held at nodes[i], pools at 0 removed."""
    def edit(data: dict) -> None:
        pools = data["cluster"]["pools"]
        data["cluster"]["pools"] = [{**pool, "nodes": n, "min_nodes": n, "max_nodes": n}
                                    for pool, n in zip(pools, nodes) if n]
    return edit


def plan_fleet(scenario_path: Path, query: FleetQuery, *, workers: int | None = None, use_ray: bool = False,
               ray_address: str | None = None) -> list[FleetAnswer]:
    """The cheapest mix meeting the target, for every policy of ``query``."""
    if not query.seeds:
        raise MmsimError("give at least one seed")
    if not 0 < query.target <= 1:
        raise MmsimError(f"--slo-target must be in (0, 1], not {query.target}")
    if not 0 < query.load <= 1e6:
        raise MmsimError(f"--load must be a positive load multiplier, not {query.load}")
    if query.max_mixes < 1:
        raise MmsimError(f"--max-mixes must be at least 1, not {query.max_mixes}")
    scenario_path = Path(scenario_path)
    data = read_yaml(scenario_path, "scenario file")
    scenario = parse_scenario(data, str(scenario_path), scenario_path.parent)
    assert isinstance(data, dict)  # parse_scenario accepts nothing else
    if scenario.cluster.pools is None:
        raise MmsimError("--cheapest-fleet searches the node counts of cluster.pools, and this scenario has none "
                         "(give pools with min_nodes..max_nodes, or use --gpus-for-load)", source=str(scenario_path),
                         field="cluster.pools")
    scenario.check_requested_models(str(scenario_path))
    check_run_size(scenario, scenario_path.parent, str(scenario_path))
    pools = pool_ranges(scenario, scenario_path.parent)
    candidates = mixes(pools, query.max_mixes)
    workers = workers or os.cpu_count() or 1
    batch = max(1, workers // len(query.seeds))
    answers = []
    with Backend(workers, use_ray, ray_address) as backend:
        for policy in query.policies:
            evaluations: list[dict] = []

            def attainments(chunk: list[Mix]) -> list[float]:
                points = {mix: [make_task(data, scenario_path.parent, {"policy.name": policy, "load": query.load,
                                                                        "seed": seed},
                                          fix_pools(mix.nodes), fleet="-".join(map(str, mix.nodes)))
                                for seed in query.seeds]
                          for mix in chunk}
                for mix, figures in run_points(backend, points).items():
                    evaluations.append({"nodes": dict(zip((p.name for p in pools), mix.nodes)), "gpus": mix.gpus,
                                        "hourly_usd": mix.hourly_usd, **figures})
                return [e["slo_attainment"] for e in evaluations[-len(chunk):]]

            index, run = first_meeting(candidates, attainments, query.target, batch)
            answer = FleetAnswer(policy, None, None, None, None, len(candidates), run, evaluations)
            if index is not None:
                best = dict(evaluations[index])
                answer.nodes, answer.gpus, answer.hourly_usd = best.pop("nodes"), best.pop("gpus"), best.pop("hourly_usd")
                answer.figures = best
            answers.append(answer)
    return answers
