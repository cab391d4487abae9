"""Cheapest fleet and cost-vs-attainment Pareto: mix order, early stop, a fleet worked out by hand, the frontier
on hand-made points, the Pareto page, and bad flags."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from conftest import mmsim_in_process as cli
from conftest import wall_clock_limit
from sim.errors import MmsimError
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.sweep.fleet import FleetQuery, PoolRange, first_meeting, mixes, plan_fleet
from sim.sweep.pareto import pareto_front

from test_sweep import SCENARIO as NO_POOLS

PRICE = 2.0
# Three deployments of one 3B model on GPUs of 10 GB: two copies (2 x 6.2 GB of weights) never share a GPU,
# so with k < 3 one-GPU nodes 3 - k models are not served and attainment is at most k/3 of the requests; at
# this light load three nodes serve everything. The cheapest fleet meeting 0.9 is 3 nodes, $6 an hour.
THREE_MODELS = {
    "name": "three", "seed": 1, "profile": "paper-rtx5000",
    "cluster": {"pools": [{"name": "p", "nodes": 1, "min_nodes": 1, "max_nodes": 4, "gpus_per_node": 1,
                           "gpu_memory_gb": 10, "price_per_gpu_hour": PRICE}]},
    "models": [{"name": "qwen2.5-3b", "alias": alias} for alias in ("m1", "m2", "m3")],
    "workload": {"generator": {"duration_s": 30, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                               "mix": {"m1": 1, "m2": 1, "m3": 1},
                               "prompt_tokens": {"dist": "constant", "value": 200},
                               "output_tokens": {"dist": "constant", "value": 20}}},
    "slo": {"default": {"ttft_s": 2.0, "tpot_s": 0.2}},
    "policy": {"name": "static"},
}


@pytest.fixture
def three(tmp_path) -> Path:
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(THREE_MODELS))
    return path


def direct(nodes: int, seed: int) -> dict:
    """The summary of THREE_MODELS on ``nodes`` fixed nodes, simulated without the search's code."""
    data = copy.deepcopy(THREE_MODELS)
    data["cluster"]["pools"][0].update(nodes=nodes, min_nodes=nodes, max_nodes=nodes)
    return simulate(parse_scenario(data, "test"), seed=seed).summary


def test_mixes_are_in_order_of_hourly_price_then_gpus():
    pools = [PoolRange("a", 0, 2, 2, 1.0), PoolRange("b", 0, 1, 1, 3.0)]
    assert [(m.nodes, m.gpus, m.hourly_usd) for m in mixes(pools, 100)] == [
        ((1, 0), 2, 2.0), ((0, 1), 1, 3.0), ((2, 0), 4, 4.0), ((1, 1), 3, 5.0), ((2, 1), 5, 7.0)]
    tied = [PoolRange("x", 0, 1, 4, 1.0), PoolRange("y", 0, 1, 2, 2.0)]  # both $4 an hour: fewer GPUs first
    assert [m.nodes for m in mixes(tied, 100)] == [(0, 1), (1, 0), (1, 1)]
    with pytest.raises(MmsimError, match="6 mixes, more than --max-mixes 5"):
        mixes(pools, 5)


@pytest.mark.parametrize("batch", [1, 2, 3, 10])
def test_first_meeting_is_the_first_in_order_whatever_the_batch(batch):
    attained = [0.2, 0.95, 0.5, 0.97, 0.99, 0.1]  # not monotone: a pricier mix may do worse
    asked: list[int] = []

    def evaluate(chunk):
        asked.extend(chunk)
        return [attained[i] for i in chunk]

    index, run = first_meeting(list(range(6)), evaluate, 0.96, batch)
    assert index == 3 and run == len(asked) == min(6, -(-4 // batch) * batch)
    assert asked == list(range(run))  # in order, and nothing past the answer's batch
    assert first_meeting(list(range(6)), lambda c: [attained[i] for i in c], 0.999, batch) == (None, 6)


def test_cheapest_fleet_is_the_hand_worked_answer_and_costs_its_price(three):
    seeds = [1, 2]
    with wall_clock_limit(120):
        [answer] = plan_fleet(three, FleetQuery(["static"], 0.9, seeds), workers=1)
    assert answer.nodes == {"p": 3} and answer.gpus == 3 and answer.hourly_usd == 3 * 1 * PRICE
    assert (answer.mixes_total, answer.mixes_run) == (4, 3)  # 4 nodes is pricier than the answer: never run
    assert [e["nodes"]["p"] for e in answer.evaluations] == [1, 2, 3]
    assert all(e["slo_attainment"] < 0.9 for e in answer.evaluations[:2])
    summaries = [direct(3, seed) for seed in seeds]
    assert answer.figures["slo_attainment"] == pytest.approx(sum(s["slo_attainment"] for s in summaries) / 2)
    assert answer.figures["slo_attainment"] >= 0.9
    # A fixed fleet is billed from time 0 to the run's end: 3 nodes x 1 GPU x $2 x the simulated hours.
    hours = [s["simulated_seconds"] / 3600 for s in summaries]
    assert answer.figures["cost_usd"] == pytest.approx(sum(3 * 1 * PRICE * h for h in hours) / 2, rel=1e-9)
    assert answer.figures["gpu_hours"] == pytest.approx(sum(3 * h for h in hours) / 2, rel=1e-9)
    two = [direct(2, seed) for seed in seeds]
    assert sum(s["slo_attainment"] for s in two) / 2 < 0.9 and all(s["requests_dropped"] > 0 for s in two)


def test_cheapest_fleet_cli_writes_capacity_json(three, tmp_path, capsys):
    with wall_clock_limit(120):
        code, out, err = cli(capsys, "capacity", three, "--cheapest-fleet", "--slo-target", "0.9", "--seeds", "1",
                             "--workers", "2", "--out", tmp_path / "out", "--json")
    assert code == 0, err
    printed = json.loads(out)
    assert printed == json.loads((tmp_path / "out" / "capacity.json").read_text())
    [answer] = printed["fleet"]
    # Two workers, one seed: mixes run two at a time, so 4 nodes is run beside 3, and the answer is the same.
    assert answer["nodes"] == {"p": 3} and answer["mixes_run"] == 4 and answer["hourly_usd"] == 6.0


def test_pareto_front_on_hand_made_points():
    points = [(1.0, 0.5), (2.0, 0.9), (1.5, 0.4), (3.0, 0.9), (0.5, 0.1), (2.0, 0.9), (None, 1.0), (4.0, 0.95),
              (4.0, 0.93)]
    # (1.5, 0.4) is beaten by (1.0, 0.5); (3.0, 0.9) by (2.0, 0.9); (4.0, 0.93) by (4.0, 0.95); equal points
    # both stay; a point without a cost is never on the frontier.
    assert pareto_front(points) == [True, True, False, False, True, True, False, True, False]
    assert pareto_front([]) == []


def test_pareto_cli_writes_a_self_contained_page(three, tmp_path, capsys):
    out = tmp_path / "pareto"
    with wall_clock_limit(120):
        code, printed, err = cli(capsys, "capacity", three, "--pareto", "--autoscalers", "none,queue-depth",
                                 "--seed-list", "3", "--workers", "2", "--out", out, "--json")
    assert code == 0, err
    data = json.loads((out / "pareto.json").read_text())
    assert json.loads(printed)["points"] == data["points"]
    points = data["points"]
    assert [(p["policy"], p["autoscaler"]) for p in points] == [("static", "none"), ("static", "queue-depth")]
    assert [p["pareto"] for p in points] == pareto_front([(p["cost_per_1k_requests_usd"], p["slo_attainment"]) for p in points])
    assert any(p["pareto"] for p in points) and all(p["failed"] == 0 for p in points)
    page = (out / "pareto.html").read_text()
    assert page.count("<svg") == 1 and "queue-depth" in page and "cost per 1,000 requests" in page
    assert "<script" not in page and 'src="http' not in page and "<link" not in page


@pytest.mark.parametrize("flags, message", [
    (["--pareto", "--autoscalers", "none,bogus"], "unknown autoscaler 'bogus'"),
    (["--pareto", "--autoscalers", "none,none"], "'none' is there twice"),
    (["--pareto", "--load", "0"], "--load must be"),
    (["--pareto", "--cheapest-fleet"], "separate searches"),
    (["--cheapest-fleet", "--gpus-for-load", "2"], "--gpus-for-load is for the load search, not for --cheapest-fleet"),
    (["--pareto", "--slo-target", "0.9"], "--slo-target is for the load search and --cheapest-fleet, not for --pareto"),
    (["--cheapest-fleet", "--tolerance", "0.1"], "--tolerance is for the load search"),
    (["--cheapest-fleet", "--max-mixes", "3"], "more than --max-mixes 3"),
    (["--autoscalers", "none"], "--autoscalers is for --pareto"),
    (["--max-mixes", "3"], "--max-mixes is for --cheapest-fleet"),
    (["--load", "2"], "--load is for --cheapest-fleet and --pareto, not for the load search"),
    (["--gpus-for-load", "2"], "--gpus-for-load lays out GPUs"),
    (["--cheapest-fleet", "--policies", "no-such-policy"], "no-such-policy"),
])
def test_bad_flags_are_one_line_and_exit_2(three, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    code, _, err = cli(capsys, "capacity", three, *flags, "--seeds", "1", "--out", out)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # nothing half-written


def test_cheapest_fleet_needs_pools(tmp_path, capsys):
    path = tmp_path / "no-pools.yaml"
    path.write_text(yaml.safe_dump(NO_POOLS))
    code, _, err = cli(capsys, "capacity", path, "--cheapest-fleet", "--seeds", "1")
    assert code == 2 and "cluster.pools" in err and len(err.strip().splitlines()) == 1
