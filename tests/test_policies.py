"""The built-in policies on the shipped mixed scenario, and a user policy loaded from a file through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.policies.registry import policy_descriptions
from sim.scenario import load_scenario, parse_scenario, read_yaml
from sim.simulation import simulate
from sim.sweep.axis_paths import set_path

from conftest import assert_same_times

ROOT = Path(__file__).resolve().parents[1]
MIXED = ROOT / "scenarios" / "mixed.yaml"
BUILTINS = ("static", "fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware")


@pytest.fixture(scope="module")
def mixed_summaries() -> dict[str, dict]:
    scenario = load_scenario(MIXED)
    return {name: simulate(scenario, policy=name, base_dir=MIXED.parent).summary for name in BUILTINS}


def test_every_builtin_is_registered_with_a_description():
    descriptions = policy_descriptions()
    for name in BUILTINS:
        assert descriptions.get(name), name


def test_mixed_scenario_first_line_says_what_it_shows():
    first = MIXED.read_text().splitlines()[0]
    assert first.startswith("# ") and len(first) > 20


def test_every_builtin_runs_mixed_and_the_summaries_differ(mixed_summaries):
    for name, summary in mixed_summaries.items():
        assert summary["requests_total"] > 1000, name
        assert summary["requests_completed"] + summary["requests_dropped"] == summary["requests_total"]
    # Six policies, six different outcomes.
    assert len({round(s["goodput_requests_per_s"], 6) for s in mixed_summaries.values()}) == len(BUILTINS)


def test_mixed_static_cannot_serve_every_model(mixed_summaries):
    # The seven models' weights exceed the four GPUs: a fixed placement leaves models unserved.
    static = mixed_summaries["static"]
    assert static["drop_reasons"].get("not_placed", 0) > 0
    assert static["lost_seconds"]["reload"] == 0


def test_mixed_swap_aware_beats_fcfs_swap_on_goodput_and_reload_seconds(mixed_summaries):
    # Weighing the swap penalty (and evicting idle instances first) instead of swapping for every FIFO head.
    naive, aware = mixed_summaries["fcfs-swap"], mixed_summaries["swap-aware"]
    assert aware["goodput_requests_per_s"] > naive["goodput_requests_per_s"]
    assert aware["lost_seconds"]["reload"] < naive["lost_seconds"]["reload"]
    assert aware["loads"] < naive["loads"]
    assert aware["preemptions"] < naive["preemptions"]


def test_mixed_swap_aware_beats_static(mixed_summaries):
    # Static never pays a reload but leaves the models that fit nowhere unserved; swap-aware serves every model.
    static, aware = mixed_summaries["static"], mixed_summaries["swap-aware"]
    assert aware["requests_dropped"] == 0
    assert aware["slo_attainment"] > static["slo_attainment"]
    assert aware["goodput_requests_per_s"] > static["goodput_requests_per_s"]


def test_mixed_qualitative_ordering(mixed_summaries):
    goodput = {name: s["goodput_requests_per_s"] for name, s in mixed_summaries.items()}
    # Swapping on a clock or for every FIFO head loses more to reloads than a fixed placement loses to the
    # models it drops; weighing the penalty beats both; offloading short jobs instead of swapping meets
    # more SLOs (at about the same goodput); deadline ordering helps most.
    attainment = {name: s["slo_attainment"] for name, s in mixed_summaries.items()}
    assert goodput["time-slice"] < goodput["fcfs-swap"] < goodput["static"] < min(goodput["swap-aware"], goodput["offload-aware"])
    assert max(goodput["swap-aware"], goodput["offload-aware"]) < goodput["slo-aware"]
    assert attainment["offload-aware"] > attainment["swap-aware"]
    # A fixed quantum pays the swap penalty on a clock, whatever the work: worst TTFT among the swappers.
    swappers = ("fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware")
    worst_ttft = max(swappers, key=lambda n: mixed_summaries[n]["ttft_s"]["p50"])
    assert worst_ttft == "time-slice"
    assert attainment["slo-aware"] > attainment["swap-aware"]


def test_mixed_swap_aware_beats_the_example_policy_over_three_seeds(mixed_summaries):
    # The example (short-first admission, free memory and idle victims first, never evicting a busy model)
    # is strong on seed 7 but can pack two models with no KV room between them and strand their queues;
    # swap-aware breaks such stalls and serves every request. Over three seeds it leads on both measures.
    scenario = load_scenario(MIXED)
    example_policy = str(ROOT / "examples" / "my_policy.py") + ":MyPolicy"
    runs = {name: [simulate(scenario, policy=name, seed=seed, base_dir=MIXED.parent).summary for seed in (7, 8, 9)]
            for name in ("swap-aware", example_policy)}
    mean = {name: {key: sum(s[key] for s in summaries) / 3 for key in ("goodput_requests_per_s", "slo_attainment")}
            for name, summaries in runs.items()}
    assert mean["swap-aware"]["goodput_requests_per_s"] > mean[example_policy]["goodput_requests_per_s"]
    assert mean["swap-aware"]["slo_attainment"] > mean[example_policy]["slo_attainment"]
    assert all(s["requests_dropped"] == 0 for s in runs["swap-aware"])


def test_example_policy_runs_through_the_cli(tmp_path, monkeypatch):
    from sim.cli import app

    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "scenarios/mixed.yaml", "--policy", "examples/my_policy.py:MyPolicy",
                                      "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "examples/my_policy.py:MyPolicy"
    assert summary["requests_completed"] > 0
    assert summary["requests_completed"] + summary["requests_dropped"] == summary["requests_total"]


@pytest.mark.parametrize("policy", ["swap-aware", "slo-aware", "examples/my_policy.py:MyPolicy"])
def test_declared_waiting_orders_give_the_same_times_in_both_modes(policy):
    """These policies declare their order ``fixed-key`` (swap-aware, the example) or ``by-key`` (slo-aware), which
    lets fast-forward skip boundaries at which the queue's head (fixed-key) or every waiting request (by-key) cannot
    start: per-iteration mode, which sorts at every boundary, must agree. (Taking slo-aware's order for fixed-key,
    whose "late" flag changes with the clock, made them differ, by up to 24% over the whole scenario.)"""
    path = ROOT / "scenarios" / "mixed.yaml"
    data = read_yaml(path)
    set_path(data, "workload.generator.duration_s", 240.0)
    scenario = parse_scenario(data, str(path))
    policy = str(ROOT / policy) if policy.startswith("examples/") else policy
    fast, exact = (simulate(scenario, base_dir=path.parent, policy=policy, mode=mode).requests for mode in ("fast", "exact"))
    assert list(fast["status"]) == list(exact["status"]) and (fast["preemptions"] > 0).any()
    assert_same_times(fast, exact, columns=("first_scheduled_s", "first_token_s", "finish_s"))
