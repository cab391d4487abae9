"""Every shipped scenario loads, says what it shows, and runs under every built-in policy."""

from __future__ import annotations

import pytest

from sim.policies.registry import get_policy_class, policy_descriptions
from sim.scenario import load_scenario
from sim.simulation import simulate
from tests.conftest import REPO

SCENARIOS = sorted(p for p in (REPO / "scenarios").glob("*.yaml") if not p.name.startswith("sweep"))
BUILTINS = ["static", "fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware"]
QUICK = ["paper-preemption.yaml", "offload.yaml", "azure-two-models.yaml"]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_loads_and_its_first_line_says_what_it_shows(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and len(first) > 30
    scenario = load_scenario(path)
    assert get_policy_class(scenario.policy.name).name == scenario.policy.name


def test_builtins_are_the_documented_six():
    assert set(BUILTINS) <= set(policy_descriptions())


@pytest.mark.parametrize("name", QUICK)
@pytest.mark.parametrize("policy", BUILTINS)
def test_scenario_runs_under_every_builtin(name, policy):
    path = REPO / "scenarios" / name
    result = simulate(load_scenario(path), base_dir=path.parent, policy=policy)
    summary = result.summary
    assert summary["requests_total"] == summary["requests_completed"] + summary["requests_dropped"] > 0
    assert summary["requests_completed"] > 0
