"""The controller's room rule (docs/fleet.md, "Bounds") within a tick and across ticks, and cold starts' GPU
transfers queueing on their node's disk, each against an outcome worked out by hand from the scenario's numbers.

Room rule: while a model has requests waiting and no replica, every other model sharing its pools takes at most
what the pools hold beside the other models' instances and one instance of each such model (at least one), and is
scaled down to that at once, past the stabilisation window, if it holds more. Found by an adversarial hunt: the
models waiting were counted once a tick, before any scaled up, and each model's room was the pools' whole
capacity, so a model decided earlier in the tick took the last GPUs and the one decided last waited minutes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.engine.transfers import Node
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import wall_clock_limit

SMALL, MID, LARGE = "qwen2.5-3b", "llama-3-8b", "qwen2.5-7b"
# Stages of round length on a node that is up (the image and every model's weights already there): the start
# takes container 5 + runtime 5 + deserialise (weight bytes / 8 GB/s: under 2 s) + transfer 20 + warm-up 6 s.
STAGES = {"provision_s": 40.0, "container_init_s": 5.0, "image_gb": 10.0, "registry_gb_per_s": 1.0,
          "runtime_start_s": 5.0, "weight_fetch_gb_per_s": 8.0, "deserialise_gb_per_s": 8.0,
          "gpu_transfer_s": 20.0, "warm_up_s": 6.0}


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):
        yield


QUICK = {"gpu_transfer_s": 2.0}  # the room tests' starts: four transfers on one node queue 8 s in all


def scenario(pool, models, autoscaler, cold_start=None):
    return parse_scenario({
        "name": "room", "seed": 1, "profile": "h100-sxm",
        "cluster": {"pools": [{"name": "h100", "host_memory_gb": 512, **pool}]},
        "models": models,
        "workload": {"generator": {"duration_s": 10, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {models[0]["name"]: 1.0},
                                   "prompt_tokens": {"dist": "constant", "value": 100},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 4096},
        "cold_start": {**STAGES, **(cold_start or {})},
        "autoscaler": {"name": "queue-depth", "interval_s": 15.0, **autoscaler},
    }, "test")


def arrivals(*groups: tuple[str, float, int], prompt: int = 100, output: int = 10) -> list[RequestChunk]:
    """``(model, time, count)`` groups as one chunk in arrival order."""
    rows = sorted((t, model) for model, t, count in groups for _ in range(count))
    times = np.array([t for t, _ in rows])
    names = np.array([model for _, model in rows], object)
    n = len(rows)
    return [RequestChunk(times, names, np.full(n, prompt, np.int64), np.full(n, output, np.int64))]


def events_at(result, time_s: float, *kinds: str) -> pd.DataFrame:
    events = result.events
    return events[events["kind"].isin(kinds) & np.isclose(events["time_s"], time_s)].reset_index(drop=True)


def started_at(result, time_s: float) -> dict[int, str]:
    """GPU -> the model whose cold start began there at ``time_s`` (its first stage on a node that is up)."""
    starts = events_at(result, time_s, "cold_start")
    starts = starts[starts["detail"] == "container_init"]
    return dict(zip(starts["gpu"], starts["model"]))


def ups(result, time_s: float) -> dict[str, str]:
    frame = events_at(result, time_s, "scale_up")
    return dict(zip(frame["model"], frame["detail"]))


THREE = [{"name": SMALL}, {"name": MID}, {"name": LARGE}]


def test_a_burst_for_three_models_at_zero_gives_each_a_gpu_in_the_same_tick():
    """The hunt's case: one fixed node of 4 GPUs, three models scaled to zero in a quiet spell, then 20 requests
    for each at t=1000.1. At the tick at 1005 each asks for ceil(20 / 4) = 5, capped at the 4 the pool holds.
    In model order: qwen2.5-3b leaves one GPU for each of the two others waiting: 4 - 2 = 2 (GPUs 0 and 1);
    llama-3-8b sees qwen2.5-3b's 2 GPUs taken and one left for qwen2.5-7b: 4 - 2 - 1 = 1 (GPU 2); qwen2.5-7b,
    the last waiting, takes what is free: GPU 3, and its other 3 are blocked. Before the fix llama-3-8b took 2,
    and qwen2.5-7b nothing until qwen2.5-3b scaled to zero again at t=1170."""
    pool = {"nodes": 1, "min_nodes": 1, "max_nodes": 1, "gpus_per_node": 4}
    autoscaler = {"min_replicas": 0, "scale_down_window_s": 60.0,
                  "scale_to_zero_idle_s": {SMALL: 100.0, MID: 100.0, LARGE: 100.0}}
    chunks = arrivals(*[(m["name"], 1.0, 1) for m in THREE], *[(m["name"], 1000.1, 20) for m in THREE])
    result = simulate(scenario(pool, THREE, autoscaler, QUICK), chunks=chunks)
    zeroed = events_at(result, 120.0, "scale_down")
    assert sorted(zeroed["model"]) == sorted([SMALL, MID, LARGE])  # idle 105 s at t=120: all at zero
    asked = ups(result, 1005.0)
    assert asked[SMALL].startswith("replicas 0->2") and "room left for the first replica of 2 other models" in asked[SMALL]
    assert asked[MID].startswith("replicas 0->1") and "room left for the first replica of 1 other model" in asked[MID]
    assert asked[LARGE].startswith("replicas 0->4") and "room left" not in asked[LARGE]
    assert started_at(result, 1005.0) == {0: SMALL, 1: SMALL, 2: MID, 3: LARGE}
    assert list(events_at(result, 1005.0, "scale_blocked")["model"]) == [LARGE]
    # Every model's first request after the burst waits for one cold start, not for another model's to end.
    ready = result.events[result.events["kind"] == "instance_ready"].groupby("model")["time_s"].min()
    assert all(1005.0 < ready[m["name"]] < 1005.0 + 60.0 for m in THREE), ready
    assert set(result.requests["status"]) == {"completed"}
    # Deterministic: the same run again decides the same, event for event.
    again = simulate(scenario(pool, THREE, autoscaler, QUICK), chunks=chunks)
    pd.testing.assert_frame_equal(again.events, result.events)


def test_models_waiting_on_a_node_being_provisioned_share_it_in_the_same_tick():
    """From no node (min_nodes 0): 20 requests for each of three models at t=1. At t=15 qwen2.5-3b books 2 of
    the new node's 4 GPUs (one left for each other model), llama-3-8b 1 (4 - 2 booked - 1 left), qwen2.5-7b 1 and
    is blocked for the rest; the node is up 40 s later and the four start there in the order booked. Before the
    fix llama-3-8b booked 2 and qwen2.5-7b none."""
    pool = {"nodes": 0, "min_nodes": 0, "max_nodes": 1, "gpus_per_node": 4}
    result = simulate(scenario(pool, THREE, {"min_replicas": 0}, QUICK), chunks=arrivals(*[(m["name"], 1.0, 20) for m in THREE]))
    asked = ups(result, 15.0)
    assert asked[SMALL].startswith("replicas 0->2") and asked[MID].startswith("replicas 0->1")
    assert asked[LARGE].startswith("replicas 0->4")
    assert list(events_at(result, 15.0, "scale_blocked")["model"]) == [LARGE]
    assert started_at(result, 55.0) == {0: SMALL, 1: SMALL, 2: MID, 3: LARGE}
    assert set(result.requests["status"]) == {"completed"}


def test_models_that_together_hold_the_room_give_it_up_at_once_past_the_window():
    """Across ticks: qwen2.5-3b pinned to GPUs 0-1 and llama-3-8b to GPUs 2-3 of a fixed 4-GPU node, qwen2.5-7b
    on none; 3 requests for qwen2.5-7b at t=1. At t=15 the others, idle, want 1 each (min_replicas) but the
    300 s window would hold them at 2. qwen2.5-3b, decided first, may have 4 - 2 (llama-3-8b) - 1 (left for
    qwen2.5-7b) = 1: scaled down 2->1 at once, its newest instance (GPU 1) retired and unloaded; llama-3-8b may
    then have 4 - 1 - 1 = 2 and keeps them (the window); qwen2.5-7b asks for 1, blocked while GPU 1 unloads,
    and starts there at t=30. Before the fix each of the two counted the pool's whole 4 less 1 and kept its 2
    until the window ran out, at t=300."""
    pool = {"nodes": 1, "min_nodes": 1, "max_nodes": 1, "gpus_per_node": 4}
    models = [{"name": SMALL, "gpus": [0, 1]}, {"name": MID, "gpus": [2, 3]}, {"name": LARGE}]
    result = simulate(scenario(pool, models, {}, QUICK), chunks=arrivals((LARGE, 1.0, 3)))
    downs = result.events[result.events["kind"] == "scale_down"]
    first = downs.iloc[0]
    assert (first["time_s"], first["model"]) == (15.0, SMALL)
    assert first["detail"] == ("replicas 2->1: queue_depth 0.0 per replica (target 4); "
                               "room left for the first replica of 1 other model")
    unloads = events_at(result, 15.0, "unload")
    assert list(zip(unloads["gpu"], unloads["model"])) == [(1, SMALL)]
    assert not (downs[downs["model"] == MID]["time_s"] < 300.0).any()  # llama-3-8b: held by the window as before
    assert list(events_at(result, 15.0, "scale_blocked")["model"]) == [LARGE]
    assert ups(result, 30.0) == {LARGE: "replicas 0->1: queue_depth 3.0 per replica (target 4)"}
    assert started_at(result, 30.0) == {1: LARGE}
    assert set(result.requests["status"]) == {"completed"}


# -- cold starts' GPU transfers on the node's disk ------------------------------------------------------------

def test_two_cold_starts_on_one_node_transfer_one_after_the_other():
    """llama-3-8b pinned to GPU 0 of a fixed 3-GPU node (the image and its weights already there); 41 requests by
    t=5 leave 33 queued at t=15: ceil(33 / 4) = 9, capped at 3, so GPUs 1 and 2 start together. Each: container
    5 + runtime 5 + deserialise 16.06 GB / 8 GB/s = 2.0 s, so both transfers are due at t=27.0; they hold the
    node's disk one after the other, as a policy's loads do: GPU 1 from 27.0, GPU 2 from 47.0 (not both at 27.0
    at full speed, as before), ready after the 6 s warm-up at 53.0 and 73.0."""
    pool = {"nodes": 1, "min_nodes": 1, "max_nodes": 1, "gpus_per_node": 3}
    result = simulate(scenario(pool, [{"name": MID, "gpus": [0]}], {}),
                      chunks=arrivals((MID, 1.0, 1), (MID, 5.0, 40), output=2000))
    assert ups(result, 15.0)[MID].startswith("replicas 1->3")
    events = result.events
    transfers = events[(events["kind"] == "cold_start") & (events["detail"] == "gpu_transfer")]
    deserialise = events[(events["kind"] == "cold_start") & (events["detail"] == "deserialise")]
    due = 15.0 + 5.0 + 5.0 + deserialise["duration_s"].iloc[0]
    assert due == pytest.approx(27.0, abs=0.01)
    starts = dict(zip(transfers["gpu"], transfers["time_s"]))
    assert starts[1] == pytest.approx(due, abs=1e-9) and starts[2] == pytest.approx(due + 20.0, abs=1e-9)
    assert list(transfers["duration_s"]) == [20.0, 20.0]
    ready = dict(zip(*[events[events["kind"] == "instance_ready"][c] for c in ("gpu", "time_s")]))
    assert ready[1] == pytest.approx(due + 20.0 + 6.0, abs=1e-9)
    assert ready[2] == pytest.approx(due + 40.0 + 6.0, abs=1e-9)


def test_with_weight_streaming_the_queued_transfer_hides_behind_the_slower_stages():
    """weight_streaming runs fetch, deserialisation and transfer at once, the three as long as the slowest.
    With a 2 s transfer against a deserialisation of ~2 s at 8 GB/s, the second start's transfer waits 2 s for
    the first's: 4 s from the start of streaming, which is now the slowest; ready 2 s after the first."""
    pool = {"nodes": 1, "min_nodes": 1, "max_nodes": 1, "gpus_per_node": 3}
    cold = {"weight_streaming": True, "gpu_transfer_s": 2.0}
    result = simulate(scenario(pool, [{"name": MID, "gpus": [0]}], {}, cold),
                      chunks=arrivals((MID, 1.0, 1), (MID, 5.0, 40), output=2000))
    events = result.events
    deserialise_s = events[(events["kind"] == "cold_start") & (events["detail"] == "deserialise")]["duration_s"].iloc[0]
    assert deserialise_s < 4.0
    streaming = 15.0 + 5.0 + 5.0
    ready = dict(zip(*[events[events["kind"] == "instance_ready"][c] for c in ("gpu", "time_s")]))
    assert ready[1] == pytest.approx(streaming + max(deserialise_s, 2.0) + 6.0, abs=1e-9)
    assert ready[2] == pytest.approx(streaming + 4.0 + 6.0, abs=1e-9)


def test_the_disk_timeline_fills_a_free_stretch_and_never_pushes_back_a_booked_transfer():
    from sim.fleet.coldstart import DiskTimeline, TransferBooking

    node = Node(0, 0)
    node.transfer(0.0, 3.0, "disk")  # a policy's load at t=0: the disk is the node's until 3 s
    disks = DiskTimeline()

    def start(due_s: float, seconds: float, uid: int, now: float = 1.0) -> float:
        booking = TransferBooking(disks, [(node, 1.0)], now)
        wait_s, held_s = booking.plan(due_s, seconds)
        booking.book(uid)
        assert held_s == seconds
        return due_s + wait_s

    assert start(2.0, 5.0, 1) == 3.0  # behind the load: 3-8
    assert start(100.0, 20.0, 2) == 100.0  # booked ahead: 100-120
    assert node.free_at["disk"] == 120.0  # the node's timeline ends where the last booking does
    assert start(50.0, 10.0, 3) == 50.0  # due before a transfer booked earlier, and fits before it: 50-60
    assert start(95.0, 10.0, 4) == 120.0  # does not fit before 100: after it (never pushes it back)
    assert node.free_at["disk"] == 130.0
    disks.cancel(3, now=10.0)  # not begun, not last: its stretch is free again
    assert start(52.0, 5.0, 5, now=10.0) == 52.0
    disks.cancel(4, now=10.0)  # the last on the node's timeline: that cannot be taken back
    node.transfer(20.0, 1.0, "disk")  # a policy's load at t=20 queues behind everything booked: 130-131
    assert start(125.0, 1.0, 6, now=20.0) == 131.0
    # A transfer spread over two nodes takes each node's share, at once.
    other = Node(1, 0)
    booking = TransferBooking(disks, [(node, 0.5), (other, 0.5)], 20.0)
    assert booking.plan(60.0, 8.0) == (0.0, 4.0)
