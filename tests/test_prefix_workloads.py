"""Shared-prefix workloads: the conversation generator's prompts and ids, and a trace's ideal prefix reuse,
checked against hand-computed values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.errors import MmsimError
from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk
from sim.workload.conversations import CONVERSATION_BIT, prompt_ids
from sim.workload.stats import trace_stats
from sim.workload.stream import iter_requests
from tests.conftest import scenario_dict


def chunk(prompts, ids, model="m") -> RequestChunk:
    column = np.empty(len(ids), object)
    column[:] = ids
    n = len(prompts)
    return RequestChunk(np.arange(n, dtype=float), np.array([model] * n, object), np.array(prompts, np.int64),
                        np.ones(n, np.int64), prefix_ids=column)


def test_ideal_reuse_counts_tokens_in_blocks_seen_before():
    # A: blocks (1), (1,2) new. B: (1), (1,2) seen = 1,024 of 1,500. C: (1) seen = 512; (1,9) new.
    stats = trace_stats([chunk([1024, 1500, 600], [(1, 2), (1, 2, 3), (1, 9)])], prefix_block_tokens=512)
    reuse = stats.summary()["prefix_reuse"]
    assert reuse["share"] == (1024 + 512) / (1024 + 1500 + 600)
    assert trace_stats([chunk([10], [None])]).summary()["prefix_reuse"]["share"] == 0.0


def test_prompt_ids_split_system_prompt_from_conversation():
    ids = prompt_ids(model=1, tenant=2, conversation=5, system_tokens=100, prompt_tokens=300, block_tokens=64)
    assert len(ids) == 4  # 300 // 64 full blocks
    assert all(i & CONVERSATION_BIT == 0 for i in ids[:1]) and all(i & CONVERSATION_BIT for i in ids[1:])
    other = prompt_ids(model=1, tenant=2, conversation=6, system_tokens=100, prompt_tokens=300, block_tokens=64)
    assert ids[:1] == other[:1] and ids[1:] != other[1:]  # block 1 (tokens 64-127) straddles the system prompt's end
    assert ids == ((1 << 40) | (2 << 20), CONVERSATION_BIT | (5 << 20) | 1, CONVERSATION_BIT | (5 << 20) | 2,
                   CONVERSATION_BIT | (5 << 20) | 3)  # by hand: the tenant's block 0, then the conversation's 1-3
    assert prompt_ids(model=0, tenant=0, conversation=0, system_tokens=640, prompt_tokens=300, block_tokens=64) == \
        tuple(range(4))  # a prompt inside the system prompt: the tenant's blocks only


def test_prompt_of_more_blocks_than_ids_number_is_refused():
    # 2**20 one-token blocks would spill into the tenant's bits: another tenant's block 0 has the same id.
    assert len(prompt_ids(0, 0, 0, 0, (1 << 20) - 1, 1)) == (1 << 20) - 1
    with pytest.raises(MmsimError, match="prefix_block_tokens"):
        prompt_ids(0, 0, 0, system_tokens=1 << 20, prompt_tokens=1 << 20, block_tokens=1)


def conversation_workload(**conversations):
    data = scenario_dict(models=[{"name": "qwen2.5-3b"}])
    data["workload"] = {"generator": {"max_requests": 400, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                      "mix": {"qwen2.5-3b": 1.0},
                                      "prompt_tokens": {"dist": "constant", "value": 50},
                                      "output_tokens": {"dist": "constant", "value": 30},
                                      "conversations": conversations},
                        "prefix_block_tokens": 64}
    return parse_scenario(data, "test").workload


def test_every_turn_carries_the_conversation_so_far():
    workload = conversation_workload(tenants=1, system_prompt_tokens=128, turns={"dist": "uniform", "low": 3, "high": 3},
                                     think_time_s=5.0)
    chunks = list(iter_requests(workload, seed=4, base_dir=Path(".")))
    prompts = np.concatenate([c.prompt_tokens for c in chunks])
    arrivals = np.concatenate([c.arrival_s for c in chunks])
    assert np.all(np.diff(arrivals) >= 0)
    # Turn k: 128 system + k x (50 message + 30 answer) + 50: 178, 258, 338 tokens.
    assert set(prompts.tolist()) == {178, 258, 338}
    counts = {p: int((prompts == p).sum()) for p in (178, 258, 338)}
    # 3 turns each; max_requests cuts the conversations still going at the 400th turn (about 10 at 1/s with 2 x 5 s
    # of thinking)
    assert counts[178] >= counts[258] >= counts[338] >= counts[178] - 25
    ids = [i for c in chunks for i in c.prefix_ids]
    first_blocks = {turn[:2] for turn in ids}
    assert len(first_blocks) == 1  # one tenant: every prompt starts with the same 2 system blocks


def test_same_seed_same_workload():
    spec = dict(tenants=5, system_prompt_tokens=500, turns={"dist": "uniform", "low": 1, "high": 4}, think_time_s=10.0)
    a = [c.prefix_ids.tolist() for c in iter_requests(conversation_workload(**spec), seed=9, base_dir=Path("."))]
    b = [c.prefix_ids.tolist() for c in iter_requests(conversation_workload(**spec), seed=9, base_dir=Path("."))]
    assert a == b
