"""Capacity planning: per policy, the highest load that still meets an SLO-attainment target, and the
fewest GPUs that meet it at a given load.

A point "meets the target" when the mean SLO attainment over the seeds is at
least the target; a run that fails (e.g. the models do not fit) counts as 0.
The load search is a bisection with fixed midpoints, so for any attainment
curve a higher target never yields a higher capacity.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import MmsimError
from sim.runner import check_run_size
from sim.scenario import parse_scenario, read_yaml
from sim.sweep.execute import Backend
from sim.sweep.points import make_task, run_points
from sim.sweep.spec import gpu_layout, gpus_per_node_of


@dataclass
class CapacityQuery:
    """What to search for."""

    policies: list[str]
    target: float
    seeds: list[int]
    low: float = 0.25
    high: float = 4.0
    tolerance: float = 0.05
    gpus_for_load: float | None = None
    max_gpus: int = 64


@dataclass
class PolicyCapacity:
    """The answer for one policy."""

    policy: str
    max_load: float | None
    max_load_bound: str
    attainment_at_max: float | None
    min_gpus: int | None = None
    gpu_layout: list[int] | None = None
    attainment_at_min_gpus: float | None = None
    evaluations: list[dict] = field(default_factory=list)


class Evaluator:
    """Mean SLO attainment of the base scenario under a policy, load and GPU count; every point is computed once."""

    def __init__(self, base_data: dict, base_dir: Path, seeds: list[int], backend: Backend):
        self.base_data, self.base_dir, self.seeds, self.backend = base_data, Path(base_dir), seeds, backend
        self.cache: dict[tuple, dict] = {}

    def point(self, policy: str, load: float, gpus: int | None = None) -> dict:
        key = (policy, round(load, 12), gpus)
        if key not in self.cache:
            axes = {"policy.name": policy, "load": load, **({} if gpus is None else {"gpus": gpus})}
            tasks = [make_task(self.base_data, self.base_dir, {**axes, "seed": seed}) for seed in self.seeds]
            figures = run_points(self.backend, {key: tasks})[key]
            self.cache[key] = {"policy": policy, "load": load, "gpus": gpus, "slo_attainment": figures["slo_attainment"],
                               "cost_usd": figures["cost_usd"], "errors": figures["errors"]}
        return self.cache[key]


def max_load(evaluate, target: float, low: float, high: float, tolerance: float) -> tuple[float | None, str]:
    """Highest load in [low, high] (to ``tolerance``) whose attainment meets ``target``.

    Returns (load, bound): bound is ``exact`` (bisection converged), ``at-least``
    (even ``high`` meets it) or ``below-low`` (load None: even ``low`` fails).
    """
    if evaluate(low) < target:
        return None, "below-low"
    if evaluate(high) >= target:
        return high, "at-least"
    while high - low > tolerance:
        middle = (low + high) / 2
        if evaluate(middle) >= target:
            low = middle
        else:
            high = middle
    return low, "exact"


def gpu_counts(per_node: int, most: int) -> list[int]:
    """Total GPU counts that lay out evenly on nodes of at most ``per_node`` GPUs."""
    return [n for n in range(1, most + 1) if gpu_layout(n, per_node) is not None]


def min_gpus(evaluate, counts: list[int], target: float) -> int | None:
    """Fewest GPUs among ``counts`` that meet ``target``: doubling to bracket it, then bisection."""
    if not counts:
        return None
    lo, hi = -1, 0
    while evaluate(counts[hi]) < target:
        if hi == len(counts) - 1:
            return None
        lo, hi = hi, min(2 * hi + 1, len(counts) - 1)
    # counts[lo] fails (or lo is -1) and counts[hi] meets the target
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if evaluate(counts[middle]) >= target:
            hi = middle
        else:
            lo = middle
    return counts[hi]


def plan_capacity(scenario_path: Path, query: CapacityQuery, *, workers: int | None = None, use_ray: bool = False,
                  ray_address: str | None = None) -> list[PolicyCapacity]:
    """Run the capacity search for every policy of ``query``."""
    if not query.seeds:
        raise MmsimError("give at least one seed")
    if query.gpus_for_load is not None and not 0 < query.gpus_for_load <= 1e6:
        raise MmsimError(f"--gpus-for-load must be a positive load multiplier, not {query.gpus_for_load}")
    if query.max_gpus < 1:
        raise MmsimError(f"--max-gpus must be at least 1, not {query.max_gpus}")
    if not all(math.isfinite(x) for x in (query.target, query.low, query.high, query.tolerance)):
        raise MmsimError("--slo-target, --low, --high and --tolerance must be finite numbers")
    if not 0 < query.target <= 1:
        raise MmsimError(f"--slo-target must be in (0, 1], not {query.target}")
    if not 0 < query.low < query.high:
        raise MmsimError(f"need 0 < --low < --high (got {query.low}, {query.high})")
    if query.tolerance <= 0:
        raise MmsimError(f"--tolerance must be positive, not {query.tolerance}")
    scenario_path = Path(scenario_path)
    data = read_yaml(scenario_path, "scenario file")
    scenario = parse_scenario(data, str(scenario_path), scenario_path.parent)
    assert isinstance(data, dict)  # parse_scenario accepts nothing else
    if query.gpus_for_load is not None and scenario.cluster.pools is not None:
        raise MmsimError("--gpus-for-load lays out GPUs on nodes of one kind, and this scenario has cluster.pools: "
                         "use --cheapest-fleet", source=str(scenario_path), field="cluster.pools")
    scenario.check_requested_models(str(scenario_path))
    check_run_size(scenario, scenario_path.parent, str(scenario_path))
    per_node = gpus_per_node_of(data, scenario_path.parent)
    answers = []
    with Backend(workers or min(len(query.seeds), os.cpu_count() or 1), use_ray, ray_address) as backend:
        evaluator = Evaluator(data, scenario_path.parent, query.seeds, backend)
        for policy in query.policies:
            load, bound = max_load(lambda x: evaluator.point(policy, x)["slo_attainment"],
                                   query.target, query.low, query.high, query.tolerance)
            answer = PolicyCapacity(policy, load, bound,
                                    None if load is None else evaluator.point(policy, load)["slo_attainment"])
            if query.gpus_for_load is not None:
                at = query.gpus_for_load
                count = min_gpus(lambda n: evaluator.point(policy, at, n)["slo_attainment"],
                                 gpu_counts(per_node, query.max_gpus), query.target)
                answer.min_gpus = count
                if count is not None:
                    layout = gpu_layout(count, per_node)
                    assert layout is not None  # gpu_counts offers only counts that split evenly
                    answer.gpu_layout = list(layout)
                    answer.attainment_at_min_gpus = evaluator.point(policy, at, count)["slo_attainment"]
            answer.evaluations = [p for p in evaluator.cache.values() if p["policy"] == policy]
            answers.append(answer)
    return answers
