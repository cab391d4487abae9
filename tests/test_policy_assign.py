"""``view.assign`` of a request already queued at an instance moves it; a request in a batch, or done, is refused.

Before, a policy that preempted a request and assigned it to another replica left it in both instances' queues:
the run ended "ended 1 request twice", blaming the policy, and the request that moved into a loading instance was
charged that instance's whole load as its reload loss, twice its pause. Expected figures come from the run's own
event table (when the load ended, when the preemption began), not from the cost model's formulas."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from sim.policies.contract import PolicyContractError
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import assert_same_times, scenario_dict, wall_clock_limit

POLICIES = textwrap.dedent('''
    from sim.policies.base import Policy
    from sim.policies.static import StaticPolicy


    class Moves(StaticPolicy):
        """After its first step with a decoding request, swaps it out and queues it at the other replica."""
        name = "moves"
        done = False

        def on_step(self, instance, view):
            if self.done or not instance.running:
                return
            self.done = True
            request = instance.running[0]
            view.preempt(instance, request, "swap")  # between steps: at once
            other = next(i for i in view.instances_of(request.model) if i is not instance)
            view.assign(request, other)


    class StaysPut(StaticPolicy):
        """Assigns every waiting request again to the instance it waits at."""
        name = "stays-put"

        def on_step(self, instance, view):
            for request in list(instance.waiting):
                view.assign(request, instance)


    class MigratesOnEvict(Policy):
        """At t=10 unloads the copy on GPU 0; as the unload starts, loads one on GPU 1 and queues its requests there."""
        name = "migrates-on-evict"

        def setup(self, view):
            self.first = view.load(0, view.gpus[0])
            view.call_at(10.0, lambda v: v.unload(self.first, "recompute"))

        def on_evicted(self, instance, requests, view):
            other = view.load(0, view.gpus[1])
            for request in requests:
                view.assign(request, other)


    class MovesFromATimer(Policy):
        """Two replicas; at t=8, a timer (mid-step), preempts each of GPU 0's decoding requests and assigns it to
        GPU 1, as the docs say: preempt it first."""
        name = "moves-from-a-timer"

        def setup(self, view):
            self.a = view.load(0, view.gpus[0])
            self.b = view.load(0, view.gpus[1])
            view.call_at(8.0, self.move)

        def route(self, request, view):
            return self.a

        def move(self, view):
            for request in list(self.a.running):
                view.preempt(self.a, request, "swap")
                view.assign(request, self.b)


    class MovesARunner(StaticPolicy):
        """Assigns a decoding request, never preempted, to the other replica."""
        name = "moves-a-runner"

        def on_step(self, instance, view):
            if instance.running:
                request = instance.running[0]
                other = next(i for i in view.instances_of(request.model) if i is not instance)
                view.assign(request, other)
''')

PROMPTS = [3000, 5000, 12000, 200, 800, 100, 15000, 50, 2000, 400]
OUTPUTS = [200, 150, 100, 300, 250, 400, 50, 300, 200, 100]


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):  # the defect ended in a corrupted queue
        yield


@pytest.fixture
def policies(tmp_path):
    path = tmp_path / "assign_policies.py"
    path.write_text(POLICIES)
    return path


def run(policy: str, mode: str = "fast"):
    """Ten requests in 1.2 s for two replicas of one model, one per GPU, loading from one disk at once."""
    scenario = parse_scenario(scenario_dict(
        models=[{"name": "qwen2.5-3b", "replicas": 2}], engine={"max_num_seqs": 8, "max_num_batched_tokens": 2048},
        cluster={"nodes": 1, "gpus_per_node": 2, "host_memory_gb": 64}), "test")
    arrivals = np.array([0.0, 0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 1.0, 1.2])
    chunks = [RequestChunk(arrivals, np.array(["qwen2.5-3b"] * 10, object), np.array(PROMPTS), np.array(OUTPUTS))]
    return simulate(scenario, policy=policy, chunks=chunks, mode=mode)


def test_a_preempted_request_assigned_elsewhere_moves_and_pays_only_its_own_pause(policies):
    result = run(f"{policies}:Moves")
    frame = result.requests.set_index("id").sort_index()
    assert list(frame["status"]) == ["completed"] * 10
    assert frame["preemptions"].sum() == 1
    events = result.events
    preempted = events[events["kind"] == "preempt_swap"].iloc[0]
    moved = frame.loc[preempted["request_id"]]
    loads = events[events["kind"] == "load"]
    other = loads[loads["gpu"] != preempted["gpu"]].iloc[0]
    assert moved["gpu"] == other["gpu"]  # it finished on the replica it was moved to
    other_ready_s = other["time_s"] + other["duration_s"]
    assert preempted["time_s"] < other_ready_s  # it moved into a replica still loading
    # It waited for the rest of that load: its reload loss is that wait, less the swap-out it overlapped.
    assert moved["lost_reload_s"] == pytest.approx(other_ready_s - preempted["time_s"] - preempted["duration_s"])
    assert moved["lost_kv_out_s"] == pytest.approx(preempted["duration_s"])
    swap_in = events[(events["kind"] == "swap_in") & (events["request_id"] == preempted["request_id"])].iloc[0]
    assert swap_in["gpu"] == other["gpu"] and swap_in["time_s"] == pytest.approx(other_ready_s)
    exact = run(f"{policies}:Moves", mode="exact").requests.set_index("id").sort_index()
    assert_same_times(frame, exact, label="moves")


def test_assigning_a_request_to_the_instance_it_waits_at_keeps_its_place(policies):
    staying = run(f"{policies}:StaysPut").requests.set_index("id").sort_index()
    static = run("static").requests.set_index("id").sort_index()
    assert_same_times(staying, static, label="stays-put")


def test_a_request_in_a_batch_cannot_be_assigned(policies):
    with pytest.raises(PolicyContractError) as stopped:
        run(f"{policies}:MovesARunner")
    message = str(stopped.value)
    assert message.startswith("policy 'moves-a-runner' (MovesARunner) broke the policy contract at t="), message
    assert "its assign was given request " in message and ", which is running on qwen2.5-3b" in message, message
    assert message.endswith("expected a pending, waiting or swapped request (preempt a running one first)"), message


def test_an_unload_beside_the_reload_of_a_copy_elsewhere_is_not_charged_twice(policies):
    """The request waits for the copy on GPU 1 while GPU 0's unload runs: the two overlap, and its reload and unload
    losses were charged in full (2.71 + 0.26 s against a 2.71 s wait); together they are the wait."""
    scenario = parse_scenario(scenario_dict(
        models=[{"name": "qwen2.5-3b"}], engine={"max_num_seqs": 4},
        cluster={"nodes": 2, "gpus_per_node": 1, "host_memory_gb": 64}), "test")
    chunks = [RequestChunk(np.array([0.0]), np.array(["qwen2.5-3b"], object), np.array([100]), np.array([2000]))]
    result = simulate(scenario, policy=f"{policies}:MigratesOnEvict", chunks=chunks)
    request = result.requests.iloc[0]
    assert request["status"] == "completed" and request["preemptions"] == 1
    events = result.events
    paused_at = events[events["kind"] == "preempt_recompute"]["time_s"].iloc[0]
    copy = events[(events["kind"] == "load") & (events["gpu"] == 1)].iloc[0]
    wait_s = copy["time_s"] + copy["duration_s"] - paused_at
    assert wait_s > 1.0
    assert request["lost_reload_s"] + request["lost_unload_s"] == pytest.approx(wait_s, rel=1e-9)


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_a_request_preempted_mid_step_and_assigned_moves_as_the_step_ends(policies, mode):
    """Was: the assign was refused (the request was still running: its preemption waits for the step's end)."""
    scenario = parse_scenario(scenario_dict(
        models=[{"name": "qwen2.5-3b"}], engine={"max_num_seqs": 4},
        cluster={"nodes": 1, "gpus_per_node": 2, "host_memory_gb": 64}), "test")
    arrivals = np.array([0.0, 0.5])
    chunks = [RequestChunk(arrivals, np.array(["qwen2.5-3b"] * 2, object), np.array([100, 200]), np.array([2000, 300]))]
    result = simulate(scenario, policy=f"{policies}:MovesFromATimer", chunks=chunks, mode=mode)
    frame = result.requests.set_index("id").sort_index()
    assert list(frame["status"]) == ["completed"] * 2 and list(frame["gpu"]) == [1, 1]
    assert list(frame["preemptions"]) == [1, 1]
    swaps = result.events[result.events["kind"] == "preempt_swap"]
    assert (swaps["gpu"] == 0).all() and (swaps["time_s"] > 8.0).all()  # at the end of the step running at t=8
