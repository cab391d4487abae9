"""KV blocks are allocated chunk by chunk, as vLLM v1 does, with block counts worked out by hand.

vLLM admits a prompt only if blocks for all of it are free (``scheduler_reserve_full_isl``), but allocates
the blocks of each chunk as it is scheduled; a chunk that finds too few free blocks preempts the latest
admitted request, which may be its own.
"""

from __future__ import annotations

from unittest import mock

import numpy as np

from sim import simulation
from sim.engine.engine import Engine
from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk
from tests.conftest import kv_room_hardware, scenario_dict

MODEL, BLOCK_SIZE, BUDGET, MAX_SEQS = "qwen2.5-3b", 16, 256, 8


def blocks_after_each_step(requests: list[tuple[int, int]], room_blocks: int | None = None):
    """Simulate ``(prompt, output)`` requests arriving together, in that order, on one GPU whose KV room is
    ``room_blocks`` blocks (or plenty); return the instance's block count after every step, and the result."""
    scenario = parse_scenario(scenario_dict(
        cluster={"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 24}, models=[{"name": MODEL}],
        engine={"block_size": BLOCK_SIZE, "max_num_batched_tokens": BUDGET, "max_num_seqs": MAX_SEQS,
                "gpu_memory_utilization": 1.0}), "test")
    after_step = Engine.after_step
    counts: list[int] = []
    sized_hardware = kv_room_hardware(MODEL, BLOCK_SIZE, BUDGET, MAX_SEQS, room_blocks)

    def recording(engine, instance):
        counts.append(instance.blocks)
        after_step(engine, instance)

    prompts, outputs = zip(*requests)
    chunks = [RequestChunk(np.zeros(len(requests)), np.array([MODEL] * len(requests), object),
                           np.array(prompts, np.int64), np.array(outputs, np.int64))]
    with mock.patch.object(simulation, "build_hardware", sized_hardware), mock.patch.object(Engine, "after_step", recording):
        result = simulation.simulate(scenario, mode="exact", chunks=chunks)
    return counts, result


def test_a_long_prompt_takes_its_blocks_one_chunk_at_a_time():
    counts, result = blocks_after_each_step([(1000, 3)])
    # 256-token chunks fill 16, 32 and 48 blocks; the last chunk (232 tokens) completes the prompt and takes
    # the first output token's slot: ceil(1001 / 16) = 63. Token 1002 still fits block 63; then it finishes.
    assert counts == [16, 32, 48, 63, 63, 0]
    assert result.requests["status"].eq("completed").all()


def test_a_chunk_short_of_blocks_preempts_the_latest_admitted_request():
    # 71 blocks of room. D (159 tokens) completes its prompt in step 1: ceil(160 / 16) = 10 blocks. L (960 tokens)
    # needs ceil(961 / 16) = 61 <= 71 - 10, so it starts in the same step with the 97 tokens left of the budget:
    # 7 blocks. D's decode then takes its 11th block in step 2 (token 161), L's 255-token chunks fill 22, 38 and
    # 54 blocks, and L's last chunk needs 61 - 54 = 7 more where 71 - 11 - 54 = 6 are free: L, admitted last,
    # preempts itself and is recomputed once D is done (61 blocks do not fit beside D's until then).
    counts, result = blocks_after_each_step([(159, 100), (960, 5)], room_blocks=71)
    assert counts[:5] == [17, 33, 49, 65, 11]
    frame = result.requests.set_index("id").sort_index()
    d, l = frame.iloc[0], frame.iloc[1]
    assert (d["preemptions"], l["preemptions"]) == (0, 1)
    assert l["first_token_s"] > d["finish_s"]
    assert frame["status"].eq("completed").all()
