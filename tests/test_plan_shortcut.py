"""swap-aware's plan skips its victim search when a re-check already due makes the search moot
(``SwapAwarePolicy.search_moot``). The reference is the same policy searching every time: every request and
event of a run must be the same with and without the shortcut, on the shipped mixed scenario (where most searches
are skipped) and on small random workloads (Hypothesis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from sim.policies.offload_aware import OffloadAwarePolicy
from sim.policies.prefix_swap_aware import PrefixSwapAwarePolicy
from sim.policies.registry import register
from sim.policies.slo_aware import SloAwarePolicy
from sim.policies.swap_aware import SwapAwarePolicy
from sim.scenario import load_scenario
from sim.simulation import simulate

from conftest import wall_clock_limit
from test_policy_properties import SCENARIO, chunks, requests_strategy

ROOT = Path(__file__).resolve().parent.parent
FAMILY = (SwapAwarePolicy, SloAwarePolicy, OffloadAwarePolicy, PrefixSwapAwarePolicy)
MOOT_CALLS: dict[str, list[bool]] = {}


def full_search(base: type) -> str:
    """Register ``base`` searching for victims at every plan, and counting what its shortcut would have said."""
    name = f"{base.name}-full-search"

    def search_moot(self, view, model):
        MOOT_CALLS.setdefault(base.name, []).append(base.search_moot(self, view, model))
        return False

    register(type(base.__name__ + "FullSearch", (base,), {"name": name, "search_moot": search_moot}))
    return name


REFERENCE = {base.name: full_search(base) for base in FAMILY}
# The defaults, and parameters under which a swap often pays and instances often settle before a re-check is due:
# the shortcut's every condition decides some plans.
PARAMS = (None, {"benefit_ratio": 0.5, "min_residency_s": 0.5, "recheck_s": 4.0})


def same_run(first, second) -> None:
    for table in ("requests", "events"):
        a, b = getattr(first, table), getattr(second, table)
        assert a.equals(b), f"{table} differ"


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("policy", [base.name for base in FAMILY])
def test_shortcut_changes_nothing_on_mixed(policy, params):
    path = ROOT / "scenarios" / "mixed.yaml"
    scenario = load_scenario(path)
    MOOT_CALLS.clear()
    with wall_clock_limit(120):
        searched = simulate(scenario, base_dir=path.parent, policy=REFERENCE[policy], params=params)
        shortcut = simulate(scenario, base_dir=path.parent, policy=policy, params=params)
    same_run(searched, shortcut)
    moot = MOOT_CALLS[policy]
    assert sum(moot) > (len(moot) / 3 if params is None else 0), "the shortcut skipped too few searches to test it"
    assert searched.summary["preemptions"] == shortcut.summary["preemptions"] > 0


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("policy", [base.name for base in FAMILY])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=requests_strategy)
def test_shortcut_changes_nothing_on_random_workloads(policy, params, rows):
    with wall_clock_limit(60):
        searched = simulate(SCENARIO, policy=REFERENCE[policy], params=params, chunks=chunks(rows))
        shortcut = simulate(SCENARIO, policy=policy, params=params, chunks=chunks(rows))
    same_run(searched, shortcut)
