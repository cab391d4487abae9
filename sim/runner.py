"""Run a scenario file end to end: check the run up front, simulate with a progress bar, write the results.

A run folder is written into a fresh temporary folder beside its target and
renamed into place at the end, so a killed run never leaves a folder mixing new
and old files. A folder holding a finished run (``summary.json``) of another
scenario, policy or seed is only replaced when asked (``replace=True``, the
CLI's ``--force``); one holding the same run is run again (the same command
twice, or ``compare`` after ``run``); a folder that holds anything other than
run files is never replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from sim.errors import MmsimError
from sim.files import safe_name
from sim.outputs import check_output_dir, disk_error, written_through
from sim.progress_bar import progress_bar
from sim.results import write_run
from sim.scenario import Scenario, load_scenario
from sim.schema import with_defaults
from sim.simulation import RunResult, simulate

RUN_FILES = {"summary.json", "requests.parquet", "events.parquet", "timeseries.parquet", "scenario.json", "error.txt"}
MAX_RUN_REQUESTS = 10**8
"""Most requests one run may hold: each costs about 150 bytes of result columns."""
MAX_RUN_SIZE = 10**10
"""Most (expected requests x GPUs) one run may take on: beyond this a run would take days."""


def default_run_dir(scenario: Scenario, policy: str, seed: int) -> Path:
    """``reports/runs/NAME-POLICY-PROFILE-sSEED`` with each part made safe for a path."""
    profile = Path(scenario.profile).stem if scenario.profile.endswith(".json") else scenario.profile
    parts: tuple[str, ...] = (safe_name(scenario.name, "scenario"), safe_name(policy, "policy"),
                              safe_name(profile, "profile"))
    if scenario.autoscaler.name != "none":
        parts += (safe_name(scenario.autoscaler.name, "autoscaler"),)
    return Path("reports/runs") / f"{'-'.join(parts)}-s{seed}"


def gpu_count(scenario: Scenario, base_dir: Path) -> int:
    """GPUs (or MIG slices) the scenario's cluster may have: every pool at its ``max_nodes``."""
    from sim.profile import load_profile

    total = 0
    for pool in scenario.pools:  # a profile is read only where a pool does not say its GPUs per node
        assert pool.profile is not None  # Scenario.pools fills in the scenario's
        per_node = pool.gpus_per_node or load_profile(pool.profile, base_dir).hardware.gpu.gpus_per_node
        total += pool.max_nodes * per_node * (pool.mig.slices_per_gpu if pool.mig else 1)
    return total


def check_run_size(scenario: Scenario, base_dir: Path, source: str | None = None) -> None:
    """Refuse up front a run whose expected size is absurd, naming the figure (generators; traces are bounded
    by their files)."""
    generator = scenario.workload.generator
    if generator is None:
        return
    expected = generator.expected_requests()
    if expected is None and generator.duration_s is not None:  # a ServeGen file says the rate
        from sim.workload.arrivals import mean_rate, windows_for

        expected = mean_rate(windows_for(generator.arrivals, base_dir, generator.duration_s),
                             generator.duration_s) * generator.duration_s
    if expected is None:
        return
    gpus = gpu_count(scenario, base_dir)
    if expected > MAX_RUN_REQUESTS or expected * gpus > MAX_RUN_SIZE:
        raise MmsimError(f"the run expects about {expected:.3g} requests on {gpus} GPUs ({expected * gpus:.3g} "
                         f"request-GPUs); at most {MAX_RUN_REQUESTS:.0e} requests and {MAX_RUN_SIZE:.0e} "
                         "request-GPUs: shorten duration_s, lower the rate or set max_requests",
                         source=source, field="workload.generator")


def check_run_dir(out_dir: Path, replace: bool, scenario_data: dict | None = None) -> None:
    """Before any work: ``out_dir`` must be creatable, and a finished run in it replaced only if asked or if it is
    this same run (its scenario.json is ``scenario_data``: rerunning it makes the same run, from inputs as they are
    now)."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    if not out_dir.is_dir():
        return
    entries = {entry.name for entry in out_dir.iterdir()}
    if entries - RUN_FILES:
        raise MmsimError(f"holds files that are not a run's (e.g. {sorted(entries - RUN_FILES)[0]}); "
                         "give an empty or new folder", source=str(out_dir))
    if "summary.json" in entries and not replace and not holds_same_run(out_dir, scenario_data):
        raise MmsimError("already holds a finished run of another scenario, policy or seed; use --force to replace "
                         "it, or another --out", source=str(out_dir))


def holds_same_run(out_dir: Path, scenario_data: dict | None) -> bool:
    """Whether the run in ``out_dir`` was made from ``scenario_data`` (as its scenario.json records it)."""
    if scenario_data is None:
        return False
    try:
        recorded = json.loads((out_dir / "scenario.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return False
    # An older mmsim recorded no field it did not have yet: those ran as their defaults, as this one records them.
    return bool(with_defaults(recorded) == with_defaults(json.loads(json.dumps(scenario_data, default=str))))


def write_run_folder(result: RunResult, out_dir: Path, scenario_data: dict | None = None) -> Path:
    """Write the run into a temporary folder beside ``out_dir``, then swap it into place.

    An existing ``out_dir`` is moved aside first and removed after the swap, so
    at every instant ``out_dir`` is either the old run or the new one, whole.
    """
    given, out_dir = Path(out_dir), written_through(Path(out_dir))  # through a link: the run lands there, the link stays
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    old = None
    try:
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes a private folder; a run folder is an ordinary one
        write_run(result, staging, scenario_data)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".old"))
            os.replace(out_dir, old / "run")
        os.replace(staging, out_dir)
    except OSError as error:
        if old is not None and not out_dir.exists():
            os.replace(old / "run", out_dir)
        problem = disk_error(error, out_dir)
        if problem is None:
            raise
        raise problem from None
    finally:
        for leftover in (staging, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return given


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def effective_scenario(scenario: Scenario, policy: str | None, seed: int | None) -> dict:
    """The scenario as run (command-line overrides applied), for the run folder's scenario.json."""
    data = scenario.model_dump(mode="json")
    if seed is not None:
        data["seed"] = seed
    if policy is not None and policy != scenario.policy.name:
        data["policy"] = {"name": policy, "params": {}}
    return data


def run_scenario(path: Path, *, policy: str | None = None, seed: int | None = None, mode: str = "fast",
                 out_dir: Path | None = None, show_progress: bool = True, scenario: Scenario | None = None,
                 replace: bool = False) -> tuple[RunResult, Path]:
    """Simulate the scenario at ``path`` and write its results to ``out_dir`` (checked before the run starts)."""
    path = Path(path)
    scenario = scenario or load_scenario(path)
    policy_name = policy or scenario.policy.name
    seed = scenario.seed if seed is None else seed
    out_dir = Path(out_dir) if out_dir else default_run_dir(scenario, policy_name, seed)
    scenario_data = effective_scenario(scenario, policy, seed)
    check_run_dir(out_dir, replace, scenario_data)
    check_run_size(scenario, path.parent, str(path))
    with progress_bar(show_progress, transient=True) as progress:
        task = progress.add_task(f"{scenario.name} / {policy_name}", total=expected_requests(scenario))
        result = simulate_file(scenario, path, policy=policy, seed=seed, mode=mode,
                               on_progress=lambda n: progress.update(task, completed=n))
    write_run_folder(result, out_dir, scenario_data)
    return result, out_dir


def simulate_file(scenario: Scenario, path: Path, **options) -> RunResult:
    """:func:`simulate` the scenario read from ``path``; a field found wrong as the run builds the cluster (e.g. a
    gpu_share whose CPU layers fit no node's RAM) is an error located in that file."""
    try:
        return simulate(scenario, base_dir=path.parent, **options)
    except MmsimError as error:
        if error.field is not None and error.source is None:
            error.source = str(path)
        raise


def expected_requests(scenario: Scenario) -> int | None:
    """A rough request count for the progress bar (generators only)."""
    generator = scenario.workload.generator
    expected = generator.expected_requests() if generator is not None else None
    return None if expected is None else int(expected)
