"""``compare``: run one scenario under several policies and seeds, keep every run folder, write the report."""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sim.errors import MmsimError
from sim.reports.data import RunData
from sim.reports.html import build_report
from sim.results import write_run
from sim.scenario import load_scenario


def run_folder(runs_dir: Path, scenario: str, policy: str, seed: int) -> Path:
    """Where one run of the comparison is kept (the same naming as ``mmsim run``)."""
    safe = policy.replace("/", "_").replace(":", "_")
    return Path(runs_dir) / f"{scenario}-{safe}-s{seed}"


def compare(scenario_path: Path, policies: list[str], *, seeds: int = 1, out: Path | None = None,
            runs_dir: Path = Path("reports/runs"), mode: str = "fast", show_progress: bool = True) -> tuple[Path, list[RunData]]:
    """Simulate ``scenario_path`` under each policy for seeds scenario.seed … +seeds-1, write each run folder
    and the HTML report; returns the report path and the runs."""
    from sim.policies.registry import get_policy_class
    from sim.simulation import simulate

    if not policies:
        raise MmsimError("--policies needs at least one policy name")
    if seeds < 1:
        raise MmsimError(f"--seeds must be at least 1, not {seeds}")
    for policy in policies:
        get_policy_class(policy)  # fail on a misspelt name before spending minutes on the others
    scenario_path = Path(scenario_path)
    scenario = load_scenario(scenario_path)
    out = Path(out) if out else Path("reports") / f"{scenario.name}.html"
    scenario_data = scenario.model_dump(mode="json")
    plan = [(policy, scenario.seed + offset) for policy in policies for offset in range(seeds)]
    runs: list[RunData] = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not show_progress) as progress:
        task = progress.add_task("runs", total=len(plan))
        for policy, seed in plan:
            progress.update(task, description=f"{scenario.name} · {policy} · seed {seed}")
            result = simulate(scenario, base_dir=scenario_path.parent, policy=policy, seed=seed, mode=mode)
            folder = write_run(result, run_folder(runs_dir, scenario.name, policy, seed), scenario_data)
            runs.append(RunData(result.summary, result.requests, result.events, result.timeseries, scenario_data, folder))
            progress.advance(task)
        progress.update(task, description="writing report")
        build_report(runs, out)
    return out, runs
