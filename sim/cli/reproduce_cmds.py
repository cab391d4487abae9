"""``mmsim reproduce paper``: the paper's experiments run in the simulator, against its published numbers."""

from __future__ import annotations

from pathlib import Path

import typer

import sim.reproduce.policies  # noqa: F401  (registers paper-preemption and paper-offload for `mmsim run`)
from sim.cli import app
from sim.cli.common import console, print_json, table
from sim.errors import MmsimError

reproduce_app = typer.Typer(help="Reproduce published experiments in the simulator.", no_args_is_help=True)
app.add_typer(reproduce_app, name="reproduce")
PLATFORMS = ("rtx5000", "a6000")


def _profile_overrides(values: list[str], platforms: tuple[str, ...]) -> dict[str, str]:
    """Each --profile PLATFORM=PATH: once per platform, and only for a platform that runs (else it was ignored)."""
    overrides = {}
    for value in values:
        platform, sep, path = value.partition("=")
        if not sep or platform not in PLATFORMS or not path:
            raise MmsimError(f"--profile expects PLATFORM=PATH with PLATFORM one of {', '.join(PLATFORMS)}, not {value!r}")
        if platform in overrides:
            raise MmsimError(f"--profile gives platform {platform} twice")
        if platform not in platforms:
            raise MmsimError(f"--profile {value!r} names a platform --platform {platforms[0]} does not run")
        overrides[platform] = path
    return overrides


@reproduce_app.command("paper")
def paper(platform: str = typer.Option("all", "--platform", help="rtx5000, a6000 or all"),
          as_json: bool = typer.Option(False, "--json", help="print comparison rows and targets as JSON"),
          html_path: Path = typer.Option(None, "--html", help="also write a self-contained HTML page here"),
          profile: list[str] = typer.Option([], "--profile", help="run a platform on another profile: PLATFORM=PATH.json")) -> None:
    """Run the paper's preemption (Table II, Figure 5, Table III) and offload (Figure 4) experiments."""
    if platform not in (*PLATFORMS, "all"):
        raise MmsimError(f"--platform must be rtx5000, a6000 or all, not {platform!r}")
    platforms = PLATFORMS if platform == "all" else (platform,)
    overrides = _profile_overrides(profile, platforms)
    if html_path is not None:  # before minutes of experiments, not after
        from sim.outputs import check_page_target

        check_page_target(html_path, inputs=[Path(path) for path in overrides.values()])
    from sim.reproduce import compare, report
    from sim.reproduce.experiments import run_platform

    results = [run_platform(p, overrides.get(p)) for p in platforms]
    ref = compare.reference()
    checks = compare.targets(results, ref)
    if html_path is not None:
        from sim.reproduce.html import write_page

        write_page(html_path, results, ref)
    if as_json:
        print_json({"rows": [row for result in results for row in compare.rows(result, ref)],
                    "targets": [{"name": t.name, "passed": t.passed, "detail": t.detail} for t in checks]})
        return
    for section in report.sections(results, ref):
        console.print(table(section.title, section.columns, section.rows))
        if section.note:
            console.print(f"[dim]{section.note}[/]")
    failed = [t for t in checks if not t.passed]
    if failed:
        console.print(f"[bold red]{len(failed)} of {len(checks)} fidelity targets missed:[/]")
        for target in failed:
            console.print(f"  {target.name}: {target.detail}")
    else:
        console.print(f"[bold green]all {len(checks)} fidelity targets met[/]")
    if html_path is not None:
        console.print(f"page: [bold]{html_path}[/]")
