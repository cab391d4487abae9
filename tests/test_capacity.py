"""Capacity planning: bisection over load and search over GPU counts, on synthetic curves and a tiny scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli import app
from sim.errors import MmsimError
from sim.scenario import parse_scenario, read_yaml
from sim.simulation import simulate
from sim.sweep.capacity import CapacityQuery, Evaluator, gpu_counts, max_load, min_gpus, plan_capacity
from sim.sweep.execute import Backend

from test_sweep import SCENARIO


@pytest.fixture
def scenario_path(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def test_bisection_finds_the_edge_and_reports_bounds():
    curve = lambda load: 1.0 if load <= 1.3 else 0.5  # noqa: E731
    load, bound = max_load(curve, 0.9, 0.25, 4.0, 0.01)
    assert bound == "exact" and 1.29 <= load <= 1.3
    assert max_load(curve, 0.4, 0.25, 4.0, 0.01) == (4.0, "at-least")
    assert max_load(curve, 1.1, 0.25, 4.0, 0.01) == (None, "below-low")


def test_higher_target_never_gives_more_capacity_even_on_a_bumpy_curve():
    bumpy = lambda load: 1.0 - 0.2 * load + 0.15 * ((load * 7) % 1)  # noqa: E731 - not monotone in load
    loads = [max_load(bumpy, t, 0.1, 5.0, 0.02)[0] or 0.0 for t in (0.3, 0.5, 0.7, 0.9, 0.95)]
    assert loads == sorted(loads, reverse=True)


def test_min_gpus_brackets_then_bisects():
    counts = gpu_counts(2, 10)
    assert counts == [1, 2, 4, 6, 8, 10]
    for need in range(0, 12):
        expected = next((c for c in counts if c >= need), None)
        assert min_gpus(lambda n: 1.0 if n >= need else 0.0, counts, 0.9) == expected


def test_capacity_on_a_tiny_scenario_is_monotone_in_the_target(scenario_path):
    data = read_yaml(scenario_path)
    with Backend(2) as backend:
        evaluator = Evaluator(data, scenario_path.parent, [1, 2], backend)
        curve = lambda load: evaluator.point("static", load)["slo_attainment"]  # noqa: E731
        results = [max_load(curve, target, 0.5, 4.0, 0.25) for target in (0.7, 0.8, 0.85, 0.9)]
    loads = [load or 0.0 for load, _ in results]
    assert loads == sorted(loads, reverse=True)
    assert loads[0] > loads[-1], "the tiny scenario should saturate between load 0.5 and 4"
    assert all(not p["errors"] for p in evaluator.cache.values())


def attainment(scenario_path: Path, load: float, seeds: list[int], layout: list[int] | None = None) -> float:
    """Mean SLO attainment at ``load`` times the base arrival rate (on ``layout`` = [nodes, GPUs per node]),
    simulated directly, not through capacity's code."""
    data = read_yaml(scenario_path)
    data["workload"]["time_scale"] = 1.0 / load
    if layout is not None:
        data["cluster"]["nodes"], data["cluster"]["gpus_per_node"] = layout
    scenario = parse_scenario(data, "test")
    return sum(simulate(scenario, seed=seed, base_dir=scenario_path.parent).summary["slo_attainment"] for seed in seeds) / len(seeds)


def test_capacity_cli_answers_are_the_edge_of_the_target_when_simulated_directly(scenario_path, tmp_path):
    target, tolerance, seeds = 0.85, 0.5, [1, 2]
    result = CliRunner().invoke(app, ["capacity", str(scenario_path), "--policies", "static", "--slo-target", str(target),
                                      "--seeds", "2", "--low", "0.5", "--high", "4", "--tolerance", str(tolerance),
                                      "--gpus-for-load", "2", "--max-gpus", "4", "--workers", "2",
                                      "--out", str(tmp_path / "sweep"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    answer = data["policies"][0]
    assert json.loads((tmp_path / "sweep" / "capacity.json").read_text()) == data
    # The tiny scenario (static, 2 GPUs) saturates inside [0.5, 4]: the answer is an exact edge.
    assert answer["max_load_bound"] == "exact"
    load = answer["max_load"]
    assert attainment(scenario_path, load, seeds) >= target
    failing = [e["load"] for e in answer["evaluations"] if e.get("gpus") is None and e["slo_attainment"] < target]
    above = min(f for f in failing if f > load)
    assert above - load <= tolerance + 1e-9
    assert attainment(scenario_path, above, seeds) < target
    # Fewest GPUs at twice the load: that many meet the target, the next count searched below it does not.
    fewest, layout = answer["min_gpus"], answer["gpu_layout"]
    assert fewest is not None and layout[0] * layout[1] == fewest
    assert attainment(scenario_path, 2.0, seeds, layout) >= target
    fewer = max(c for c in gpu_counts(2, 4) if c < fewest)
    assert attainment(scenario_path, 2.0, seeds, [1, fewer] if fewer <= 2 else [fewer // 2, 2]) < target


@pytest.mark.parametrize(("target", "low", "high", "shown", "hint"), [
    (0.999, 3.0, 4.0, "< 3", "< 3: even the lowest load searched misses the target (--low searches lower)"),
    (0.01, 0.5, 1.0, ">= 1", ">= 1: even the highest load searched meets the target (--high searches higher)"),
])
def test_capacity_table_says_when_the_search_range_holds_no_edge(scenario_path, target, low, high, shown, hint):
    """An answer at the edge of the range searched printed '< 0.25' and '-', with no word on what to change."""
    result = CliRunner().invoke(app, ["capacity", str(scenario_path), "--policies", "static", "--slo-target", str(target),
                                      "--seeds", "1", "--low", str(low), "--high", str(high), "--workers", "1"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "static" in line)
    assert shown in row and hint in result.output and "(1 seed)" in " ".join(result.output.split())
    if shown.startswith("<"):  # the attainment the lowest load gave, simulated directly
        assert f"{attainment(scenario_path, low, [1]):.3f} at {low:g}" in row, row


def test_capacity_rejects_bad_queries(scenario_path):
    with pytest.raises(MmsimError, match="slo-target"):
        plan_capacity(scenario_path, CapacityQuery(["static"], 1.5, [1]))
    with pytest.raises(MmsimError, match="--low < --high"):
        plan_capacity(scenario_path, CapacityQuery(["static"], 0.9, [1], low=2.0, high=1.0))


def test_capacity_refuses_a_folder_holding_another_scenarios_sweep(scenario_path, tmp_path):
    # Its capacity.json landed beside that sweep's runs, and the sweep's report showed it as the sweep's own.
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"name": "other", "base": str(tmp_path / "other.yaml"), "axes": ["seed"]}))
    with pytest.raises(MmsimError, match="holds sweep 'other' of .*give another --out"):
        CliRunner().invoke(app, ["capacity", str(scenario_path), "--policies", "static", "--seeds", "1",
                                 "--out", str(sweep)], catch_exceptions=False)
    assert not (sweep / "capacity.json").exists()
