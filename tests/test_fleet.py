"""Elastic fleets: cold-start stage timing, scale-up and scale-down decisions, scale to zero, and cost, each
against values worked out by hand from the scenario's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import assert_same_times, wall_clock_limit


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):
        yield

MODEL = "llama-3-8b"
WEIGHT_GB = 16.060522496  # Llama-3-8B: 8,030,261,248 parameters (untied embeddings) x 2 bytes
# Stages of round length: weights fetched in 2 s and deserialised in 4 s (rates from the size above).
STAGES = {"provision_s": 40.0, "container_init_s": 5.0, "image_gb": 10.0, "registry_gb_per_s": 1.0,
          "runtime_start_s": 5.0, "weight_fetch_gb_per_s": WEIGHT_GB / 2, "deserialise_gb_per_s": WEIGHT_GB / 4,
          "gpu_transfer_s": 20.0, "warm_up_s": 6.0}
COLD_START_S = 40 + 5 + 10 + 5 + 2 + 4 + 20 + 6  # 92 s from the decision on a new node


def fleet_scenario(pool=None, autoscaler=None, cold_start=None, models=None, **extra):
    data = {
        "name": "fleet", "seed": 1, "profile": "h100-sxm",
        "cluster": {"pools": [pool or {"name": "h100", "nodes": 1, "min_nodes": 1, "max_nodes": 2, "gpus_per_node": 1,
                                       "price_per_gpu_hour": 3.6}]},
        "models": models or [{"name": MODEL}],
        "workload": {"generator": {"duration_s": 10, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {(models or [{"name": MODEL}])[0]["name"]: 1.0},
                                   "prompt_tokens": {"dist": "constant", "value": 100},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "engine": {"max_num_seqs": 2},
        "cold_start": {**STAGES, **(cold_start or {})},
        "autoscaler": autoscaler or {"name": "queue-depth", "interval_s": 10.0, "params": {"target": 4.0}},
        **extra,
    }
    return parse_scenario(data, "test")


def requests(times, prompt=100, output=2000, model=MODEL):
    times = np.asarray(times, float)
    n = len(times)
    return [RequestChunk(times, np.array([model] * n, object), np.full(n, prompt, np.int64), np.full(n, output, np.int64))]


def events_of(result, *kinds):
    events = result.events
    return events[events["kind"].isin(kinds)].reset_index(drop=True)


def spike():
    """One request at t=1, then 50 at t=95: two run, 48 queue on the one instance (for minutes)."""
    return requests([1.0] + [95.0] * 50)


def test_a_new_instance_is_ready_exactly_the_sum_of_its_stages_after_the_decision():
    result = simulate(fleet_scenario(), chunks=spike())
    ups = events_of(result, "scale_up")
    assert ups.loc[0, "time_s"] == 100.0  # the first decision after the spike at t=95
    assert ups.loc[0, "detail"].startswith("replicas 1->2")  # 48 queued / target 4 = 12, capped at the 2 GPUs
    ready = events_of(result, "instance_ready")
    assert len(ready) == 1 and ready.loc[0, "time_s"] == pytest.approx(100.0 + COLD_START_S, abs=1e-9)
    stages = events_of(result, "cold_start")
    expected = [("provision", 100, 40), ("container_init", 140, 5), ("image_pull", 145, 10), ("runtime_start", 155, 5),
                ("weight_fetch", 160, 2), ("deserialise", 162, 4), ("gpu_transfer", 166, 20), ("warm_up", 186, 6)]
    got = list(zip(stages["detail"], stages["time_s"], stages["duration_s"]))
    assert [name for name, _, _ in got] == [name for name, _, _ in expected]
    for (_, at, seconds), (_, want_at, want_s) in zip(got, expected):
        assert at == pytest.approx(want_at, abs=1e-6) and seconds == pytest.approx(want_s, abs=1e-6)
    # Requests reach the new GPU only once it is ready: the spike's queue pays the whole cold start.
    on_new = result.requests[result.requests["gpu"] == 1]
    assert len(on_new) > 0 and on_new["first_scheduled_s"].min() == pytest.approx(100.0 + COLD_START_S, abs=1e-9)


@pytest.mark.parametrize("levers, seconds", [
    ({"lazy_pull": True, "lazy_pull_fraction": 0.1}, COLD_START_S - 9),  # 1 s of the 10 s pull before the container
    ({"weight_streaming": True}, COLD_START_S - 6),  # fetch 2, deserialise 4, transfer 20 at once: 20, not 26
    ({"lazy_pull": True, "lazy_pull_fraction": 0.1, "weight_streaming": True}, COLD_START_S - 15),
])
def test_lazy_pull_and_weight_streaming_cut_the_stages_they_overlap(levers, seconds):
    result = simulate(fleet_scenario(cold_start=levers), chunks=spike())
    assert events_of(result, "instance_ready").loc[0, "time_s"] == pytest.approx(100.0 + seconds, abs=1e-9)


def test_scale_down_waits_for_the_window_and_an_empty_node_is_released_after_its_idle_time():
    autoscaler = {"name": "queue-depth", "interval_s": 10.0, "params": {"target": 4.0}, "scale_down_window_s": 60.0,
                  "node_idle_s": 30.0}
    result = simulate(fleet_scenario(autoscaler=autoscaler), chunks=requests([1.0] + [95.0] * 50 + [600.0], output=200))
    downs = events_of(result, "scale_down")
    # The window holds the 2 replicas asked for while the queue was long for 60 s after the last such ask.
    asks = events_of(result, "scale_up")
    assert downs.loc[0, "time_s"] >= asks["time_s"].max() + 60
    released = events_of(result, "node_release")
    assert len(released) == 1
    unload = events_of(result, "unload").loc[0, "time_s"]
    # Released at the first decision at least node_idle_s after the decision that found it empty.
    empty_seen = np.ceil((unload + 1e-9) / 10.0) * 10.0
    assert released.loc[0, "time_s"] == pytest.approx(empty_seen + 30.0, abs=1e-9)


def test_scale_to_zero_after_the_idle_timeout_and_back_on_the_next_request():
    pool = {"name": "h100", "nodes": 1, "min_nodes": 0, "max_nodes": 1, "gpus_per_node": 1}
    autoscaler = {"name": "queue-depth", "interval_s": 10.0, "min_replicas": 0, "scale_to_zero_idle_s": 50.0,
                  "node_idle_s": 1000.0}
    result = simulate(fleet_scenario(pool=pool, autoscaler=autoscaler), chunks=requests([1.0, 401.0], output=20))
    downs = events_of(result, "scale_down")
    first_done = result.requests["finish_s"].min()
    # Idle from the first decision after the request finished; zero 50 s later.
    idle_from = np.ceil(first_done / 10.0) * 10.0
    assert downs.loc[0, "time_s"] == pytest.approx(idle_from + 50.0) and "idle" in downs.loc[0, "detail"]
    ups = events_of(result, "scale_up")
    assert ups.loc[0, "time_s"] == 410.0 and ups.loc[0, "detail"].startswith("replicas 0->1")
    # The node kept its image and the weights on disk: the second start pulls and fetches nothing.
    stages = events_of(result, "cold_start").set_index("detail")
    assert stages.loc["image_pull", "duration_s"] == 0.0 and stages.loc["weight_fetch", "duration_s"] == 0.0
    second = result.requests.sort_values("arrival_s").iloc[1]
    assert second["first_scheduled_s"] == pytest.approx(410.0 + 5 + 5 + 4 + 20 + 6, abs=1e-9)
    assert set(result.requests["status"]) == {"completed"}


def test_cost_is_gpu_hours_billed_times_the_price():
    result = simulate(fleet_scenario(), chunks=spike())
    fleet = result.summary["fleet"]
    end_s = result.summary["simulated_seconds"]
    provisioned_at = events_of(result, "cold_start").loc[0, "time_s"]
    gpu_hours = (end_s + (end_s - provisioned_at)) / 3600  # node 0 from t=0, node 1 from its provisioning
    assert fleet["gpu_hours"] == pytest.approx(gpu_hours, rel=1e-12)
    assert fleet["cost_usd"] == pytest.approx(gpu_hours * 3.6, rel=1e-12)
    completed = result.summary["requests_completed"]
    assert fleet["cost_per_1k_requests_usd"] == pytest.approx(gpu_hours * 3.6 / completed * 1000, rel=1e-12)
    assert fleet["cost_per_million_output_tokens_usd"] == pytest.approx(gpu_hours * 3.6 / (completed * 2000) * 1e6,
                                                                        rel=1e-12)


def test_a_fixed_cluster_costs_its_gpus_for_the_whole_run():
    data = {"name": "fixed", "profile": "paper-rtx5000", "cluster": {"nodes": 2, "gpus_per_node": 2},
            "models": [{"name": "qwen2.5-3b"}],
            "workload": {"generator": {"duration_s": 30, "arrivals": {"process": "poisson", "rate_per_s": 2.0},
                                       "mix": {"qwen2.5-3b": 1.0}, "prompt_tokens": {"dist": "constant", "value": 64},
                                       "output_tokens": {"dist": "constant", "value": 16}}}}
    result = simulate(parse_scenario(data, "test"))
    fleet = result.summary["fleet"]
    assert fleet["autoscaler"] == "none" and fleet["pools"]["default"]["price_per_gpu_hour"] == 0.80
    assert fleet["cost_usd"] == pytest.approx(4 * result.summary["simulated_seconds"] / 3600 * 0.80, rel=1e-12)


def test_same_seed_same_fleet_and_fast_equals_exact():
    runs = [simulate(fleet_scenario(), chunks=spike(), mode=mode) for mode in ("fast", "fast", "exact")]
    first, again, exact = runs
    assert first.events.equals(again.events)
    assert first.requests[["id", "status", "gpu"]].equals(exact.requests[["id", "status", "gpu"]])
    assert_same_times(first.requests, exact.requests, ("first_scheduled_s", "first_token_s", "finish_s"))
    assert first.summary["fleet"]["cold_starts"] == exact.summary["fleet"]["cold_starts"] == 1
    assert first.summary["fleet"]["gpu_hours"] == pytest.approx(exact.summary["fleet"]["gpu_hours"], rel=1e-9)


@pytest.mark.parametrize("queues, receiving, expected", [
    ([(8000, 8000)] * 16, 0, [471] * 16),  # level 7,529: 16 x 471 = 7,536 queued at the new instance
    ([(10, 10), (3, 3)], 0, [5, 0]),  # 5 and 3 stay, 5 move: none longer than the new queue by more than one
    ([(10, 2), (9, 9)], 0, [2, 3]),  # the first may move only 2; the second gives 3 (queues 8, 6 and 5)
    ([(5, 5)], 0, [2]),
    ([(1, 1)], 0, [0]),
    ([(6, 6)], 4, [1]),
])
def test_a_new_instance_takes_queued_requests_until_the_queues_are_even(queues, receiving, expected):
    from sim.fleet.rebalance import _shares

    assert _shares(queues, receiving) == expected


class _Retired:
    """An emptied instance the controller retires; hashed against its age, so a set iterates it youngest first."""

    def __init__(self, uid: int):
        self.uid, self.status, self.num_requests = uid, "ready", 0

    def __hash__(self) -> int:
        return -self.uid


def test_instances_emptied_together_unload_oldest_first_whatever_the_set_order():
    from types import SimpleNamespace

    from sim.fleet.controller import FleetController

    unloaded: list[int] = []
    retired = [_Retired(uid) for uid in (3, 1, 4, 2)]
    engine = SimpleNamespace(retiring=set(retired), unload=lambda instance, mode: unloaded.append(instance.uid))
    assert [i.uid for i in engine.retiring] != [1, 2, 3, 4]  # the set alone would unload them out of age order
    controller = object.__new__(FleetController)
    controller.engine = engine
    controller._unload_emptied()
    assert unloaded == [1, 2, 3, 4] and not engine.retiring


def test_a_model_waiting_for_its_first_replica_gets_room_when_another_fills_the_pools():
    """Found by an input hunt: from zero nodes, queue-depth gave the first model a replica on each of the pool's
    GPUs and the second model's every scale-up was blocked (all its requests dropped as never placed). Where the
    pools are full, a model now leaves one instance's room for each other model waiting for its first replica."""
    pool = {"name": "h100", "nodes": 0, "min_nodes": 0, "max_nodes": 2, "gpus_per_node": 2, "price_per_gpu_hour": 3.6}
    models = [{"name": "qwen2.5-3b"}, {"name": "llama-3-8b"}]
    scenario = fleet_scenario(pool=pool, models=models,
                              autoscaler={"name": "queue-depth", "interval_s": 10.0, "params": {"target": 1.0}})
    times = np.repeat(np.arange(1.0, 41.0), 2)  # 40 of each model, together: each wants every GPU
    chunk = [RequestChunk(times, np.array(["qwen2.5-3b", "llama-3-8b"] * 40, object), np.full(80, 100, np.int64),
                          np.full(80, 200, np.int64))]
    result = simulate(scenario, chunks=chunk)
    frame = result.requests
    assert set(frame["status"]) == {"completed"}, frame["drop_reason"].value_counts()
    first_up = events_of(result, "scale_up").groupby("model")["detail"].first()
    assert "room left for the first replica of 1 other model" in first_up["qwen2.5-3b"]
