"""The built-in policies on the shipped mixed scenario, and a user policy loaded from a file through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.policies.registry import policy_descriptions
from sim.scenario import load_scenario
from sim.simulation import simulate

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
    # The seven models' weights exceed the four GPUs: a fixed placement leaves one model unserved.
    static = mixed_summaries["static"]
    assert static["drop_reasons"].get("not_scheduled", 0) > 0
    assert static["lost_seconds"]["reload"] == 0


def test_mixed_swap_aware_beats_fcfs_swap_on_goodput_and_reload_seconds(mixed_summaries):
    naive, aware = mixed_summaries["fcfs-swap"], mixed_summaries["swap-aware"]
    assert aware["goodput_requests_per_s"] > naive["goodput_requests_per_s"]
    assert aware["lost_seconds"]["reload"] < naive["lost_seconds"]["reload"]
    assert aware["loads"] < naive["loads"]
    assert aware["preemptions"] < naive["preemptions"]


def test_mixed_qualitative_ordering(mixed_summaries):
    goodput = {name: s["goodput_requests_per_s"] for name, s in mixed_summaries.items()}
    # Serving every model beats a fixed placement that drops one; weighing the penalty beats ignoring it;
    # offloading short jobs instead of swapping helps; deadline ordering helps SLO attainment most.
    assert goodput["static"] < goodput["fcfs-swap"] < goodput["swap-aware"] < goodput["offload-aware"] < goodput["slo-aware"]
    # A fixed quantum pays the swap penalty on a clock, whatever the work: worst TTFT among the swappers.
    swappers = ("fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware")
    worst_ttft = max(swappers, key=lambda n: mixed_summaries[n]["ttft_s"]["p50"])
    assert worst_ttft == "time-slice"
    assert mixed_summaries["slo-aware"]["slo_attainment"] == max(s["slo_attainment"] for s in mixed_summaries.values())


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
