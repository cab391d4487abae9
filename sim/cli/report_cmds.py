"""``mmsim compare`` (run a scenario under several policies, then report) and ``mmsim report`` (from saved runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import JustifyMethod
from rich.markup import escape
from rich.table import Table

from sim.cli import app
from sim.cli.common import AUTOSCALER_OPTION, FORCE_OPTION, MODE_OPTION, PROFILE_OPTION, comma_list, console
from sim.errors import MmsimError
from sim.files import counted
from sim.scenario import MAX_SEED

SWEEP_INDEXES = ("index.csv", "index.parquet")
THRESHOLD_HELP = ("share of dropped requests above which a policy is never marked best on latency "
                  "(0.01 = 1%, the default)")


def _default_threshold() -> float:
    """sim.reports' default, read when a command needs it: importing the reports (and pandas) at start-up would
    slow every mmsim command down by half a second."""
    from sim.reports.metrics import DROP_THRESHOLD

    return DROP_THRESHOLD


DropThreshold = Annotated[float, typer.Option("--drop-threshold", default_factory=_default_threshold,
                                              show_default=False, help=THRESHOLD_HELP)]
RANKING_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("#", "right"), ("policy", "left"), ("goodput req/s", "right"), ("SLO attain.", "right"),
    ("completed / dropped", "right"), ("TTFT p90 s", "right"), ("TPOT p90 s", "right"))


def _check_threshold(value: float) -> None:
    if not 0 <= value <= 1:
        raise MmsimError(f"--drop-threshold must be a share between 0 and 1 (0.01 is 1%), not {value}")


def print_ranking(groups: dict, threshold: float) -> None:
    """The verdict sentence and a compact ranking table (best first) on the terminal."""
    from sim.reports.verdict import ranking_rows, verdict

    console.print(verdict(groups, threshold, strong=lambda name: f"[bold]{escape(name)}[/]"), highlight=False)
    ranked = Table(title="ranking (goodput, then SLO attainment; drops count as misses)", title_justify="left")
    for name, justify in RANKING_COLUMNS:
        ranked.add_column(name, justify=justify)
    for row in ranking_rows(groups, threshold):
        ranked.add_row(*(escape(cell) for cell in row))
    console.print(ranked)
    if any("†" in row[-1] for row in ranking_rows(groups, threshold)):
        console.print(f"† dropped more than {threshold:.0%} of its requests: latency covers only those it served",
                      highlight=False)


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"


COMPARE_FORCE_OPTION = typer.Option(False, "--force", help=f"{FORCE_OPTION.help}; also replace an --out file that is "
                                    "not an HTML page written by mmsim")


@app.command("compare")
def compare_cmd(scenario: Path = typer.Argument(..., help="scenario YAML"),
                policies: str = typer.Option(..., "--policies", "-p", help="comma-separated policy names (or path.py:Class)"),
                seeds: int = typer.Option(1, "--seeds", "-n", help="run seeds SEED … SEED+N-1 (SEED: --seed, else the "
                                          "scenario's)"),
                seed: int = typer.Option(None, "--seed", min=0, max=MAX_SEED, help="the first seed (default: the scenario's)"),
                out: Path = typer.Option(None, "--out", "-o", help="report file (default reports/NAME.html)"),
                runs_dir: Path = typer.Option(Path("reports/runs"), "--runs-dir", help="where each run's folder is kept"),
                mode: str = MODE_OPTION,
                profile: str = PROFILE_OPTION,
                autoscaler: str = AUTOSCALER_OPTION,
                allow_policy_files: bool = typer.Option(False, "--allow-policy-files", help="let the scenario name an "
                                                        "autoscaler file (path.py:Class): its code is executed"),
                *, drop_threshold: DropThreshold,  # keyword-only: it has a default factory, not a default
                force: bool = COMPARE_FORCE_OPTION) -> None:
    """Simulate a scenario under each policy (and seed), print the verdict and ranking, and write one
    self-contained HTML comparison report."""
    if mode not in ("fast", "exact"):
        raise MmsimError(f"--mode must be fast or exact, not {mode!r}")
    _check_threshold(drop_threshold)
    from sim.cli.run_cmds import load_with_overrides
    from sim.reports.compare import compare
    from sim.reports.data import by_policy

    from sim.outputs import check_output_dir

    # Twice-named policies are left to compare(), which also catches two spellings of one policy sharing a folder.
    names = comma_list(policies, "--policies", str, "policy", "comma-separated policy names or path.py:Class",
                       unique=False)
    check_output_dir(runs_dir)
    loaded = load_with_overrides(scenario, profile, autoscaler, allow_policy_files, scenario_policy=False)
    report, runs = compare(scenario, names, seeds=seeds, out=out, runs_dir=runs_dir, mode=mode,
                           threshold=drop_threshold, force=force, scenario=loaded, first_seed=seed)
    print_ranking(by_policy(runs), drop_threshold)
    console.print(f"{counted(len(runs), 'run')} kept under [bold]{escape(str(runs_dir))}[/]")
    console.print(f"report: [bold]{escape(str(report))}[/] ({_size(report)})")


def _run_folders(paths: list[Path]) -> list[Path]:
    """Run folders named directly, or the run folders inside a folder that holds several."""
    folders = []
    for path in paths:
        if not os.path.isdir(path):
            raise MmsimError(f"{path} is not a folder; expected run folders written by `mmsim run` or `mmsim compare`")
        if os.path.isfile(path / "summary.json"):
            folders.append(path)
            continue
        inner = sorted(p for p in path.iterdir() if os.path.isfile(p / "summary.json"))
        if not inner:
            raise MmsimError(f"{path} holds no run (no summary.json in it or in its subfolders)")
        folders += inner
    return folders


def _sweep_report(sweep_dir: Path, out: Path | None) -> Path:
    try:
        from sim.sweep.report import sweep_report
    except ModuleNotFoundError as error:
        if error.name not in ("sim.sweep", "sim.sweep.report"):
            raise
        raise MmsimError(f"{sweep_dir} is a sweep folder, but sweep reports are not available in this version "
                         "(no sim.sweep.report); pass run folders instead") from None

    from sim.outputs import check_page_target

    target = check_page_target(out or Path("reports") / f"{sweep_dir.name}.html", folders=[sweep_dir])
    return sweep_report(sweep_dir, target)


@app.command("report")
def report_cmd(runs: list[Path] = typer.Argument(..., help="run folders (or one sweep folder)"),
               out: Path = typer.Option(None, "--out", "-o", help="report file (default reports/SCENARIO-report.html; "
                                                                 "for a sweep folder, reports/FOLDER.html)"),
               title: str = typer.Option(None, "--title", help="page title"),
               allow_mixed: bool = typer.Option(False, "--allow-mixed", help="show runs of different scenarios, profiles "
                                                "or engine builds as separate groups instead of refusing"),
               *, drop_threshold: DropThreshold) -> None:
    """Build the HTML comparison report from saved run folders (or a sweep report from a sweep folder).
    Refuses (exit 2) runs that differ in scenario apart from policy and seed, profile or engine build."""
    _check_threshold(drop_threshold)
    sweeps = [p for p in runs if os.path.isdir(p) and any(os.path.isfile(p / name) for name in SWEEP_INDEXES)]
    if sweeps:
        if len(runs) > 1:
            raise MmsimError("give one sweep folder, or run folders, not both")
        report = _sweep_report(sweeps[0], out)
    else:
        from sim.reports import build_report, load_run
        from sim.reports.comparable import comparable_groups
        from sim.reports.data import by_policy

        from sim.files import safe_name
        from sim.outputs import check_page_target

        folders = _run_folders(runs)
        if out is not None:
            check_page_target(out, folders=folders)
        loaded = [load_run(folder) for folder in folders]
        name = safe_name(str(loaded[0].summary.get("scenario", "runs")), "runs")
        out = out or check_page_target(Path("reports") / f"{name}-report.html", folders=folders)
        with console.status(f"rendering {len(loaded)} runs"):
            report = build_report(loaded, out, title, threshold=drop_threshold, allow_mixed=allow_mixed)
        if len(comparable_groups(loaded)) == 1:  # mixed groups are ranked only on the page, each on its own
            print_ranking(by_policy(loaded), drop_threshold)
    console.print(f"report: [bold]{escape(str(report))}[/] ({_size(Path(report))})")
