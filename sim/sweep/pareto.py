"""Cost against SLO attainment: the scenario under every autoscaler x policy, and the points no other beats.

A point is on the Pareto frontier when no other point costs no more per 1,000 requests and attains no
less, while being better in one of the two. Both figures are means over the seeds (see
:mod:`sim.sweep.points`); a point with no cost (every run failed or served nothing) is never on it.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from sim.errors import MmsimError
from sim.files import counted
from sim.results import atomic_write
from sim.runner import check_run_size
from sim.scenario import parse_scenario, read_yaml
from sim.sweep.execute import Backend
from sim.sweep.page import document, figure_svg, num, pyplot, table
from sim.sweep.points import make_task, run_points

DEFAULT_AUTOSCALERS = ("none", "utilisation", "queue-depth", "kv-utilisation", "predictive")
COST = "cost_per_1k_requests_usd"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def pareto_front(points: list[tuple[float | None, float | None]]) -> list[bool]:
    """For each (cost, attainment) pair, whether it is on the frontier (lower cost, higher attainment win)."""
    known = [(i, c, a) for i, (c, a) in enumerate(points) if c is not None and a is not None]
    front = [False] * len(points)
    for i, cost, attained in known:
        front[i] = not any(c <= cost and a >= attained and (c < cost or a > attained) for _, c, a in known)
    return front


def plan_pareto(scenario_path: Path, autoscalers: list[str], policies: list[str], seeds: list[int], load: float = 1.0,
                *, workers: int | None = None, use_ray: bool = False, ray_address: str | None = None) -> list[dict]:
    """Mean figures of every policy x autoscaler over ``seeds`` at ``load`` times the traffic, frontier marked."""
    for flag, names in (("--autoscalers", autoscalers), ("--policies", policies)):
        twice = sorted({n for n in names if names.count(n) > 1})
        if not names or twice:
            raise MmsimError(f"{flag} must name at least one, each once" + (f" ({twice[0]!r} is there twice)" if twice else ""))
    if not seeds:
        raise MmsimError("give at least one seed")
    scenario_path = Path(scenario_path)
    data = read_yaml(scenario_path, "scenario file")
    scenario = parse_scenario(data, str(scenario_path), scenario_path.parent)
    assert isinstance(data, dict)  # parse_scenario accepts nothing else
    scenario.check_requested_models(str(scenario_path))
    check_run_size(scenario, scenario_path.parent, str(scenario_path))
    combos = [(policy, autoscaler) for policy in policies for autoscaler in autoscalers]
    points = {combo: [make_task(data, scenario_path.parent, {"policy.name": combo[0], "autoscaler.name": combo[1],
                                                             "load": load, "seed": seed}) for seed in seeds]
              for combo in combos}
    with Backend(workers or os.cpu_count() or 1, use_ray, ray_address) as backend:
        figures = run_points(backend, points)
    rows = [{"policy": policy, "autoscaler": autoscaler, **figures[(policy, autoscaler)]} for policy, autoscaler in combos]
    for row, on_front in zip(rows, pareto_front([(r[COST], r["slo_attainment"]) for r in rows])):
        row["pareto"] = on_front
    return rows


def pareto_svg(rows: list[dict], colour_key: str, marker_key: str) -> str:
    """Cost per 1,000 requests (x) against SLO attainment (y); the frontier joined and ringed."""
    from sim.reports.colours import policy_colours

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8.0, 4.0))
    # A sweep's series label already names its policy ("static, load=0.5"): "static / static, load=0.5" says it twice.
    labels = [str(r[marker_key]) if str(r[colour_key]) in str(r[marker_key]).split(", ")
              else f"{r[colour_key]} / {r[marker_key]}" for r in rows]
    if len({r[colour_key] for r in rows}) == 1:
        colour_key = marker_key  # one policy: let the colours tell the autoscalers apart too
    colours = policy_colours(list(dict.fromkeys(r[colour_key] for r in rows)))
    markers = {name: MARKERS[i % len(MARKERS)] for i, name in enumerate(dict.fromkeys(r[marker_key] for r in rows))}
    plotted = [(r, label) for r, label in zip(rows, labels) if r[COST] is not None]
    for r, label in plotted:
        axis.scatter(r[COST], r["slo_attainment"], color=colours[r[colour_key]], marker=markers[r[marker_key]],
                     s=50, label=label, zorder=3)
    front = sorted((r[COST], r["slo_attainment"]) for r, _ in plotted if r["pareto"])
    if front:
        axis.plot(*zip(*front), color="black", linewidth=1, linestyle="--", zorder=2, label="Pareto frontier")
        axis.scatter(*zip(*front), s=180, facecolors="none", edgecolors="black", linewidths=1.2, zorder=4)
    axis.set_xlabel("cost per 1,000 requests (US$)")
    axis.set_ylabel("SLO attainment")
    axis.grid(alpha=0.3)
    if plotted:
        axis.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: points stay visible
    figure.tight_layout()
    return figure_svg(figure)


def figures_row(row: dict) -> list[str]:
    """The cells every cost table shares: attainment, goodput, the four cost figures."""
    return [num(row["slo_attainment"]), num(row["goodput_requests_per_s"]), num(row["cost_per_1k_requests_usd"], ".4f"),
            num(row["cost_per_million_output_tokens_usd"], ".3f"), num(row["cost_usd"], ".3f"), num(row["gpu_hours"], ".3f")]


FIGURE_COLUMNS = ["SLO attainment", "goodput req/s", "$ / 1k req", "$ / M output tok", "cost $", "GPU-hours"]


def pareto_page(rows: list[dict], scenario: str, seeds: list[int], load: float) -> str:
    """The whole page: what was run, the plot, and the table (frontier points first, cheapest first)."""
    order = sorted(rows, key=lambda r: (not r["pareto"], r[COST] is None, r[COST] or 0.0, -r["slo_attainment"]))
    cells = [[html.escape(r["policy"]), html.escape(r["autoscaler"]), *figures_row(r), "✓" if r["pareto"] else "",
              f"{r['failed']} of {r['runs']}" + (f": {html.escape(r['errors'][0][:200])}" if r["errors"] else "")]
             for r in order]
    body = (f"<p>Scenario {html.escape(scenario)} at {load:g}× its traffic, {counted(len(seeds), 'seed')} per point "
            f"({html.escape(', '.join(map(str, seeds)))}); every figure is a mean over the seeds (a failed run attains 0). "
            "A point is Pareto-optimal (ringed, joined) when no other costs no more per 1,000 requests and attains "
            "no less.</p>" + pareto_svg(rows, "policy", "autoscaler")
            + table(["policy", "autoscaler", *FIGURE_COLUMNS, "Pareto", "failed runs"], cells))
    return document(f"Cost vs SLO attainment: {Path(scenario).name}", body)


def write_pareto(out: Path, rows: list[dict], scenario: str, seeds: list[int], load: float) -> Path:
    """OUT/pareto.json and OUT/pareto.html, each written whole; returns the page's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"scenario": scenario, "seeds": seeds, "load": load, "points": rows}
    atomic_write(out / "pareto.json", lambda p: Path(p).write_text(json.dumps(data, indent=1)))
    atomic_write(out / "pareto.html", lambda p: Path(p).write_text(pareto_page(rows, scenario, seeds, load)))
    return out / "pareto.html"
