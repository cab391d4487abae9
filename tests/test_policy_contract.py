"""A user's policy that breaks the policy contract, or raises, stops the run with one line naming it.

Before these checks a policy that took a request out of its waiting queue lost it silently (the summary counted
fewer requests than arrived), one that put a request in twice hung the engine, and one that raised ended in a
traceback. Each case here is a small policy doing one wrong thing; the expected outcome is written by hand."""

from __future__ import annotations

import re
import subprocess
import textwrap

import numpy as np
import pytest

from sim.errors import MmsimError
from sim.policies.contract import PolicyContractError
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import MMSIM_CLI, scenario_dict, wall_clock_limit

POLICIES = textwrap.dedent('''
    from collections import deque

    from sim.fleet.autoscalers import Autoscaler
    from sim.policies.base import Policy
    from sim.policies.static import StaticPolicy


    class Reorders(StaticPolicy):
        """Longest prompt first: a legal reorder."""
        name = "reorders"

        def order_waiting(self, instance, view):
            ordered = sorted(instance.waiting, key=lambda r: (-r.prompt_tokens, r.id))
            instance.waiting.clear()
            instance.waiting.extend(ordered)


    class TakesOne(StaticPolicy):
        name = "takes-one"

        def order_waiting(self, instance, view):
            if len(instance.waiting) > 3:
                instance.waiting.pop()


    class AddsTwice(StaticPolicy):
        name = "adds-twice"

        def order_waiting(self, instance, view):
            instance.waiting.append(instance.waiting[0])


    class Replaces(StaticPolicy):
        name = "replaces"

        def order_waiting(self, instance, view):
            instance.waiting = deque(reversed(instance.waiting))


    class LosesOnFinish(StaticPolicy):
        """Drops a waiting request on the floor from another hook, where no per-call check looks."""
        name = "loses-on-finish"

        def on_finish(self, request, instance, view):
            if len(instance.waiting) > 2:
                instance.waiting.pop()


    class LeadsWithARunner(StaticPolicy):
        """Sorts by key, and names a running request among those its sort may put first."""
        name = "leads-with-a-runner"
        waiting_order = "by-key"

        def order_waiting(self, instance, view):
            ordered = sorted(instance.waiting, key=lambda r: r.id)
            instance.waiting.clear()
            instance.waiting.extend(ordered)

        def waiting_leaders(self, instance, view):
            return [*instance.running, *instance.waiting]


    class LeadsWithNothing(LeadsWithARunner):
        name = "leads-with-nothing"

        def waiting_leaders(self, instance, view):
            return None


    class LeadsWithIds(LeadsWithARunner):
        name = "leads-with-ids"

        def waiting_leaders(self, instance, view):
            return [request.id for request in instance.waiting]


    class TagsInstances(StaticPolicy):
        """Keeps its state on the engine's objects: refused by the compiled build, and so by the pure one."""
        name = "tags-instances"

        def on_instance_ready(self, instance, view):
            instance.served_by_me = True
            super().on_instance_ready(instance, view)


    class RaisesOnArrival(StaticPolicy):
        name = "raises"

        def on_arrival(self, request, view):
            if request.id == 5:
                raise KeyError("no such tenant")


    class RaisesInSetup(Policy):
        name = "raises-in-setup"

        def setup(self, view):
            return 1 / 0


    class LoadsBoth(Policy):
        name = "loads-both"

        def setup(self, view):
            for model in range(len(view.model_names)):
                view.load(model, view.gpus[model])


    class RoutesToTheOtherModel(LoadsBoth):
        def route(self, request, view):
            return next(i for i in view.instances() if i.model != request.model)


    class RoutesToANumber(LoadsBoth):
        def route(self, request, view):
            return 42


    class AssignsToTheOtherModel(LoadsBoth):
        def route(self, request, view):
            return None

        def on_arrival(self, request, view):
            view.assign(request, next(i for i in view.instances() if i.model != request.model))


    class FailsToStart(LoadsBoth):
        def __init__(self, **params):
            raise RuntimeError("no licence")


    class ChecksItsOwn(LoadsBoth):
        def __init__(self, **params):
            raise ValueError("bad init")


    class ExitsOnArrival(LoadsBoth):
        def on_arrival(self, request, view):
            raise SystemExit(0)


    class LoadsModelMinusOne(Policy):
        name = "loads-minus-one"

        def setup(self, view):
            view.load(-1, view.gpus[0])


    class LoadsModelTrue(Policy):
        name = "loads-true"

        def setup(self, view):
            view.load(True, view.gpus[0])


    class TimerOfANumber(LoadsBoth):
        def setup(self, view):
            super().setup(view)
            view.call_at(1.0, 42)


    class TimerWithoutTheView(LoadsBoth):
        def setup(self, view):
            super().setup(view)
            view.call_at(1.0, lambda: None)


    class LoadsTwiceTheWeights(Policy):
        name = "loads-share-two"

        def setup(self, view):
            view.load(0, view.gpus[0], gpu_share=2.0)


    class UnloadsOddly(LoadsBoth):
        def on_arrival(self, request, view):
            view.unload(view.instances()[0], mode="banana")


    class TimerAtNaN(LoadsBoth):
        def setup(self, view):
            super().setup(view)
            view.call_at(float("nan"), lambda v: None)


    class TimerLoop(LoadsBoth):
        """Re-arms a timer at the same instant for ever: no model is loaded twice, so nothing evicts anything."""

        def setup(self, view):
            super().setup(view)

            def again(v):
                v.call_at(v.now, again)

            view.call_at(0.5, again)


    class FailingScaler(Autoscaler):
        name = "failing"

        def desired(self, signals):
            raise RuntimeError("metrics server down")
''')


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):  # the defects these replace included a hang
        yield


@pytest.fixture
def policies(tmp_path):
    path = tmp_path / "contract_policies.py"
    path.write_text(POLICIES)
    return path


def burst(n=40, model="qwen2.5-3b"):
    """``n`` requests at t=1 for one instance of at most 4 running: the rest wait in its queue."""
    times = np.ones(n)
    return [RequestChunk(times, np.array([model] * n, object), np.full(n, 200), np.full(n, 20))]


def scenario():
    return parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}], engine={"max_num_seqs": 4}), "test")


def run(policies, name, **kwargs):
    return simulate(scenario(), policy=f"{policies}:{name}", chunks=burst(), **kwargs)


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_a_legal_reorder_serves_every_request(policies, mode):
    frame = run(policies, "Reorders", mode=mode).requests
    assert len(frame) == 40 and set(frame["status"]) == {"completed"}
    assert frame["id"].is_unique


@pytest.mark.parametrize("name, label, expected", [
    ("TakesOne", "takes-one", "its order_waiting on qwen2.5-3b (GPU 0) removed 1 request from the waiting queue"),
    ("AddsTwice", "adds-twice", "its order_waiting on qwen2.5-3b (GPU 0) put one request into the waiting queue twice"),
    ("Replaces", "replaces", "replaced instance.waiting with another object"),
])
def test_order_waiting_may_only_reorder(policies, name, label, expected):
    with pytest.raises(PolicyContractError) as stopped:
        run(policies, name)
    message = str(stopped.value)
    assert message.startswith(f"policy '{label}' ({name}) broke the policy contract at t="), message
    assert expected in message, message


@pytest.mark.parametrize("name, label, expected", [
    ("LeadsWithARunner", "leads-with-a-runner", "named Request("),
    ("LeadsWithNothing", "leads-with-nothing", "gave None, where it should give requests"),
    ("LeadsWithIds", "leads-with-ids", "gave [3, 4, 5, 6, 7, 8, 9], where it should give requests"),
])
def test_waiting_leaders_may_name_only_waiting_requests(policies, name, label, expected):
    # KV room for about two of the ten 3,000-token prompts: the rest wait beside a batch that is not full, where
    # fast-forward asks the policy which of them its sort may put first.
    crowded = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}], engine={"max_num_seqs": 8}, cluster={
        "nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 10, "host_memory_gb": 64}), "test")
    prompts = [RequestChunk(np.ones(10), np.array(["qwen2.5-3b"] * 10, object), np.full(10, 3000), np.full(10, 50))]
    with pytest.raises(PolicyContractError) as stopped:
        simulate(crowded, policy=f"{policies}:{name}", chunks=prompts)
    message = str(stopped.value)
    assert message.startswith(f"policy '{label}' ({name}) broke the policy contract at t="), message
    assert f"its waiting_leaders on qwen2.5-3b (GPU 0) {expected}" in message, message
    assert message.endswith("(it may name only requests of instance.waiting)")


def test_a_policy_that_adds_attributes_to_an_instance_stops_in_either_build(policies):
    """An editable (pure) install took ``instance.x = ...`` and ``pip install .`` (compiled) refused it."""
    with pytest.raises(PolicyContractError) as stopped:
        run(policies, "TagsInstances")
    assert "raised AttributeError: 'Instance' object has no attribute 'served_by_me'" in str(stopped.value)
    assert "(in on_instance_ready, " in str(stopped.value)


def test_a_request_lost_outside_order_waiting_is_caught_by_the_final_count(policies):
    with pytest.raises(PolicyContractError) as stopped:
        run(policies, "LosesOnFinish")
    message = str(stopped.value)
    assert message.startswith("policy 'loses-on-finish' (LosesOnFinish) lost ")
    lost = int(message.split(" lost ")[1].split(" of ")[0])
    assert 1 <= lost < 40 and "of 40 requests" in message


def test_an_exception_in_a_users_hook_names_the_policy_hook_and_line(policies):
    with pytest.raises(PolicyContractError) as stopped:
        run(policies, "RaisesOnArrival")
    message = str(stopped.value)
    line = POLICIES.splitlines().index('            raise KeyError("no such tenant")') + 1
    assert message == (f"policy 'raises' (RaisesOnArrival) raised KeyError: 'no such tenant' (in on_arrival, "
                       f"{policies} line {line}) at t=1.000 s")


def test_an_exception_in_mmsims_own_policy_code_keeps_its_traceback(monkeypatch):
    # A defect of mmsim's is not the user's input error: it must surface as itself, not as a one-line message.
    from sim.policies.static import StaticPolicy

    def broken(self, view):
        raise ZeroDivisionError("mmsim defect")

    monkeypatch.setattr(StaticPolicy, "setup", broken)
    with pytest.raises(ZeroDivisionError):
        simulate(scenario(), policy="static", chunks=burst())


def test_the_cli_reports_a_raising_policy_in_one_line_exit_2_and_writes_nothing(policies, tmp_path):
    path = tmp_path / "scenario.json"
    import json
    path.write_text(json.dumps(scenario_dict()))
    out = tmp_path / "out"
    done = subprocess.run([*MMSIM_CLI, "run", str(path), "--policy", f"{policies}:RaisesInSetup", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and "raised ZeroDivisionError: division by zero (in setup, " in output
    assert not out.exists()


def test_a_raising_autoscaler_file_is_one_line_exit_2(policies, tmp_path):
    path = tmp_path / "scenario.json"
    import json
    data = scenario_dict(autoscaler={"name": "queue-depth", "interval_s": 10.0})
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    done = subprocess.run([*MMSIM_CLI, "run", str(path), "--autoscaler", f"{policies}:FailingScaler",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    assert "autoscaler 'failing' (FailingScaler) raised RuntimeError: metrics server down (in desired, " in output, output
    assert not out.exists()


def two_models():
    return parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}], cluster={
        "nodes": 1, "gpus_per_node": 2, "host_memory_gb": 64}), "test")


def two_model_burst():
    return [RequestChunk(np.array([1.0, 1.0]), np.array(["qwen2.5-3b", "qwen3-8b"], object), np.full(2, 100),
                         np.full(2, 10))]


@pytest.mark.parametrize("name, expected", [
    # Before: decoded by the other model's weights and reported completed (and "unloaded ones" rows with negative
    # token counts in the prefix table); a number was a traceback from the engine.
    ("RoutesToTheOtherModel", "its route sent request 0 (qwen2.5-3b) to qwen3-8b, an instance of another model; "
                              "expected a ready or loading instance of qwen2.5-3b or None"),
    ("RoutesToANumber", "its route gave 42 for request 0 (qwen2.5-3b); expected a ready or loading instance of "
                        "qwen2.5-3b or None"),
    ("AssignsToTheOtherModel", "its assign sent request 0 (qwen2.5-3b) to qwen3-8b, an instance of another model; "
                               "expected a ready or loading instance of qwen2.5-3b"),
])
def test_requests_go_only_to_instances_of_their_own_model(policies, name, expected):
    with pytest.raises(PolicyContractError) as stopped:
        simulate(two_models(), policy=f"{policies}:{name}", chunks=two_model_burst())
    assert str(stopped.value) == f"policy 'loads-both' ({name}) broke the policy contract at t=1.000 s: {expected}"


@pytest.mark.parametrize("name, expected", [
    ("LoadsModelMinusOne", "raised ValueError: model index -1 is not one of this scenario's 0..1 (in setup"),
    ("LoadsTwiceTheWeights", "raised ValueError: gpu_share must be from 0 to 1, not 2.0 (in setup"),
    ("UnloadsOddly", "raised ValueError: mode must be 'swap' or 'recompute', not 'banana' (in on_arrival"),
    ("TimerAtNaN", "raised ValueError: call_at needs a finite time, not nan (in setup"),
    # True loaded model 1; a callback that cannot take the view failed in mmsim's code when it fired, a traceback.
    ("LoadsModelTrue", "raised ValueError: a model index is a Python int, not True (in setup"),
    ("TimerOfANumber", "raised ValueError: call_at needs a callback taking the view, callback(view); 42 cannot"),
    ("TimerWithoutTheView", "raised ValueError: call_at needs a callback taking the view, callback(view); <function"),
])
def test_the_views_actions_refuse_arguments_out_of_range(policies, name, expected):
    """Each was taken: -1 loaded the last model, a share of 2 loaded twice the weights, an unknown unload mode
    dropped every request it held, and a timer at NaN fired at once."""
    with pytest.raises(PolicyContractError, match=re.escape(expected)):
        simulate(two_models(), policy=f"{policies}:{name}", chunks=two_model_burst())


def test_a_policy_that_raises_while_being_made_is_one_line_naming_its_file(policies, tmp_path):
    path = tmp_path / "scenario.json"
    import json
    path.write_text(json.dumps(scenario_dict()))
    done = subprocess.run([*MMSIM_CLI, "run", str(path), "--policy", f"{policies}:FailsToStart", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output
    line = POLICIES.splitlines().index('        raise RuntimeError("no licence")') + 1
    assert (f"policy '{policies}:FailsToStart' raised RuntimeError while being made: no licence (in __init__, "
            f"{policies} line {line})") in " ".join(output.split())


def test_a_value_error_of_a_policys_own_init_is_located_not_blamed_on_the_parameters(policies):
    # ValueError and TypeError were all taken for "bad parameters", with no file or line.
    line = POLICIES.splitlines().index('        raise ValueError("bad init")') + 1
    with pytest.raises(MmsimError) as caught:
        simulate(two_models(), policy=f"{policies}:ChecksItsOwn", chunks=two_model_burst())
    assert str(caught.value).endswith(f"policy '{policies}:ChecksItsOwn' raised ValueError while being made: bad init "
                                        f"(in __init__, {policies} line {line})"), str(caught.value)
    with pytest.raises(MmsimError, match="bad parameters for policy 'static'"):
        simulate(two_models(), policy="static", params={"no_such": 1}, chunks=two_model_burst())


def test_sys_exit_in_a_hook_is_reported_not_a_silent_success(policies):
    # SystemExit is no Exception: it passed every handler, and the CLI ended with exit 0 and nothing written.
    with pytest.raises(PolicyContractError, match=r"raised SystemExit: 0 \(in on_arrival, "):
        simulate(two_models(), policy=f"{policies}:ExitsOnArrival", chunks=two_model_burst())


def test_a_timer_loop_is_named_as_one_not_as_models_evicting_each_other(policies):
    from sim.engine.progress import NoProgress

    with pytest.raises(NoProgress) as stopped:
        simulate(two_models(), policy=f"{policies}:TimerLoop", chunks=two_model_burst())
    message = str(stopped.value)
    assert "policy timers (view.call_at) fired in that time" in message and "evict" not in message, message
