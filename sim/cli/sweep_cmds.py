"""``mmsim sweep`` and ``mmsim capacity``: many runs of one scenario, locally or on Ray."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import console, print_json, table
from sim.errors import MmsimError


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None or value != value else format(value, spec)


@app.command("sweep")
def sweep(sweep_file: Path = typer.Argument(..., help="sweep YAML (base scenario + axes)"),
          workers: int = typer.Option(None, "--workers", "-w", help="parallel runs (default: CPU count)"),
          use_ray: bool = typer.Option(False, "--ray", help="run on Ray (a local cluster started on demand)"),
          ray_address: str = typer.Option(None, "--ray-address", help="run on an existing Ray cluster"),
          out: Path = typer.Option(None, "--out", "-o", help="sweep folder (default reports/sweeps/NAME)"),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or table")) -> None:
    """Run every combination of a sweep's axes; resume by skipping finished runs; write OUT/index.csv."""
    from sim.sweep.execute import run_sweep
    from sim.sweep.spec import expand, load_sweep, resolve_base

    if workers is not None and workers < 1:
        raise MmsimError(f"--workers must be at least 1, not {workers}")
    spec = load_sweep(sweep_file)
    tasks = expand(spec, sweep_file)
    out = out or Path("reports/sweeps") / spec.name
    meta = {"name": spec.name, "sweep_file": str(sweep_file), "base": str(resolve_base(spec, sweep_file))}
    outcome = run_sweep(tasks, out, axes=list(spec.axes), workers=workers, use_ray=use_ray, ray_address=ray_address,
                        show_progress=not quiet, meta=meta)
    if not quiet:
        index = outcome["index"]
        figures = {"slo_attainment": "SLO att.", "goodput_requests_per_s": "goodput req/s", "throughput_tokens_per_s": "tok/s"}
        rows = [[row["run_id"], *(row[a] for a in spec.axes), row["status"], *(_fmt(row[f]) for f in figures)]
                for row in index.to_dict("records")]
        console.print(table(f"Sweep {spec.name}", ["run", *spec.axes, "status", *figures.values()], rows))
    console.print(f"{outcome['ran']} run(s), {outcome['skipped']} already done, {outcome['failed']} failed; "
                  f"wall {outcome['wall_s']:.1f} s for {outcome['run_seconds']:.1f} s of runs; index: [bold]{out / 'index.csv'}[/]")
    if outcome["failed"]:
        raise typer.Exit(1)


def _seeds(text: str, count: int | None) -> list[int]:
    if text:
        try:
            return [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise MmsimError(f"--seed-list must be comma-separated integers, not {text!r}") from None
    if count is None or count < 1:
        raise MmsimError("--seeds must be at least 1")
    return list(range(1, count + 1))


@app.command("capacity")
def capacity(scenario: Path = typer.Argument(..., help="scenario YAML"),
             policies: str = typer.Option(None, "--policies", "-p", help="comma-separated policies (default: the scenario's)"),
             slo_target: float = typer.Option(0.99, "--slo-target", help="required mean SLO attainment, e.g. 0.99"),
             seeds: int = typer.Option(3, "--seeds", help="seeds per point (1..N)"),
             seed_list: str = typer.Option("", "--seed-list", help="explicit comma-separated seeds instead of 1..N"),
             low: float = typer.Option(0.25, "--low", help="lowest load multiplier searched"),
             high: float = typer.Option(4.0, "--high", help="highest load multiplier searched"),
             tolerance: float = typer.Option(0.05, "--tolerance", help="stop bisecting when the bracket is this narrow"),
             gpus_for_load: float = typer.Option(None, "--gpus-for-load", help="also find the fewest GPUs for this load"),
             max_gpus: int = typer.Option(64, "--max-gpus", help="largest GPU count tried by --gpus-for-load"),
             workers: int = typer.Option(None, "--workers", "-w", help="parallel runs (default: min(seeds, CPUs))"),
             use_ray: bool = typer.Option(False, "--ray", help="run on Ray (a local cluster started on demand)"),
             ray_address: str = typer.Option(None, "--ray-address", help="run on an existing Ray cluster"),
             out: Path = typer.Option(None, "--out", "-o", help="also write capacity.json into this (sweep) folder"),
             as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Per policy: the highest load multiplier meeting the SLO target, and optionally the fewest GPUs for a load."""
    from sim.results import atomic_write
    from sim.scenario import load_scenario
    from sim.sweep.capacity import CapacityQuery, plan_capacity

    names = [p.strip() for p in policies.split(",") if p.strip()] if policies else [load_scenario(scenario).policy.name]
    query = CapacityQuery(names, slo_target, _seeds(seed_list, seeds), low, high, tolerance, gpus_for_load, max_gpus)
    answers = plan_capacity(scenario, query, workers=workers, use_ray=use_ray, ray_address=ray_address)
    data = {"scenario": str(scenario), "query": asdict(query), "policies": [asdict(a) for a in answers]}
    if out is not None:
        atomic_write(Path(out) / "capacity.json", lambda p: Path(p).write_text(json.dumps(data, indent=1)))
    if as_json:
        print_json(data)
        return
    rows = []
    for a in answers:
        load = {"below-low": f"< {low:g}", "at-least": f">= {high:g}"}.get(a.max_load_bound, _fmt(a.max_load))
        row = [a.policy, load, _fmt(a.attainment_at_max)]
        if gpus_for_load is not None:
            gpus = "-" if a.min_gpus is None else f"{a.min_gpus} ({a.gpu_layout[0]}×{a.gpu_layout[1]})"
            row += [gpus if a.min_gpus is not None else f"> {max_gpus}", _fmt(a.attainment_at_min_gpus)]
        rows.append(row)
    columns = ["policy", "max load ×", "attainment there"]
    if gpus_for_load is not None:
        columns += [f"min GPUs @ load {gpus_for_load:g}", "attainment there"]
    console.print(table(f"Capacity at SLO attainment >= {slo_target:g} ({len(query.seeds)} seed(s))", columns, rows))
