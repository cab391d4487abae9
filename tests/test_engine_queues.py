"""The engine's own queues, written for speed, keep the order and the values of what they replaced.

The finish order of a batch (a sorted list, formerly a heap of (iteration, id, request) tuples), the
recorder's pending rows (packed bytes moved into typed arrays in blocks, formerly appended value by value),
and the GPU loops' step ends (event-queue entries, formerly a SimPy event each) that an unloading
instance's drain still waits on.
"""

from __future__ import annotations

import heapq
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.kv import FinishQueue
from sim.engine.recorder import PENDING_ROWS, Recorder
from sim.engine.request import Request
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk
from tests.conftest import scenario_dict


def _running(rid: int, join_iter: int, output: int, generated: int) -> Request:
    request = Request(rid, 0, 0.0, 10, output, output)
    request.join_iter, request.gen_at_join = join_iter, generated
    return request


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("push", "pop", "remove")), st.integers(0, 30), st.integers(1, 12),
                          st.integers(0, 5)), max_size=80))
def test_the_finish_queue_pops_by_finish_iteration_then_id_as_a_heap_of_tuples_would(operations):
    queue, heap, live, next_id = FinishQueue(), [], [], 0
    for action, join_iter, output, pick in operations:
        if action == "push":
            # Ids arrive out of order, and finish iterations tie often.
            rid = (next_id * 7919) % 1000
            next_id += 1
            request = _running(rid, join_iter, output + 1, 1)
            queue.push(request)
            heapq.heappush(heap, (join_iter + output, rid, id(request), request))
            live.append(request)
        elif action == "pop" and heap:
            assert queue.first() == heap[0][0]
            expected = heapq.heappop(heap)[3]
            assert queue.pop() is expected
            live.remove(expected)
        elif action == "remove" and live:
            gone = live.pop(pick % len(live))
            queue.remove(gone)
            heap = [entry for entry in heap if entry[3] is not gone]
            heapq.heapify(heap)
    assert [request.id for request in reversed(queue.requests)] == [entry[1] for entry in sorted(heap)]


def test_the_finish_queue_refuses_to_remove_a_request_it_does_not_hold():
    queue = FinishQueue()
    queue.push(_running(1, 0, 5, 1))
    with pytest.raises(ValueError, match="not in the batch"):
        queue.remove(_running(2, 0, 5, 1))


def test_recorded_rows_survive_the_pending_buffer_and_widen_past_32_bits_only_when_a_value_needs_it():
    recorder = Recorder(["m"])
    count = 2 * PENDING_ROWS + 5  # two full blocks and a partial one
    for rid in range(count):
        request = Request(rid, 0, rid * 0.5, 100 + rid, 7, 7)
        request.finish_s, request.generated = rid + 1.0, 7
        recorder.request(request, "not_placed" if rid % 3 == 0 else "")
    columns = recorder.request_columns()
    assert columns["id"].tolist() == list(range(count)) and columns["id"].dtype == np.int32
    assert columns["arrival_s"].tolist() == [rid * 0.5 for rid in range(count)]
    assert columns["prompt_tokens"].tolist() == [100 + rid for rid in range(count)]
    assert columns["drop_reason"].tolist() == [4 if rid % 3 == 0 else 0 for rid in range(count)]
    assert columns["prompt_tokens"].dtype == np.int32
    del columns  # views of the arrays, which cannot grow while they exist
    huge = Request(2**40, 0, 1.0, 2**33, 7, 7)
    recorder.request(huge)
    columns = recorder.request_columns()
    assert columns["id"].dtype == np.int64 and columns["id"][-1] == 2**40 and columns["id"][0] == 0
    assert columns["prompt_tokens"].dtype == np.int64 and columns["prompt_tokens"][-1] == 2**33
    assert columns["model"].dtype == np.int32


UNLOADER = textwrap.dedent("""
    from sim.policies.static import StaticPolicy


    class UnloadMidWindow(StaticPolicy):
        \"\"\"Unloads the only instance while it decodes: the drain waits for the GPU's running step to end.\"\"\"

        name = "unload-mid-window"

        def setup(self, view):
            super().setup(view)
            view.call_at(9.5, lambda fired: fired.unload(fired.instances()[0], mode="swap"))
""")


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_an_unload_waits_for_the_step_running_and_both_modes_see_it_end_at_the_same_boundary(tmp_path, mode):
    path = tmp_path / "unloader.py"
    path.write_text(UNLOADER)
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}],
                                            cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64}), "test")
    chunks = [RequestChunk(np.array([0.0, 0.0]), np.array(["qwen2.5-3b"] * 2, object), np.array([200, 300]),
                           np.array([3000, 3000]))]
    results = {m: simulate(scenario, policy=f"{path}:UnloadMidWindow", mode=m, chunks=chunks) for m in (mode, "exact")}
    events = {m: r.events for m, r in results.items()}
    swaps = {m: e.loc[e["kind"].eq("preempt_swap"), "time_s"].tolist() for m, e in events.items()}
    # The same boundary: times equal up to the last bits of long sums, as everywhere fast meets exact.
    assert len(swaps[mode]) == 2 and swaps[mode] == pytest.approx(swaps["exact"], rel=1e-9, abs=0)
    assert 9.5 <= swaps[mode][0] < 9.5 + 0.1  # the first iteration boundary after the unload, not a later one
    assert events[mode].loc[events[mode]["kind"].eq("unload"), "time_s"].tolist() == [swaps[mode][0]]


def test_the_engines_count_of_pending_requests_is_the_size_of_its_pending_queues(tmp_path):
    """``ClusterView.has_pending`` reads a count the engine keeps instead of scanning every model's queue: checked
    at every arrival and finish of a run whose two models cannot share its one GPU (so requests wait unplaced)."""
    seen = tmp_path / "seen.txt"
    policy = tmp_path / "counting.py"
    policy.write_text(textwrap.dedent(f"""
        from sim.policies.swap_aware import SwapAwarePolicy

        class Counting(SwapAwarePolicy):
            def check(self, view):
                engine = view._engine
                assert engine.pending_total == sum(len(queue) for queue in engine.pending)
                assert view.has_pending() == (engine.pending_total > 0)
                with open({str(seen)!r}, "a") as log:
                    log.write(f"{{engine.pending_total}}\\n")

            def on_arrival(self, request, view):
                super().on_arrival(request, view)
                self.check(view)

            def on_finish(self, request, instance, view):
                super().on_finish(request, instance, view)
                self.check(view)
    """))
    data = scenario_dict(cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64},
                         models=[{"name": "qwen2.5-14b"}, {"name": "qwen3-8b"}])
    result = simulate(parse_scenario(data, "pending-count"), policy=f"{policy}:Counting")
    counts = [int(line) for line in seen.read_text().split()]
    assert result.summary["requests_total"] > 0 and len(counts) > 100 and max(counts) > 0
