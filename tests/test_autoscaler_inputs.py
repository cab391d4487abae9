"""What a user's autoscaler answers is checked at every decision: a whole number >= 0 and a reason text, else the
run stops in one line, exit 2, naming the autoscaler, what it returned and what it should have; a count past
what the pools hold is capped, as the built-ins' counts are."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sim.fleet.autoscalers import Autoscaler, checked_answer
from sim.policies.contract import PolicyContractError

from conftest import scenario_dict
from test_autoscalers import signals
from test_bad_input import cli

EXPECTED = "desired() must return (whole number >= 0, reason text)"


class Mine(Autoscaler):
    """Stands for a user's autoscaler: its answers are given to the check directly."""


@pytest.mark.parametrize("answer, shown", [
    ((2.5, "x"), "(2.5, 'x') (count of type float, not a whole number)"),
    ((float("nan"), "x"), "(nan, 'x') (count of type float, not a whole number)"),
    ((float("inf"), "x"), "(inf, 'x') (count of type float, not a whole number)"),
    ((np.float64(2.0), "x"), "(np.float64(2.0), 'x') (count of type float64, not a whole number)"),
    ((True, "x"), "(True, 'x') (count of type bool, not a whole number)"),
    (("3", "x"), "('3', 'x') (count of type str, not a whole number)"),
    ((-1, "x"), "(-1, 'x') (count below 0)"),
    ((3, None), "(3, None) (reason of type NoneType, not text)"),
    (3, "3 (type int, not a pair)"),
    (None, "None (type NoneType, not a pair)"),
    ([3, "x"], "[3, 'x'] (type list, not a pair)"),
    ((3,), "(3,) (1 item, not 2)"),
    ((3, "x", "y"), "(3, 'x', 'y') (3 items, not 2)"),
    # The answer's text is 209 characters (7 before the y's, 2 after): its first 80 are shown.
    ((0.5, "y" * 200), f"(0.5, '{'y' * 73}... (209 characters) (count of type float, not a whole number)"),
])
def test_a_wrong_answer_is_named_with_what_was_expected(answer, shown):
    with pytest.raises(PolicyContractError) as caught:
        checked_answer(Mine(), signals(), answer)
    assert str(caught.value) == (f"autoscaler 'Mine' broke the autoscaler contract at t=100.000 s: its desired() for m "
                                 f"returned {shown}; {EXPECTED}")


@pytest.mark.parametrize("answer, taken", [
    ((0, "none"), (0, "none")),
    ((3, "q"), (3, "q")),
    ((10**30, "all"), (10**30, "all")),  # a real count: capped later, with a word in the event (below)
    ((np.int64(3), "q"), (3, "q")),
])
def test_a_whole_number_and_a_text_are_taken_as_python_values(answer, taken):
    count, reason = checked_answer(Mine(), signals(), answer)
    assert (count, reason) == taken and type(count) is int and type(reason) is str


AUTOSCALERS = """from sim.fleet.autoscalers import Autoscaler


class FloatCount(Autoscaler):
    def desired(self, signals):
        return 2.5, "float"


class Huge(Autoscaler):
    def desired(self, signals):
        return 10**30, "huge"
"""


@pytest.fixture
def scenario(tmp_path):
    (tmp_path / "mine.py").write_text(AUTOSCALERS)
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario_dict(autoscaler={"name": "queue-depth", "interval_s": 10.0})))
    return path


def test_a_run_whose_autoscaler_answers_a_float_stops_in_one_line_exit_2(scenario, tmp_path):
    code, output = cli("run", scenario, "--autoscaler", f"{tmp_path}/mine.py:FloatCount", "--out", tmp_path / "out")
    assert code == 2, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    # The first decision is at one interval, for the scenario's first model.
    assert ("autoscaler 'FloatCount' broke the autoscaler contract at t=10.000 s: its desired() for qwen2.5-3b "
            f"returned (2.5, 'float') (count of type float, not a whole number); {EXPECTED}") in output, output
    assert not (tmp_path / "out").exists()


def test_a_count_past_the_pools_is_capped_at_what_they_hold(scenario, tmp_path):
    code, output = cli("run", scenario, "--autoscaler", f"{tmp_path}/mine.py:Huge", "--out", tmp_path / "out")
    assert code == 0, output
    events = pd.read_parquet(tmp_path / "out" / "events.parquet")
    ups = events[events["kind"] == "scale_up"]
    # One node of 2 GPUs and one GPU an instance: 2 instances of each model at most, 1 of each to start with.
    assert set(ups["detail"]) == {"replicas 1->2: huge; capped at the 2 instances the pools hold"}
    assert set(ups["model"]) == {"qwen2.5-3b", "qwen3-8b"}


class Named(Autoscaler):
    name = "mine"


def test_a_named_autoscaler_is_named_with_its_class():
    with pytest.raises(PolicyContractError, match=r"^autoscaler 'mine' \(Named\) broke the autoscaler contract"):
        checked_answer(Named(), signals(), None)


@pytest.mark.parametrize("spec, params, expected", [
    # A target of 0 was a ZeroDivisionError traceback at the first decision; shares and smoothing factors above 1
    # ran, and meant nothing.
    ("autoscaler", ("utilisation", {"target": 0}), "autoscaler.params.target: expected a number from 0.01 to 1, not 0"),
    ("autoscaler", ("kv-utilisation", {"target": 5}), "autoscaler.params.target: expected a number from 0.01 to 1, not 5"),
    ("autoscaler", ("queue-depth", {"target": 0}), "autoscaler.params.target: expected a number from 0.01 to 1e+09"),
    ("autoscaler", ("predictive", {"alpha": 2}), "autoscaler.params.alpha: expected a number from 0.01 to 1, not 2"),
    ("autoscaler", ("predictive", {"target_in_flight": 0}), "autoscaler.params.target_in_flight: expected a number"),
    ("policy", ("offload-aware", {"min_gpu_share": 5}), "policy.params.min_gpu_share: expected a number from 0.01 to 1"),
    ("policy", ("offload-aware", {"max_slowdown": 0}), "policy.params.max_slowdown: expected a number from 1 to 1e+09"),
    ("policy", ("swap-aware", {"kv_reserve_tokens": 1.5}), "policy.params.kv_reserve_tokens: expected a whole number, not 1.5"),
])
def test_parameters_out_of_their_own_range_are_refused(spec, params, expected):
    from sim.errors import MmsimError
    from sim.fleet.autoscalers import make_autoscaler
    from sim.policies.registry import make_policy

    name, values = params
    with pytest.raises(MmsimError) as refused:
        (make_autoscaler if spec == "autoscaler" else make_policy)(name, values)
    assert str(refused.value).startswith(expected), str(refused.value)


def test_a_rate_named_per_s_may_be_zero():
    # aging_tokens_per_s is a rate, not a period: "_s" made it at least 0.001.
    from sim.policies.registry import make_policy

    assert make_policy("swap-aware", {"aging_tokens_per_s": 0}).aging_tokens_per_s == 0


class Unsure(Autoscaler):
    def at_rest(self, model):
        return "maybe"


def test_an_at_rest_answer_that_is_no_yes_or_no_stops_the_run():
    from sim.fleet.autoscalers import checked_rest

    with pytest.raises(PolicyContractError, match=r"autoscaler 'Unsure' broke the autoscaler contract at t=100\.000 s: "
                                                  r"its at_rest\('m'\) returned 'maybe'; it must return True, False or None"):
        checked_rest(Unsure(), signals())
    assert checked_rest(Mine(), signals()) is None


@pytest.mark.parametrize("spec, expected", [
    ("pols.py:", "'' is not a class name"),
    ("pols.py:__class__", "'__class__' is not a class name"),
    ("pols.py:X", r"'X' is not a class \(it is 5\)"),
])
def test_a_policy_file_spec_that_names_no_class_is_refused(tmp_path, monkeypatch, spec, expected):
    from sim.errors import MmsimError
    from sim.policies.registry import get_policy_class

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pols.py").write_text("X = 5\n")
    with pytest.raises(MmsimError, match=expected):
        get_policy_class(spec)
