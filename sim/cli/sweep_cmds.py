"""``mmsim sweep`` and ``mmsim capacity``: many runs of one scenario, locally or on Ray."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import console, print_json, table
from sim.errors import MmsimError
from sim.scenario import MAX_GPUS_PER_NODE, MAX_NODES, MAX_SEED

MAX_WORKERS = 1024
ALLOW_POLICY_FILES = typer.Option(False, "--allow-policy-files", help="let the YAML name policy files (path.py:Class): "
                                  "their code is executed, so only for files you trust")


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None or value != value else format(value, spec)


@app.command("sweep")
def sweep(sweep_file: Path = typer.Argument(..., help="sweep YAML (base scenario + axes)"),
          workers: int = typer.Option(None, "--workers", "-w", min=1, max=MAX_WORKERS,
                                      help="parallel runs (default: CPU count)"),
          use_ray: bool = typer.Option(False, "--ray", help="run on Ray (a local cluster started on demand)"),
          ray_address: str = typer.Option(None, "--ray-address", help="run on an existing Ray cluster"),
          out: Path = typer.Option(None, "--out", "-o", help="sweep folder (default reports/sweeps/NAME)"),
          allow_policy_files: bool = ALLOW_POLICY_FILES,
          quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or table")) -> None:
    """Run every combination of a sweep's axes; resume by skipping finished runs; write OUT/index.csv."""
    from sim.files import check_output_dir, safe_name
    from sim.policies.registry import check_policy_file_allowed
    from sim.sweep.execute import check_ray_address, run_sweep
    from sim.sweep.spec import expand, load_sweep, resolve_base

    spec = load_sweep(sweep_file)
    tasks = expand(spec, sweep_file)
    for task in tasks:
        check_policy_file_allowed(str((task.scenario_data.get("policy") or {}).get("name", "")),
                                  allowed=allow_policy_files, source=str(sweep_file))
    out = check_output_dir(out or Path("reports/sweeps") / safe_name(spec.name, "sweep"))
    if ray_address:
        check_ray_address(ray_address)
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
    """The seeds of every capacity point: --seed-list, else 1..--seeds."""
    if text:
        try:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise MmsimError(f"--seed-list must be comma-separated whole numbers, not {text[:80]!r}") from None
        if not seeds or any(not 0 <= seed <= MAX_SEED for seed in seeds) or len(set(seeds)) != len(seeds):
            raise MmsimError(f"--seed-list must name distinct seeds from 0 to {MAX_SEED}, not {text[:80]!r}")
        return seeds
    if count is None or not 1 <= count <= 1000:
        raise MmsimError(f"--seeds must be from 1 to 1000, not {count}")
    return list(range(1, count + 1))


def _finite(flag: str, value: float | None, low: float, high: float) -> None:
    """A float flag must be a number in [low, high] (click accepts nan and inf)."""
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise MmsimError(f"{flag} must be a number from {low:g} to {high:g}, not {value}")


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
             max_gpus: int = typer.Option(64, "--max-gpus", min=1, max=MAX_NODES * MAX_GPUS_PER_NODE,
                                          help="largest GPU count tried by --gpus-for-load"),
             workers: int = typer.Option(None, "--workers", "-w", min=1, max=MAX_WORKERS,
                                         help="parallel runs (default: min(seeds, CPUs))"),
             use_ray: bool = typer.Option(False, "--ray", help="run on Ray (a local cluster started on demand)"),
             ray_address: str = typer.Option(None, "--ray-address", help="run on an existing Ray cluster"),
             out: Path = typer.Option(None, "--out", "-o", help="also write capacity.json into this (sweep) folder"),
             allow_policy_files: bool = ALLOW_POLICY_FILES,
             as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Per policy: the highest load multiplier meeting the SLO target, and optionally the fewest GPUs for a load."""
    from sim.files import check_output_dir
    from sim.policies.registry import check_policy_file_allowed, get_policy_class
    from sim.results import atomic_write
    from sim.scenario import load_scenario
    from sim.sweep.capacity import CapacityQuery, plan_capacity
    from sim.sweep.execute import check_ray_address

    _finite("--slo-target", slo_target, 1e-9, 1.0)
    _finite("--low", low, 1e-6, 1e6)
    _finite("--high", high, 1e-6, 1e6)
    _finite("--tolerance", tolerance, 1e-9, 1e6)
    _finite("--gpus-for-load", gpus_for_load, 1e-6, 1e6)
    seed_values = _seeds(seed_list, seeds)
    if out is not None:
        check_output_dir(out)
    if ray_address:
        check_ray_address(ray_address)
    loaded = load_scenario(scenario)
    if policies:
        names = [p.strip() for p in policies.split(",") if p.strip()]
        if not names:
            raise MmsimError(f"--policies must name at least one policy, not {policies!r}")
    else:
        names = [loaded.policy.name]
        check_policy_file_allowed(names[0], allowed=allow_policy_files, source=str(scenario))
    for name in names:
        get_policy_class(name)  # a misspelt name is an error now, not a row of failed runs in the answer
    query = CapacityQuery(names, slo_target, seed_values, low, high, tolerance, gpus_for_load, max_gpus)
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
