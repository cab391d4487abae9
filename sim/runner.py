"""Run a scenario file end to end: load, simulate with a progress bar, write the results."""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sim.results import write_run
from sim.scenario import Scenario, load_scenario
from sim.simulation import RunResult, simulate


def expected_requests(scenario: Scenario) -> int | None:
    """A rough request count for the progress bar (generators only)."""
    generator = getattr(scenario.workload, "generator", None)
    if generator is None:
        return None
    rate = getattr(getattr(generator, "arrivals", None), "rate_per_s", None)
    duration = getattr(generator, "duration_s", None)
    limit = getattr(generator, "max_requests", None)
    if limit:
        return int(limit)
    return int(rate * duration) if rate and duration else None


def run_scenario(path: Path, *, policy: str | None = None, seed: int | None = None, mode: str = "fast",
                 out_dir: Path | None = None, show_progress: bool = True, scenario: Scenario | None = None) -> tuple[RunResult, Path]:
    """Simulate the scenario at ``path`` and write its results to ``out_dir``."""
    path = Path(path)
    scenario = scenario or load_scenario(path)
    policy_name = policy or scenario.policy.name
    seed = scenario.seed if seed is None else seed
    out_dir = Path(out_dir) if out_dir else Path("reports/runs") / f"{scenario.name}-{policy_name.replace('/', '_').replace(':', '_')}-s{seed}"
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True, disable=not show_progress) as progress:
        task = progress.add_task(f"{scenario.name} / {policy_name}", total=expected_requests(scenario))
        result = simulate(scenario, base_dir=path.parent, policy=policy, seed=seed, mode=mode,
                          on_progress=lambda n: progress.update(task, completed=n))
    write_run(result, out_dir, scenario.model_dump(mode="json"))
    return result, out_dir
