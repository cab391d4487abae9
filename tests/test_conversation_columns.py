"""The conversation generator makes each start's turns at once, as columns, and hands them out sorted
(``sim.workload.conversations``). The reference is the generator it replaced, kept below as it was: one turn at a
time through a heap. From the same draws both must give the same requests, column for column and chunk for
chunk, whatever the think time, turns, horizon, request cap and chunk size."""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.workload.generator as generator
from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk
from sim.workload.conversations import prompt_ids, start_next
from tests.conftest import scenario_dict


class HeapConversations:
    """Turns of conversations in arrival order, one heap entry a turn."""

    def __init__(self, tenants, system_prompt_tokens, turns_low, turns_high, think_time_s, block_tokens, rng):
        self.tenants, self.system, self.turns = tenants, system_prompt_tokens, (turns_low, turns_high)
        self.think_time_s, self.block_tokens, self.rng = think_time_s, block_tokens, rng
        self.pending, self.order, self.started = [], 0, 0

    def start(self, times, models, model_codes, messages, outputs):
        tenants = self.rng.integers(0, self.tenants, len(times))
        turns = self.rng.integers(self.turns[0], self.turns[1] + 1, len(times))
        thinks = self.rng.exponential(self.think_time_s, messages.shape) if self.think_time_s > 0 else \
            np.zeros(messages.shape)
        for i in range(len(times)):
            conversation, arrival, context = self.started, float(times[i]), self.system
            self.started += 1
            for turn in range(int(turns[i])):
                prompt = context + int(messages[i, turn])
                ids = prompt_ids(int(model_codes[i]), int(tenants[i]), conversation, self.system, prompt,
                                 self.block_tokens)
                heapq.heappush(self.pending, (arrival, self.order, str(models[i]), prompt, int(outputs[i, turn]), ids))
                self.order += 1
                context = prompt + int(outputs[i, turn])
                arrival += float(thinks[i, turn])

    def take(self, until_s):
        while self.pending and self.pending[0][0] < until_s:
            yield heapq.heappop(self.pending)


def heap_generate(starts, mix, lengths, model_names, conversations, max_requests, duration_s, chunk_rows, most_turns):
    codes = {name: code for code, name in enumerate(model_names)}
    emitted, ready, done = 0, [], False
    horizon = float("inf") if duration_s is None else duration_s
    while not done:
        times = start_next(starts, mix, lengths, codes, conversations, chunk_rows, most_turns)  # the draws both share
        until = float(times[-1]) if len(times) else float("inf")
        done = not len(times)
        for turn in conversations.take(until):
            if turn[0] > horizon or (max_requests is not None and emitted + len(ready) >= max_requests):
                done = True
                break
            ready.append(turn)
            if len(ready) == chunk_rows:
                yield chunk_of(ready, emitted)
                emitted, ready = emitted + len(ready), []
    if ready:
        yield chunk_of(ready, emitted)


def chunk_of(turns, first_id) -> RequestChunk:
    ids = np.empty(len(turns), object)
    ids[:] = [turn[5] for turn in turns]
    return RequestChunk(np.array([t[0] for t in turns], float), np.array([t[2] for t in turns], object),
                        np.array([t[3] for t in turns], np.int64), np.array([t[4] for t in turns], np.int64),
                        prefix_ids=ids, first_id=first_id)


def workload(think_time_s, low, high, max_requests, duration_s):
    data = scenario_dict(models=[{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}])
    generator_spec = {"arrivals": {"process": "poisson", "rate_per_s": 2.0},
                      "mix": {"qwen2.5-3b": 0.5, "qwen3-8b": 0.5},
                      "prompt_tokens": {"dist": "lognormal", "mean": 120, "cv": 1.0, "max": 900},
                      "output_tokens": {"dist": "lognormal", "mean": 60, "cv": 1.0, "max": 400},
                      "conversations": {"tenants": 3, "system_prompt_tokens": 300,
                                        "turns": {"dist": "uniform", "low": low, "high": high},
                                        "think_time_s": think_time_s}}
    if max_requests is not None:
        generator_spec["max_requests"] = max_requests
    if duration_s is not None:
        generator_spec["duration_s"] = duration_s
    data["workload"] = {"generator": generator_spec, "prefix_block_tokens": 64}
    return parse_scenario(data, "test").workload


def chunks(config, seed, chunk_rows, heap: bool) -> list[RequestChunk]:
    if not heap:
        return list(generator.generate(config, seed=seed, base_dir=Path("."), chunk_rows=chunk_rows,
                                       prefix_block_tokens=64))
    saved = generator.Conversations, generator.generate_conversations
    generator.Conversations, generator.generate_conversations = HeapConversations, heap_generate
    try:
        return list(generator.generate(config, seed=seed, base_dir=Path("."), chunk_rows=chunk_rows,
                                       prefix_block_tokens=64))
    finally:
        generator.Conversations, generator.generate_conversations = saved


@settings(max_examples=60, deadline=None)
@given(think=st.sampled_from([0.0, 0.5, 20.0]), low=st.integers(1, 3), extra=st.integers(0, 3),
       cap=st.sampled_from([None, 1, 37, 200]), duration=st.sampled_from([None, 15.0, 60.0]),
       chunk_rows=st.sampled_from([1, 7, 64, 65536]), seed=st.integers(0, 50))
def test_columns_give_what_the_heap_gave(think, low, extra, cap, duration, chunk_rows, seed):
    if cap is None and duration is None:
        cap = 150
    config = workload(think, low, low + extra, cap, duration).generator
    expected, got = chunks(config, seed, chunk_rows, heap=True), chunks(config, seed, chunk_rows, heap=False)
    assert [c.first_id for c in got] == [c.first_id for c in expected]
    for old, new in zip(expected, got):
        assert old.arrival_s.tolist() == new.arrival_s.tolist()
        assert old.model.tolist() == new.model.tolist()
        assert old.prompt_tokens.tolist() == new.prompt_tokens.tolist()
        assert old.output_tokens.tolist() == new.output_tokens.tolist()
        assert old.prefix_ids.tolist() == new.prefix_ids.tolist()
        assert new.prompt_tokens.dtype == np.int64 and new.arrival_s.dtype == np.float64
    assert sum(len(c.arrival_s) for c in got) > 0
