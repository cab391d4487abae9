"""One simulation run: build the cluster a scenario describes, replay its workload, collect results."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

import numpy as np
import simpy

from sim.catalogue import get_model
from sim.costs import ModelCosts
from sim.engine import arrivals
from sim.engine.engine import Engine, EngineConfig
from sim.engine.routing import Router
from sim.engine.sampler import Sampler
from sim.errors import MmsimError
from sim.fleet.hardware import build_hardware, pool_layouts
from sim.fleet.placement import pool_preference
from sim.policies.contract import check_accounted, user_code_error
from sim.policies.registry import make_policy
from sim.results import ColumnTable, RequestTable, event_table, sample_table
from sim.summary import summarize
from sim.scenario import Scenario
from sim.workload.chunk import RequestChunk
from sim.workload.lengths import mix_weights

if TYPE_CHECKING:
    import pandas as pd

GIB = 2**30


class RunTables(NamedTuple):
    """A run's per-request table, event log and periodic samples, as typed columns (see :mod:`sim.results`)."""

    requests: RequestTable
    events: ColumnTable
    samples: ColumnTable


class RunResult:
    """Everything a run produced, before it is written to disk: the summary, and the tables as typed columns,
    as pandas frames on first use (``mmsim run`` writes its files without building them)."""

    def __init__(self, tables: RunTables, summary: dict):
        self.tables = tables
        self.summary = summary

    @cached_property
    def requests(self) -> pd.DataFrame:
        return self.tables.requests.frame()

    @cached_property
    def events(self) -> pd.DataFrame:
        return self.tables.events.frame()

    @cached_property
    def timeseries(self) -> pd.DataFrame:
        return self.tables.samples.frame()


def _drop_leftovers(engine: Engine) -> None:
    """Drop the requests still held when the run stopped (nothing could serve them), their progress settled:
    ``not_placed`` when the policy never gave their model an instance, ``not_scheduled`` when one held them."""
    for queue in engine.pending:
        for request in list(queue):
            engine.drop(request, "not_placed")
    for inst in engine.instances:
        inst.gpu.sync()
        for request in inst.running:
            request.generated = inst.generated(request)
        for request in [*inst.waiting, *inst.swapped, *inst.prefilling, *inst.running]:
            engine.drop(request, "not_scheduled")


def simulate(scenario: Scenario, *, base_dir: Path = Path("."), policy: str | None = None, params: dict | None = None,
             seed: int | None = None, mode: str = "fast", chunks: Iterable[RequestChunk] | None = None,
             on_progress: Callable[[int], None] | None = None) -> RunResult:
    """Run ``scenario`` (optionally with another policy/seed) and return its results."""
    if mode not in ("fast", "exact"):
        raise MmsimError(f"unknown mode {mode!r}; expected fast or exact")
    seed = scenario.seed if seed is None else seed
    policy_name = policy or scenario.policy.name
    policy_params = scenario.policy.params if params is None and policy is None else (params or {})
    env, engine = build_engine(scenario, base_dir, policy_name, policy_params, mode)
    layouts = engine.pools
    profile = layouts[0].profile
    trace_report = None
    if chunks is None:
        from sim.workload.rows import RowReport
        from sim.workload.stream import iter_requests
        trace_report = RowReport("") if scenario.workload.trace is not None else None
        chunks = iter_requests(scenario.workload, seed=seed, base_dir=base_dir, report=trace_report)
    rng = np.random.default_rng([seed, 1])
    started = time.perf_counter()
    with _user_code_errors(engine):
        engine.policy.setup(engine.view)
        _start_autoscaler(env, engine, scenario, layouts)
        stream = arrivals.ArrivalStream(engine, chunks, scenario.workload.output_length_error, rng, on_progress)
        next_arrival_s = lambda: stream.next_time  # noqa: E731
        if engine.fleet is not None:
            engine.fleet.next_arrival_s = next_arrival_s  # type: ignore[attr-defined]
        Sampler(env, engine, scenario.sample_interval_s or _default_interval(scenario, len(engine.gpus)), next_arrival_s)
        with _few_collections():
            arrivals.run(env, engine, stream)
    _drop_leftovers(engine)
    check_accounted(engine, stream.seen)
    wall_s = time.perf_counter() - started
    tables = RunTables(RequestTable(engine.recorder), event_table(engine.recorder), sample_table(engine.recorder))
    summary = summarize(tables.requests, tables.samples, tables.events, scenario, engine, profile, policy_name, seed,
                        mode, wall_s)
    summary["trace_rows"] = trace_report.counts() if trace_report is not None else None
    return RunResult(tables, summary)


def build_engine(scenario: Scenario, base_dir: Path, policy_name: str, policy_params: dict,
                 mode: str = "fast") -> tuple[simpy.Environment, Engine]:
    """The cluster, its deployments and the policy of ``scenario``, ready to run. Building it checks what only the
    cost model knows (a deployment's ``max_model_len``, the host RAM its offloaded layers need), so a sweep builds
    each of its runs up front."""
    layouts = pool_layouts(scenario, base_dir)
    env = simpy.Environment()
    gpus, nodes = build_hardware(env, scenario, layouts)
    names = [m.deployment for m in scenario.models]
    pool_costs = [[ModelCosts(layout.profile, get_model(m.name), m.dtype, m.kv_dtype, m.tensor_parallel,
                              m.pipeline_parallel, stages_cross_nodes=m.tensor_parallel * m.pipeline_parallel > layout.gpus_per_node,
                              gpu_slowdown=1.0 / layout.compute_share)
                   for m in scenario.models] for layout in layouts]
    config = EngineConfig(**scenario.engine.model_dump(), prefix_block_tokens=scenario.workload.prefix_block_tokens)
    engine = Engine(env, gpus, nodes, names, pool_costs[0], config, make_policy(policy_name, policy_params),
                    fast=(mode == "fast"), max_model_lens=[m.max_model_len for m in scenario.models],
                    gpu_shares=[m.gpu_share for m in scenario.models],
                    router=Router(scenario.routing.rule, scenario.routing.weights.model_dump()),
                    parallel=[(m.tensor_parallel, m.pipeline_parallel) for m in scenario.models],
                    pool_costs=pool_costs, pool_first_gpus=[layout.first_gpu for layout in layouts])
    mix = _mix_shares(scenario)
    engine.slos = [scenario.slo_for(m.deployment) for m in scenario.models]
    engine.pools = layouts
    rule = scenario.cluster.placement
    engine.placement = {i: {"gpus": m.gpus, "replicas": m.replicas, "gpu_share": m.gpu_share, "demand": mix.get(m.deployment, 1.0),
                            "pools": [layout.index for layout in pool_preference(engine, scenario, layouts, i, rule)]}
                        for i, m in enumerate(scenario.models)}
    return env, engine


@contextmanager
def _user_code_errors(engine: Engine) -> Iterator[None]:
    """An exception from a user's policy or autoscaler ends the run as one line naming it (mmsim's own keep
    their traceback)."""
    try:
        yield
    except MmsimError:
        raise
    except (Exception, SystemExit) as error:  # sys.exit() in a hook ended the run silently, with exit 0
        autoscaler = getattr(engine.fleet, "autoscaler", None)
        problem = user_code_error(error, engine, autoscaler)
        if problem is None:
            raise
        raise problem from error


def _start_autoscaler(env: simpy.Environment, engine: Engine, scenario: Scenario, layouts) -> None:
    """Run the scenario's autoscaler, if it has one (see :mod:`sim.fleet.controller`)."""
    config = scenario.autoscaler
    if config.name == "none":
        return
    from sim.fleet.autoscalers import make_autoscaler
    from sim.fleet.controller import FleetController

    controller = FleetController(engine, scenario, layouts, make_autoscaler(config.name, config.params))
    engine.fleet = controller
    env.process(controller.run())


@contextmanager
def _few_collections() -> Iterator[None]:
    """Run with rare cyclic-garbage collections, and none over the objects that exist before the run.

    A run allocates millions of short-lived objects that reference counting frees; at Python's default
    thresholds the cycle collector still walked them (and every long-lived object) often enough to
    take ~8% of a run."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _mix_shares(scenario: Scenario) -> dict[str, float]:
    """Each model's expected share of the requests (explicit or Zipf mix); empty for traces."""
    generator = scenario.workload.generator
    if generator is None:
        return {}
    names, shares = mix_weights(generator.mix)
    return dict(zip(names, shares.tolist()))


SAMPLE_ROWS = 2_000_000
"""Sample rows (one per GPU) a generated workload's default interval allows: a 65,536-GPU cluster sampled 300
times would spend most of its run writing 20 million rows no figure needs."""


def _default_interval(scenario: Scenario, gpus: int) -> float:
    """300 samples over a generated workload's duration (at least 0.5 s apart, at most ``SAMPLE_ROWS`` rows),
    or every 5 s for a trace."""
    generator = getattr(scenario.workload, "generator", None)
    duration = getattr(generator, "duration_s", None)
    return max(0.5, duration / 300, duration * gpus / SAMPLE_ROWS) if duration else 5.0
