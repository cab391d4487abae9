"""``mmsim run``, ``mmsim policies list`` and ``mmsim autoscalers list``."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import (AUTOSCALER_OPTION, FORCE_OPTION, MODE_OPTION, PROFILE_OPTION, console, named, print_json,
                            table)
from sim.cli.run_summary import next_command, print_run_summary
from sim.errors import MmsimError
from sim.scenario import MAX_SEED, Scenario
from sim.policies.registry import policy_descriptions

POLICY_EXPECTED = "a policy name or path/to/file.py:Class (see mmsim policies list)"
PROFILE_EXPECTED = "a built-in profile name or a profile JSON file"
AUTOSCALER_EXPECTED = "an autoscaler name or path/to/file.py:Class (see mmsim autoscalers list)"

policies_app = typer.Typer(help="Scheduler policies.", no_args_is_help=True)
app.add_typer(policies_app, name="policies")


@app.command("run")
def run(scenario: Path = typer.Argument(..., help="scenario YAML"),
        policy: str = typer.Option(None, "--policy", "-p", help="policy name or path/to/file.py:Class (default: the "
                                   "scenario's); a .py file is imported, i.e. its code is executed"),
        out: Path = typer.Option(None, "--out", "-o", help="results folder (default reports/runs/NAME-POLICY-PROFILE-sSEED); "
                                 "checked before the run starts"),
        seed: int = typer.Option(None, "--seed", min=0, max=MAX_SEED, help="override the scenario's seed"),
        mode: str = MODE_OPTION,
        profile: str = PROFILE_OPTION,
        force: bool = FORCE_OPTION,
        autoscaler: str = AUTOSCALER_OPTION,
        allow_policy_files: bool = typer.Option(False, "--allow-policy-files", help="let the scenario name a policy "
                                                "or autoscaler file (path.py:Class): its code is executed, so only for "
                                                "files you trust"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON")) -> None:
    """Simulate a scenario and write summary.json + requests/events/timeseries Parquet."""
    if mode not in ("fast", "exact"):
        raise MmsimError(f"--mode must be fast or exact, not {mode!r}")
    checked_policy(policy)
    # A run does no linear algebra: OpenBLAS's thread pool, started when numpy is first imported (below), would
    # only add start-up time and threads competing with the one-core event loop.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from sim.runner import run_scenario

    loaded = load_with_overrides(scenario, profile, autoscaler, allow_policy_files, scenario_policy=policy is None)
    result, out_dir = run_scenario(scenario, policy=policy, seed=seed, mode=mode, out_dir=out, show_progress=not as_json,
                                   scenario=loaded, replace=force)
    if as_json:
        print_json(result.summary)
        return
    # A new run's summary has every drop count; the next command keeps this run's overrides.
    print_run_summary(console, result.summary, None, scenario, out_dir,
                      next_command(result.summary, scenario, profile, autoscaler, seed))


def load_with_overrides(path: Path, profile: str | None, autoscaler: str | None, allow_policy_files: bool,
                        scenario_policy: bool) -> Scenario:
    """The scenario at ``path`` with the command line's ``--profile`` and ``--autoscaler``, refusing a policy or
    autoscaler file it names itself unless allowed (``scenario_policy``: the scenario's own policy will run)."""
    from sim.policies.registry import check_policy_file_allowed
    from sim.scenario import load_scenario

    named(autoscaler, "--autoscaler", AUTOSCALER_EXPECTED)  # an empty one was blamed on the scenario's field
    loaded = load_scenario(path)
    if scenario_policy:
        check_policy_file_allowed(loaded.policy.name, allowed=allow_policy_files, source=str(path))
    if autoscaler is None:
        check_policy_file_allowed(loaded.autoscaler.name, allowed=allow_policy_files, source=str(path),
                                  field="autoscaler.name")
    else:
        loaded = _with_autoscaler_flag(loaded, autoscaler)
    if profile is not None:
        loaded = _with_profile_flag(loaded, checked_profile(profile))
    return loaded


def _with_profile_flag(loaded: Scenario, profile: str) -> Scenario:
    """``loaded`` on ``--profile``: the scenario's profile, and a lone pool's own one too (the cluster is then that
    one machine type, which the flag replaces). Pools of several machine types keep theirs, so the flag would be
    ignored for them: refused, naming them, rather than run on profiles the user meant to replace."""
    pools = loaded.cluster.pools
    own = [pool for pool in pools or [] if pool.profile]
    if pools is not None and len(pools) == 1 and own:
        cluster = loaded.cluster.model_copy(update={"pools": [pools[0].model_copy(update={"profile": profile})]})
        return loaded.model_copy(update={"profile": profile, "cluster": cluster})
    if own:
        named_pools = "; ".join(f"{pool.name}: {pool.profile}" for pool in own)
        raise MmsimError(f"the scenario's cluster has pools with profiles of their own ({named_pools}), which "
                         f"--profile does not replace; set each pool's profile in the scenario "
                         f"(cluster.pools[].profile) instead", field="--profile")
    return loaded.model_copy(update={"profile": profile})


def _with_autoscaler_flag(loaded: Scenario, autoscaler: str) -> Scenario:
    """``loaded`` under ``--autoscaler``; a name that is no autoscaler is blamed on the flag, not on the scenario's
    ``autoscaler.name`` that the flag replaces."""
    from sim.scenario import with_autoscaler

    try:
        return with_autoscaler(loaded, autoscaler)
    except MmsimError as error:
        if error.source is None and error.field == "autoscaler.name":
            error.field = "--autoscaler"
        raise


def checked_policy(policy: str | None) -> None:
    """``--policy`` checked before the run's progress bar starts, blamed on the flag: an empty one ran the
    scenario's policy instead. A policy file is left to the run, which executes it once."""
    from sim.policies.registry import get_policy_class, is_policy_file

    named(policy, "--policy", POLICY_EXPECTED)
    if policy is None or is_policy_file(policy):
        return
    try:
        get_policy_class(policy)
    except MmsimError as error:
        error.field = error.field or "--policy"
        raise


def checked_profile(profile: str) -> str:
    """``--profile`` as the scenario will name it, read once so that a bad one is blamed on the flag (not on the
    scenario file) before anything runs: a path is relative to where the command runs, not to the scenario."""
    from sim.profile import load_profile

    named(profile, "--profile", PROFILE_EXPECTED)
    resolved = str(Path(profile).resolve()) if os.path.exists(profile) else profile
    try:
        load_profile(resolved)
    except MmsimError as error:
        if error.source is None:  # an unknown name; a file's problems name the file
            error.field = "--profile"
        raise
    return resolved


@policies_app.command("list")
def policies_list() -> None:
    """List the built-in policies."""
    rows = [[name, text] for name, text in policy_descriptions().items()]
    console.print(table("Policies", ["name", "description"], rows))


autoscalers_app = typer.Typer(help="Fleet autoscalers.", no_args_is_help=True)
app.add_typer(autoscalers_app, name="autoscalers")


@autoscalers_app.command("list")
def autoscalers_list() -> None:
    """List the built-in autoscalers (scenario `autoscaler.name`, or `mmsim run --autoscaler`)."""
    from sim.fleet.autoscalers import autoscaler_descriptions

    rows = [[name, text] for name, text in autoscaler_descriptions().items()]
    console.print(table("Autoscalers", ["name", "description"], rows))
