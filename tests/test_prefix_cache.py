"""Prefix caching: hits, sharing, reference counts and eviction order, worked out by hand.

As vLLM v1's automatic prefix caching: a full KV block is found again by the prompt up to its end; a request
reuses the longest cached run at the start of its prompt (never its last token) and prefills the rest; a
block nobody holds stays cached until its memory is needed, the one released longest ago going first.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from sim import simulation
from sim.engine.engine import Engine
from sim.engine.prefix import NO_LIMIT, PrefixCache, PrefixPath, prefix_path
from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk
from tests.conftest import assert_paged_blocks, kv_room_hardware, path_blocks, prefix_cache_blocks, scenario_dict

MODEL, BLOCK, ID_TOKENS, BUDGET, SEQS = "qwen2.5-3b", 16, 64, 512, 8


def run(rows, room_blocks=None, caching=True, mode="exact"):
    """Simulate ``(arrival_s, prompt, output, prefix_ids)`` rows on one GPU with ``room_blocks`` of KV room,
    checking after every step that blocks, shared ones and idle cached ones add up and fit."""
    scenario = parse_scenario(scenario_dict(
        cluster={"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 24}, models=[{"name": MODEL}],
        engine={"block_size": BLOCK, "max_num_batched_tokens": BUDGET, "max_num_seqs": SEQS,
                "gpu_memory_utilization": 1.0, "prefix_caching": caching}), "test")
    scenario.workload.prefix_block_tokens = ID_TOKENS
    sized = kv_room_hardware(MODEL, BLOCK, BUDGET, SEQS, room_blocks)

    after_step = Engine.after_step

    def checked(engine, instance):
        gpu = instance.gpu
        assert gpu.used_bytes() + gpu.idle_cache_bytes() <= gpu.capacity_bytes
        assert_paged_blocks(instance)
        after_step(engine, instance)

    arrivals, prompts, outputs, ids = zip(*rows)
    chunk = RequestChunk(np.array(arrivals, float), np.array([MODEL] * len(rows), object), np.array(prompts, np.int64),
                         np.array(outputs, np.int64), prefix_ids=np.array([tuple(i) for i in ids] + [None], object)[:-1])
    with mock.patch.object(simulation, "build_hardware", sized), mock.patch.object(Engine, "after_step", checked):
        return simulation.simulate(scenario, mode=mode, chunks=[chunk])


def test_a_path_has_a_segment_per_id_its_blocks_end_in():
    a = prefix_path((1, 2, 3), 200, ID_TOKENS, BLOCK)
    assert a.blocks == 12 and a.ends == [4, 8, 12]  # 3 ids x 64 tokens = 192 tokens = 12 blocks of 16
    b = prefix_path((1, 2, 9), 300, ID_TOKENS, BLOCK)
    assert a.keys[:2] == b.keys[:2] and a.keys[2] != b.keys[2]  # blocks 8-11 (tokens 128-191) lie in the third id
    assert prefix_path((1, 2, 3), 100, ID_TOKENS, BLOCK).ends == [4, 6]  # only full blocks of the prompt
    # A coarser engine block spans several ids: its key depends on all of them, and the ids before have none.
    assert prefix_path((1, 2), 128, 64, 128).ends == [1]
    assert prefix_path((1, 2), 128, 64, 128).keys != prefix_path((1, 3), 128, 64, 128).keys
    # Ids that are not a whole number of blocks: block k belongs to the id holding its last token.
    assert prefix_path((1, 2, 3, 4), 400, 40, 16).ends == [2, 5, 7, 10]


def test_cache_counts_holders_and_evicts_the_longest_idle_tail_first():
    cache = PrefixCache()
    path = PrefixPath([10, 20], [2, 3])  # blocks 0-1 in one segment, block 2 in the next
    blocks = path_blocks(path, 3)
    assert cache.insert_run(path, 0, 3) == 3
    assert cache.insert_run(path, 1, 2) == 1  # block 1 is cached already: nothing new
    cache.acquire(path, 2)  # a second request shares the first two
    held, idle = prefix_cache_blocks(cache)
    assert held == {blocks[0]: 2, blocks[1]: 2, blocks[2]: 1} and not idle
    assert cache.release(path, 3, released_seq=1) == 1  # only block 2 has nobody left
    assert prefix_cache_blocks(cache)[1] == [(blocks[2], 1)]
    assert cache.match_idle(path, 9) == (3, 1)  # blocks 0 and 1 still held
    assert cache.release(path, 2, released_seq=2) == 2
    # The prompt's end goes idle before its start.
    assert prefix_cache_blocks(cache)[1] == [(blocks[2], 1), (blocks[1], 2), (blocks[0], 2)]
    assert cache.match(path, limit=3) == 3 and cache.match_idle(path, 3) == (3, 3)
    assert cache.match_idle(path, 2) == (2, 2) and cache.oldest_idle_seq() == 1
    assert cache.evict(1, before_seq=1) == 0  # nothing was released before the first release
    assert cache.evict(2, NO_LIMIT) == 2
    assert len(cache) == 1 and cache.match(path, limit=2) == 1
    assert cache.match_idle(path, 2) == (1, 1)
    cache.acquire(path, 1)
    assert cache.idle_blocks == 0 and prefix_cache_blocks(cache)[0] == {blocks[0]: 1}


def test_a_filled_run_is_cached_unless_another_request_cached_it_first():
    cache = PrefixCache()
    path = PrefixPath([1, 2], [4, 8])
    assert cache.insert_run(path, 0, 2) == 2  # A fills blocks 0-1
    cache.acquire(path, 2)  # B starts with A's two blocks
    assert cache.insert_run(path, 2, 6) == 6  # A fills blocks 2-5, into the second segment
    assert cache.insert_run(path, 2, 8) == 2  # B filled them too: its copies stay its own
    assert prefix_cache_blocks(cache)[0] == {**{block: 2 for block in path_blocks(path, 2)},
                                             **{block: 1 for block in path_blocks(path, 6)[2:]}}


def test_a_shared_prefix_is_prefilled_once():
    rows = [(0.0, 200, 2, (1, 2, 3)),   # A fills 12 keyed blocks (192 tokens)
            (50.0, 250, 2, (1, 2, 3)),  # B: all 12 cached -> 192 tokens
            (60.0, 300, 2, (1, 2, 9)),  # C: the first 2 ids agree -> 8 blocks, 128 tokens
            (70.0, 192, 2, (1, 2, 3))]  # D: fully cached, but its last token is computed: 11 blocks, 176
    result = run(rows)
    frame = result.requests.sort_values("id")
    assert list(frame["cached_prompt_tokens"]) == [0, 192, 128, 176]
    uncached = run(rows, caching=False).requests.sort_values("id")
    assert list(uncached["cached_prompt_tokens"]) == [0, 0, 0, 0]
    faster = (frame["ttft_s"].to_numpy() < uncached["ttft_s"].to_numpy())
    assert list(faster) == [False, True, True, True]


def test_concurrent_requests_share_cached_blocks():
    # B arrives while A decodes: both hold A's 12 prompt blocks, counted once (checked after every step).
    alone = run([(0.0, 200, 300, (1, 2, 3))]).requests.iloc[0]
    rows = [(0.0, 200, 300, (1, 2, 3)), (alone["first_token_s"] + 0.1, 200, 2, (1, 2, 3))]
    frame = run(rows, room_blocks=40).requests.sort_values("id")
    assert list(frame["cached_prompt_tokens"]) == [0, 192]
    assert frame.iloc[1]["first_scheduled_s"] < frame.iloc[0]["finish_s"]
    assert frame["status"].eq("completed").all() and frame["preemptions"].eq(0).all()


def test_idle_cached_blocks_are_evicted_when_memory_is_needed_tail_first():
    # 30 blocks of room. A (320 tokens = 5 ids, 20 keyed blocks, output 1) leaves 20 idle cached blocks.
    # E (240 tokens, no ids) then needs ceil(241/16) = 16 blocks: 30 - 16 = 14 stay free, so the 6 idle blocks
    # released last in A's order, its prompt's end (blocks 14-19), are evicted. F, with A's ids, finds 14
    # blocks (224 tokens).
    rows = [(0.0, 320, 1, (1, 2, 3, 4, 5)), (30.0, 240, 1, ()), (60.0, 320, 1, (1, 2, 3, 4, 5))]
    frame = run(rows, room_blocks=30).requests.sort_values("id")
    assert list(frame["cached_prompt_tokens"]) == [0, 0, 224]


@pytest.mark.parametrize("room", [40, 60, None])
def test_fast_forward_equals_per_iteration_with_caching(room):
    rng = np.random.default_rng(7)
    rows, t = [], 0.0
    for _ in range(120):
        t += float(rng.exponential(0.05))
        tenant = int(rng.integers(0, 4))
        ids = tuple([100 + tenant] * 1 + list(rng.integers(0, 3, int(rng.integers(0, 4)))))
        rows.append((t, int(rng.integers(65, 700)), int(rng.integers(1, 200)), ids))
    fast = run(rows, room_blocks=room, mode="fast").requests.sort_values("id")
    exact = run(rows, room_blocks=room, mode="exact").requests.sort_values("id")
    assert list(fast["status"]) == list(exact["status"])
    assert list(fast["cached_prompt_tokens"]) == list(exact["cached_prompt_tokens"])
    assert fast["cached_prompt_tokens"].sum() > 0
    for column in ("first_token_s", "finish_s"):
        a, b = fast[column].to_numpy(), exact[column].to_numpy()
        assert np.allclose(a, b, rtol=1e-9, atol=0, equal_nan=True), column


class UnloadBetween(__import__("sim.policies.base", fromlist=["Policy"]).Policy):
    """Loads the model at 0, unloads it when request 0 finishes (keeping its prefix cache or not) and loads it
    again when the next request arrives."""

    name = "unload-between"

    @classmethod
    def param_defaults(cls):
        return {"keep": False}

    def setup(self, view):
        view.load(0, view.gpus[0])

    def route(self, request, view):
        ready = view.instances_of(request.model)
        return ready[0] if ready else None

    def on_arrival(self, request, view):
        if not view.instances_of(request.model) and not view.gpus[0].instances:
            view.load(request.model, view.gpus[0])

    def on_finish(self, request, instance, view):
        if request.id == 0:
            view.unload(instance, mode="recompute", keep_prefix_cache=self.keep)

    def on_unloaded(self, instance, view):
        if view.pending_count(instance.model):
            view.load(instance.model, view.gpus[0])


@pytest.mark.parametrize("keep", [False, True])
def test_an_unload_loses_the_prefix_cache_unless_it_keeps_it_in_host_ram(keep):
    from sim.policies import registry

    rows = [(0.0, 320, 1, (1, 2, 3, 4, 5)), (100.0, 320, 1, (1, 2, 3, 4, 5))]
    with mock.patch.dict(registry.BUILTIN if hasattr(registry, "BUILTIN") else {}, {}):
        scenario = parse_scenario(scenario_dict(
            cluster={"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 24}, models=[{"name": MODEL}],
            engine={"block_size": BLOCK, "max_num_batched_tokens": BUDGET}), "test")
        scenario.workload.prefix_block_tokens = ID_TOKENS
        arrivals, prompts, outputs, ids = zip(*rows)
        chunk = RequestChunk(np.array(arrivals, float), np.array([MODEL] * 2, object), np.array(prompts, np.int64),
                             np.array(outputs, np.int64), prefix_ids=np.array([tuple(i) for i in ids] + [None], object)[:-1])
        engine_policy = UnloadBetween(keep=keep)
        with mock.patch.object(simulation, "make_policy", lambda name, params: engine_policy):
            result = simulation.simulate(scenario, chunks=[chunk])
    frame = result.requests.sort_values("id")
    # 320 tokens = 20 keyed blocks; the prompt's last block (tokens 304-319) holds its last token: 19 found.
    assert list(frame["cached_prompt_tokens"]) == [0, 19 * BLOCK if keep else 0]
    kinds = list(result.events["kind"])
    assert ("prefix_out" in kinds and "prefix_in" in kinds) == keep
