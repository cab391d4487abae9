"""``mmsim compare`` (run a scenario under several policies, then report) and ``mmsim report`` (from saved runs)."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import console
from sim.errors import MmsimError

SWEEP_INDEXES = ("index.csv", "index.parquet")


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"


@app.command("compare")
def compare_cmd(scenario: Path = typer.Argument(..., help="scenario YAML"),
                policies: str = typer.Option(..., "--policies", "-p", help="comma-separated policy names (or path.py:Class)"),
                seeds: int = typer.Option(1, "--seeds", "-n", help="run seeds scenario.seed … scenario.seed+N-1"),
                out: Path = typer.Option(None, "--out", "-o", help="report file (default reports/NAME.html)"),
                runs_dir: Path = typer.Option(Path("reports/runs"), "--runs-dir", help="where each run's folder is kept"),
                mode: str = typer.Option("fast", "--mode", help="fast (fast-forward) or exact (per-iteration reference)")) -> None:
    """Simulate a scenario under each policy (and seed) and write one self-contained HTML comparison report."""
    if mode not in ("fast", "exact"):
        raise MmsimError(f"--mode must be fast or exact, not {mode!r}")
    from sim.reports.compare import compare

    names = [name.strip() for name in policies.split(",") if name.strip()]
    report, runs = compare(scenario, names, seeds=seeds, out=out, runs_dir=runs_dir, mode=mode)
    console.print(f"{len(runs)} runs kept under [bold]{runs_dir}[/]")
    console.print(f"report: [bold]{report}[/] ({_size(report)})")


def _run_folders(paths: list[Path]) -> list[Path]:
    """Run folders named directly, or the run folders inside a folder that holds several."""
    folders = []
    for path in paths:
        if not path.is_dir():
            raise MmsimError(f"{path} is not a folder; expected run folders written by `mmsim run` or `mmsim compare`")
        if (path / "summary.json").is_file():
            folders.append(path)
            continue
        inner = sorted(p for p in path.iterdir() if (p / "summary.json").is_file())
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

    return sweep_report(sweep_dir, out or Path("reports") / f"{sweep_dir.name}.html")


@app.command("report")
def report_cmd(runs: list[Path] = typer.Argument(..., help="run folders (or one sweep folder)"),
               out: Path = typer.Option(None, "--out", "-o", help="report file (default reports/SCENARIO-report.html)"),
               title: str = typer.Option(None, "--title", help="page title")) -> None:
    """Build the HTML comparison report from saved run folders (or a sweep report from a sweep folder)."""
    sweeps = [p for p in runs if p.is_dir() and any((p / name).is_file() for name in SWEEP_INDEXES)]
    if sweeps:
        if len(runs) > 1:
            raise MmsimError("give one sweep folder, or run folders, not both")
        report = _sweep_report(sweeps[0], out)
    else:
        from sim.reports import build_report, load_run

        loaded = [load_run(folder) for folder in _run_folders(runs)]
        out = out or Path("reports") / f"{loaded[0].summary.get('scenario', 'runs')}-report.html"
        with console.status(f"rendering {len(loaded)} runs"):
            report = build_report(loaded, out, title)
    console.print(f"report: [bold]{report}[/] ({_size(Path(report))})")
