"""``mmsim run`` and ``mmsim policies list``."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import console, print_json, table
from sim.errors import MmsimError
from sim.policies.registry import policy_descriptions

policies_app = typer.Typer(help="Scheduler policies.", no_args_is_help=True)
app.add_typer(policies_app, name="policies")


def summary_table(summary: dict):
    def fmt(stat):
        return "-" if stat["p50"] is None else f"{stat['p50']:.3f} / {stat['p90']:.3f} / {stat['p99']:.3f}"
    lost = summary["lost_seconds"]
    rows = [
        ["requests (completed / dropped)", f"{summary['requests_completed']} / {summary['requests_dropped']}"],
        ["throughput", f"{summary['throughput_tokens_per_s']:.1f} tok/s, {summary['throughput_requests_per_s']:.3f} req/s"],
        ["goodput", f"{summary['goodput_requests_per_s']:.3f} req/s"],
        ["SLO attainment", f"{summary['slo_attainment']:.1%}"],
        ["TTFT p50/p90/p99 (s)", fmt(summary["ttft_s"])],
        ["TPOT p50/p90/p99 (s)", fmt(summary["tpot_s"])],
        ["E2E p50/p90/p99 (s)", fmt(summary["e2e_s"])],
        ["preemptions", summary["preemptions"]],
        ["lost s (reload/unload/KV/recompute)", f"{lost['reload']:.1f} / {lost['unload']:.1f} / "
                                                 f"{lost['kv_out'] + lost['kv_in']:.2f} / {lost['recompute']:.1f}"],
        ["loads / unloads", f"{summary['loads']} / {summary['unloads']}"],
        ["GPU busy share", f"{summary['gpu_busy_share']:.1%}"],
        ["simulated / wall", f"{summary['simulated_seconds']:.1f} s / {summary['sim_wall_seconds']:.2f} s"],
    ]
    return table(f"{summary['scenario']} — policy {summary['policy']} (seed {summary['seed']})", ["metric", "value"], rows)


@app.command("run")
def run(scenario: Path = typer.Argument(..., help="scenario YAML"),
        policy: str = typer.Option(None, "--policy", "-p", help="policy name or path/to/file.py:Class (default: the scenario's)"),
        out: Path = typer.Option(None, "--out", "-o", help="results folder (default reports/runs/NAME-POLICY-sSEED)"),
        seed: int = typer.Option(None, "--seed", help="override the scenario's seed"),
        mode: str = typer.Option("fast", "--mode", help="fast (fast-forward) or exact (per-iteration reference)"),
        profile: str = typer.Option(None, "--profile", help="override the scenario's profile: a built-in name or a profile JSON "
                                                            "(e.g. one written by mmsim calibrate)"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON")) -> None:
    """Simulate a scenario and write summary.json + requests/events/timeseries Parquet."""
    if mode not in ("fast", "exact"):
        raise MmsimError(f"--mode must be fast or exact, not {mode!r}")
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    loaded = load_scenario(scenario)
    if profile:
        # A path given on the command line is relative to where the command runs, not to the scenario.
        loaded = loaded.model_copy(update={"profile": str(Path(profile).resolve()) if Path(profile).exists() else profile})
    result, out_dir = run_scenario(scenario, policy=policy, seed=seed, mode=mode, out_dir=out, show_progress=not as_json,
                                   scenario=loaded)
    if as_json:
        print_json(result.summary)
        return
    console.print(summary_table(result.summary))
    console.print(f"results: [bold]{out_dir}[/]")


@policies_app.command("list")
def policies_list() -> None:
    """List the built-in policies."""
    rows = [[name, text] for name, text in policy_descriptions().items()]
    console.print(table("Policies", ["name", "description"], rows))
