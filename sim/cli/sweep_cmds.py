"""``mmsim sweep`` and ``mmsim capacity``: many runs of one scenario, locally or on Ray."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import comma_list, console, print_json, table
from sim.errors import MmsimError
from sim.files import counted
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
    from sim.files import safe_name
    from sim.outputs import check_output_dir
    from sim.policies.registry import check_policy_file_allowed
    from sim.sweep.execute import check_ray_address, check_sweep_folder, run_sweep
    from sim.sweep.spec import expand, load_sweep, resolve_base

    spec = load_sweep(sweep_file)
    tasks = expand(spec, sweep_file)
    for task in tasks:
        for section in ("policy", "autoscaler"):
            check_policy_file_allowed(str((task.scenario_data.get(section) or {}).get("name", "")),
                                      allowed=allow_policy_files, source=str(sweep_file), field=f"{section}.name")
    out = check_output_dir(out or Path("reports/sweeps") / safe_name(spec.name, "sweep"))
    check_sweep_folder(out, spec.name, list(spec.axes))
    if ray_address:
        check_ray_address(ray_address)
    meta = {"name": spec.name, "sweep_file": str(sweep_file), "base": str(resolve_base(spec, sweep_file))}
    outcome = run_sweep(tasks, out, axes=list(spec.axes), workers=workers, use_ray=use_ray, ray_address=ray_address,
                        show_progress=not quiet, meta=meta)
    if not quiet:
        index = outcome["index"]
        figures = {"slo_attainment": ("SLO att.", ".3f"), "goodput_requests_per_s": ("goodput req/s", ".3f"),
                   "throughput_tokens_per_s": ("tok/s", ".1f"), "cost_usd": ("cost $", ".4f"),
                   "cost_per_1k_requests_usd": ("$ / 1k req", ".4f"), "gpu_hours": ("GPU-h", ".3f")}
        # The run ids (the axes' values and a hash) are in the index; here the axes stand for them, and the status
        # column only when a run failed (the line below counts them).
        records = index.to_dict("records")
        status = ["status"] if any(row["status"] != "ok" for row in records) else []
        rows = [[*(row[a] for a in spec.axes), *(row[s] for s in status), *(_fmt(row[f], form) for f, (_, form) in figures.items())]
                for row in records]
        console.print(table(f"Sweep {spec.name}", [*axis_labels(list(spec.axes)), *status,
                                                   *(label for label, _ in figures.values())], rows))
    console.print(f"{counted(outcome['ran'], 'run')}, {outcome['skipped']} already done, {outcome['failed']} failed; "
                  f"wall {outcome['wall_s']:.1f} s for {outcome['run_seconds']:.1f} s of runs; index: [bold]{out / 'index.csv'}[/]")
    if outcome["failed"]:
        raise typer.Exit(1)


def _seeds(text: str | None, count: int | None) -> list[int]:
    """The seeds of every capacity point: --seed-list, else 1..--seeds (default 3)."""
    if text is not None and count is not None:
        raise MmsimError("give --seeds or --seed-list, not both")
    if text is not None:  # given empty, it is refused (it ran seeds 1..3 instead)
        return comma_list(text, "--seed-list", _seed, "seed", f"comma-separated whole numbers from 0 to {MAX_SEED}")
    count = 3 if count is None else count
    if not 1 <= count <= 1000:
        raise MmsimError(f"--seeds must be from 1 to 1000, not {count}")
    return list(range(1, count + 1))


def _seed(text: str) -> int:
    seed = int(text)
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed {seed} is out of range")
    return seed


def _finite(flag: str, value: float | None, low: float, high: float) -> None:
    """A float flag must be a number in [low, high] (click accepts nan and inf)."""
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise MmsimError(f"{flag} must be a number from {low:g} to {high:g}, not {value}")


FLEET_HELP = ("per policy, the cheapest fixed fleet (nodes of each pool, from its min_nodes to its max_nodes) whose "
              "mean SLO attainment meets --slo-target. Cheapest by hourly price, nodes x GPUs x price per GPU-hour, "
              "not by the run's cost_usd: the price is known before running, so mixes are tried cheapest first and "
              "the first to meet the target is the answer (every cheaper mix was run and missed it), while the "
              "run's cost also counts how long its last requests take to drain, known only after each run")


@app.command("capacity")
def capacity(scenario: Path = typer.Argument(..., help="scenario YAML"),
             policies: str = typer.Option(None, "--policies", "-p", help="comma-separated policies (default: the scenario's)"),
             slo_target: float = typer.Option(None, "--slo-target", help="required mean SLO attainment (default 0.99)"),
             seeds: int = typer.Option(None, "--seeds", help="seeds per point (1..N; default 3)"),
             seed_list: str = typer.Option(None, "--seed-list", help="explicit comma-separated seeds instead of 1..N"),
             low: float = typer.Option(None, "--low", help="lowest load multiplier searched (default 0.25)"),
             high: float = typer.Option(None, "--high", help="highest load multiplier searched (default 4)"),
             tolerance: float = typer.Option(None, "--tolerance", help="stop bisecting when the bracket is this "
                                             "narrow (default 0.05)"),
             gpus_for_load: float = typer.Option(None, "--gpus-for-load", help="also find the fewest GPUs for this load"),
             max_gpus: int = typer.Option(None, "--max-gpus", min=1, max=MAX_NODES * MAX_GPUS_PER_NODE,
                                          help="largest GPU count tried by --gpus-for-load (default 64)"),
             cheapest_fleet: bool = typer.Option(False, "--cheapest-fleet", help=FLEET_HELP),
             max_mixes: int = typer.Option(None, "--max-mixes", min=1, max=1_000_000,
                                           help="refuse a --cheapest-fleet search over more pool mixes than this "
                                           "(default 1000)"),
             pareto: bool = typer.Option(False, "--pareto", help="run every autoscaler x policy and write OUT/pareto.html "
                                         "(cost per 1k requests vs SLO attainment, Pareto frontier marked) and pareto.json"),
             autoscalers: str = typer.Option(None, "--autoscalers", help="comma-separated autoscalers for --pareto "
                                             "(default: none,utilisation,queue-depth,kv-utilisation,predictive)"),
             load: float = typer.Option(None, "--load", help="load multiplier for --cheapest-fleet and --pareto (default 1)"),
             workers: int = typer.Option(None, "--workers", "-w", min=1, max=MAX_WORKERS,
                                         help="parallel runs (default: min(seeds, CPUs); CPUs for --cheapest-fleet, --pareto)"),
             use_ray: bool = typer.Option(False, "--ray", help="run on Ray (a local cluster started on demand)"),
             ray_address: str = typer.Option(None, "--ray-address", help="run on an existing Ray cluster"),
             out: Path = typer.Option(None, "--out", "-o", help="also write capacity.json into this (sweep) folder; for "
                                      "--pareto the folder of pareto.html (default reports/pareto/NAME)"),
             allow_policy_files: bool = ALLOW_POLICY_FILES,
             as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Per policy: the highest load multiplier meeting the SLO target, and optionally the fewest GPUs for a load;
    or (--cheapest-fleet) the cheapest pool mix meeting it; or (--pareto) cost vs SLO attainment per autoscaler."""
    from sim.files import safe_name
    from sim.outputs import check_output_dir
    from sim.policies.registry import check_policy_file_allowed, get_policy_class
    from sim.scenario import load_scenario
    from sim.sweep.execute import check_ray_address

    _check_modes(cheapest_fleet, pareto, {"--slo-target": slo_target, "--low": low, "--high": high,
                                          "--tolerance": tolerance, "--gpus-for-load": gpus_for_load,
                                          "--max-gpus": max_gpus, "--autoscalers": autoscalers,
                                          "--max-mixes": max_mixes, "--load": load})
    slo_target = 0.99 if slo_target is None else slo_target
    low, high = 0.25 if low is None else low, 4.0 if high is None else high
    tolerance, max_gpus = 0.05 if tolerance is None else tolerance, 64 if max_gpus is None else max_gpus
    _finite("--slo-target", slo_target, 1e-9, 1.0)
    _finite("--low", low, 1e-6, 1e6)
    _finite("--high", high, 1e-6, 1e6)
    _finite("--tolerance", tolerance, 1e-9, 1e6)
    _finite("--gpus-for-load", gpus_for_load, 1e-6, 1e6)
    _finite("--load", load, 1e-6, 1e6)
    seed_values = _seeds(seed_list, seeds)
    scalers = _autoscaler_names(autoscalers) if pareto else []
    loaded = load_scenario(scenario)
    if pareto and out is None:
        out = Path("reports/pareto") / safe_name(loaded.name, "scenario")
    if out is not None:
        check_output_dir(out)
        if not pareto:
            _check_sweep_of(out, scenario)
    if ray_address:
        check_ray_address(ray_address)
    if policies is not None:  # an empty --policies is a mistake, not a request for the scenario's policy
        names = comma_list(policies, "--policies", str, "policy", "comma-separated policy names or path.py:Class")
    else:
        names = [loaded.policy.name]
        check_policy_file_allowed(names[0], allowed=allow_policy_files, source=str(scenario))
    if not pareto:  # --pareto runs the autoscalers named on the command line instead of the scenario's
        check_policy_file_allowed(loaded.autoscaler.name, allowed=allow_policy_files, source=str(scenario),
                                  field="autoscaler.name")
    for name in names:
        get_policy_class(name)  # a misspelt name is an error now, not a row of failed runs in the answer
    backend = {"workers": workers, "use_ray": use_ray, "ray_address": ray_address}
    if pareto:
        _pareto(scenario, scalers, names, seed_values, 1.0 if load is None else load, out, as_json, backend)
    elif cheapest_fleet:
        _cheapest_fleet(scenario, names, slo_target, seed_values, load, max_mixes, out, as_json, backend)
    else:
        _load_search(scenario, names, slo_target, seed_values, (low, high, tolerance), gpus_for_load, max_gpus,
                     out, as_json, backend)


SEARCH_FLAGS = {"the load search": ("--slo-target", "--low", "--high", "--tolerance", "--gpus-for-load", "--max-gpus"),
                "--cheapest-fleet": ("--slo-target", "--max-mixes", "--load"),
                "--pareto": ("--autoscalers", "--load")}


def _check_modes(cheapest_fleet: bool, pareto: bool, given: dict) -> None:
    """A flag of another search than the one asked for is an error, not silently ignored."""
    if cheapest_fleet and pareto:
        raise MmsimError("--cheapest-fleet and --pareto are separate searches; give one of them")
    mode = "--pareto" if pareto else "--cheapest-fleet" if cheapest_fleet else "the load search"
    for flag, value in given.items():
        if value is not None and flag not in SEARCH_FLAGS[mode]:
            owners = " and ".join(m for m, flags in SEARCH_FLAGS.items() if flag in flags)
            raise MmsimError(f"{flag} is for {owners}, not for {mode}")


def _check_sweep_of(out: Path, scenario: Path) -> None:
    """A folder holding a sweep takes the capacity.json of that sweep's scenario only: its report shows the answers
    as the sweep's own."""
    try:
        meta = json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError):
        return  # no sweep there (a damaged one is the report's to name)
    base = meta.get("base") if isinstance(meta, dict) else None
    if isinstance(base, str) and Path(base).resolve() != scenario.resolve():
        raise MmsimError(f"holds sweep {meta.get('name')!r} of {base}, not of {scenario}: its report would show this "
                         "search's answers as its own; give another --out", source=str(out))


def _autoscaler_names(text: str | None) -> list[str]:
    from sim.fleet.autoscalers import get_autoscaler_class
    from sim.sweep.pareto import DEFAULT_AUTOSCALERS

    names = list(DEFAULT_AUTOSCALERS) if text is None else comma_list(
        text, "--autoscalers", str, "autoscaler", "comma-separated autoscaler names or path.py:Class")
    for name in names:
        try:
            get_autoscaler_class(name)
        except MmsimError as error:
            raise MmsimError(f"--autoscalers: {error.args[0]}") from None
    return names


def _save_answers(out: Path | None, data: dict, as_json: bool) -> bool:
    """Write the search's answers as ``capacity.json`` into ``out`` (if given) and print them as JSON if asked;
    True when printed (nothing else is to be shown)."""
    from sim.results import atomic_write

    if out is not None:
        atomic_write(Path(out) / "capacity.json", lambda p: Path(p).write_text(json.dumps(data, indent=1)))
    if as_json:
        print_json(data)
    return as_json


def _load_search(scenario: Path, names: list[str], slo_target: float, seed_values: list[int], bracket: tuple,
                 gpus_for_load, max_gpus: int, out: Path | None, as_json: bool, backend: dict) -> None:
    from sim.sweep.capacity import CapacityQuery, plan_capacity

    low, high, tolerance = bracket
    query = CapacityQuery(names, slo_target, seed_values, low, high, tolerance, gpus_for_load, max_gpus)
    answers = plan_capacity(scenario, query, **backend)
    data = {"scenario": str(scenario), "query": asdict(query), "policies": [asdict(a) for a in answers]}
    if _save_answers(out, data, as_json):
        return
    rows = []
    for a in answers:
        load = {"below-low": f"< {low:g}", "at-least": f">= {high:g}"}.get(a.max_load_bound, _fmt(a.max_load))
        attainment = _fmt(a.attainment_at_max)
        if a.max_load_bound == "below-low":  # what the lowest load searched gave
            at_low = [e["slo_attainment"] for e in a.evaluations if e["gpus"] is None and e["load"] == low]
            attainment = f"{_fmt(at_low[0])} at {low:g}" if at_low else attainment
        row = [a.policy, load, attainment]
        if gpus_for_load is not None:
            gpus = "-" if a.gpu_layout is None else f"{a.min_gpus} ({a.gpu_layout[0]}×{a.gpu_layout[1]})"
            row += [gpus if a.min_gpus is not None else f"> {max_gpus}", _fmt(a.attainment_at_min_gpus)]
        rows.append(row)
    columns = ["policy", "max load ×", "attainment there"]
    if gpus_for_load is not None:
        columns += [f"min GPUs @ load {gpus_for_load:g}", "attainment there"]
    console.print(table(f"Capacity at SLO attainment >= {slo_target:g} ({counted(len(query.seeds), 'seed')})", columns, rows))
    bounds = {a.max_load_bound for a in answers}
    if "below-low" in bounds:
        console.print(f"< {low:g}: even the lowest load searched misses the target (--low searches lower)")
    if "at-least" in bounds:
        console.print(f">= {high:g}: even the highest load searched meets the target (--high searches higher)")


def _cheapest_fleet(scenario: Path, names: list[str], slo_target: float, seed_values: list[int], load, max_mixes,
                    out: Path | None, as_json: bool, backend: dict) -> None:
    from sim.sweep.fleet import DEFAULT_MAX_MIXES, FleetQuery, plan_fleet

    query = FleetQuery(names, slo_target, seed_values, 1.0 if load is None else load, max_mixes or DEFAULT_MAX_MIXES)
    answers = plan_fleet(scenario, query, **backend)
    data = {"scenario": str(scenario), "query": asdict(query), "fleet": [asdict(a) for a in answers]}
    if _save_answers(out, data, as_json):
        return
    rows = []
    for a in answers:
        tried = f"{a.mixes_run} of {a.mixes_total}"
        if a.nodes is None or a.figures is None:  # set together, when a mix meets the target
            best = max(e["slo_attainment"] for e in a.evaluations)
            rows.append([a.policy, "none meets the target", "-", "-", "-", "-", f"best {_fmt(best)}", tried])
            continue
        f = a.figures
        rows.append([a.policy, ", ".join(f"{pool}={n}" for pool, n in a.nodes.items()), str(a.gpus),
                     _fmt(a.hourly_usd, ".2f"), _fmt(f["cost_usd"], ".4f"), _fmt(f["cost_per_1k_requests_usd"], ".4f"),
                     _fmt(f["slo_attainment"]), tried])
    console.print(table(f"Cheapest fleet at SLO attainment >= {slo_target:g} ({counted(len(seed_values), 'seed')}, "
                        f"load {query.load:g}×)", ["policy", "nodes per pool", "GPUs", "$ / hour", "run cost $",
                                                   "$ / 1k req", "attainment", "mixes run"], rows))


def _pareto(scenario: Path, scalers: list[str], names: list[str], seed_values: list[int], load: float, out: Path,
            as_json: bool, backend: dict) -> None:
    from sim.sweep.pareto import plan_pareto, write_pareto

    rows = plan_pareto(scenario, scalers, names, seed_values, load, **backend)
    page = write_pareto(out, rows, str(scenario), seed_values, load)
    if as_json:
        print_json({"scenario": str(scenario), "seeds": seed_values, "load": load, "points": rows, "page": str(page)})
        return
    cells = [[r["policy"], r["autoscaler"], _fmt(r["slo_attainment"]), _fmt(r["cost_per_1k_requests_usd"], ".4f"),
              _fmt(r["cost_usd"], ".3f"), _fmt(r["gpu_hours"], ".3f"), "✓" if r["pareto"] else "", str(r["failed"])]
             for r in rows]
    console.print(table(f"Cost vs SLO attainment ({counted(len(seed_values), 'seed')}, load {load:g}×)",
                        ["policy", "autoscaler", "attainment", "$ / 1k req", "cost $", "GPU-hours", "Pareto", "failed"], cells))
    console.print(f"page: [bold]{page}[/]")


def axis_labels(axes: list[str]) -> list[str]:
    """Column labels of the sweep's axes: each dotted path's last part (``workload.generator.duration_s`` reads as
    ``duration_s``; ``policy.name`` as ``policy``), the whole path where two axes would share one."""
    last = [axis.rsplit(".", 2)[-2] if axis.endswith(".name") else axis.rsplit(".", 1)[-1] for axis in axes]
    return [short if last.count(short) == 1 else axis for axis, short in zip(axes, last)]
