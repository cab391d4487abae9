"""``compare``: run one scenario under several policies and seeds, keep every run folder, write the report."""

from __future__ import annotations

import os
from pathlib import Path

from sim.errors import MmsimError
from sim.outputs import check_page_target
from sim.progress_bar import progress_bar
from sim.reports.data import RunData
from sim.reports.html import build_report
from sim.reports.metrics import DROP_THRESHOLD
from sim.scenario import MAX_SEED, Scenario, load_scenario

MAX_SEEDS = 1000
"""Most seeds one comparison runs per policy (as ``mmsim capacity --seeds``): a typo of many digits ran for ever."""


def run_folder(runs_dir: Path, scenario, policy: str, seed: int) -> Path:
    """Where one run of the comparison is kept: ``mmsim run``'s default name (NAME-POLICY-PROFILE-sSEED) under
    ``runs_dir``."""
    from sim.runner import default_run_dir

    return Path(runs_dir) / default_run_dir(scenario, policy, seed).name


def files_named(data: object, base_dir: Path = Path(".")) -> list[Path]:
    """The existing files that a scenario's values (or a list of policy names) name: a profile, a trace, a length
    file, a model's config, a ``path.py:Class`` policy or autoscaler, found from ``base_dir`` or the current folder."""
    found: list[Path] = []
    if isinstance(data, dict):
        for value in data.values():
            found += files_named(value, base_dir)
    elif isinstance(data, (list, tuple)):
        for value in data:
            found += files_named(value, base_dir)
    elif isinstance(data, str) and data and "\n" not in data and len(data) < 4096:
        for text in {data, data.rsplit(":", 1)[0]}:  # path.py:Class names the file before the colon
            for where in (base_dir / text, Path(text)):
                if os.path.isfile(where):
                    found.append(where)
    return found


def compare(scenario_path: Path, policies: list[str], *, seeds: int = 1, out: Path | None = None,
            runs_dir: Path = Path("reports/runs"), mode: str = "fast", show_progress: bool = True,
            threshold: float = DROP_THRESHOLD, force: bool = False, scenario: Scenario | None = None,
            first_seed: int | None = None) -> tuple[Path, list[RunData]]:
    """Simulate ``scenario_path`` (or ``scenario``, read from there with overrides) under each policy for seeds
    ``first_seed`` (default: the scenario's) … +seeds-1, write each run folder and the HTML report; returns the
    report path and the runs. A folder holding a finished run of another scenario, policy or seed is replaced only
    with ``force`` (one of the same run is run again), and every folder is checked before the first run starts."""
    from sim.policies.registry import get_policy_class
    from sim.runner import check_run_dir, effective_scenario, simulate_file, write_run_folder

    if not policies:
        raise MmsimError("--policies needs at least one policy name")
    if not 1 <= seeds <= MAX_SEEDS:
        raise MmsimError(f"--seeds must be from 1 to {MAX_SEEDS}, not {seeds}")
    for policy in policies:
        get_policy_class(policy)  # fail on a misspelt name before spending minutes on the others
    scenario_path = Path(scenario_path)
    scenario = scenario or load_scenario(scenario_path)
    first = scenario.seed if first_seed is None else first_seed
    if first + seeds - 1 > MAX_SEED:
        raise MmsimError(f"--seeds {seeds} from seed {first} passes the largest seed, {MAX_SEED}")
    out = Path(out) if out else Path("reports") / f"{scenario.name}.html"
    # Each run with its folder and its scenario as `mmsim run` records it, both checked before the first run starts.
    plan = [(policy, seed, run_folder(runs_dir, scenario, policy, seed), effective_scenario(scenario, policy, seed))
            for policy in policies for seed in range(first, first + seeds)]
    folders: dict[Path, str] = {}
    for policy, _, folder, scenario_data in plan:  # a policy given twice would run twice into one folder
        if folder in folders:
            raise MmsimError(f"--policies names {policy!r} and {folders[folder]!r}, whose runs share the folder "
                             f"{folder}; give each policy once")
        folders[folder] = policy
        check_run_dir(folder, force, scenario_data)
    # The page reads every run folder; the runs read the scenario and the files it names (--force must not let the
    # page replace a profile, a trace or a policy file).
    inputs = [scenario_path, *files_named(scenario.model_dump(), scenario_path.parent), *files_named(policies)]
    check_page_target(out, inputs=inputs, folders=list(folders), force=force)
    runs: list[RunData] = []
    with progress_bar(show_progress, transient=True) as progress:  # gone once done, or when a run stops in error
        task = progress.add_task("runs", total=len(plan))
        for policy, seed, folder, scenario_data in plan:
            progress.update(task, description=f"{scenario.name} · {policy} · seed {seed}")
            result = simulate_file(scenario, scenario_path, policy=policy, seed=seed, mode=mode)
            write_run_folder(result, folder, scenario_data)
            runs.append(RunData(result.summary, result.requests, result.events, result.timeseries, scenario_data, folder))
            progress.advance(task)
        progress.update(task, description="writing report")
        build_report(runs, out, threshold=threshold)
    return out, runs
