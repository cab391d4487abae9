"""The prefix cache, kept per segment, against the cache it replaced, kept per block (below, as it was): random
requests from a few prefix trees, on caches sharing a GPU's eviction, go through the engine's operations on
both, and after each the two agree block for block: on every answer, every block's holders, and the idle
blocks with their release numbers in eviction order."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from sim.engine.prefix import NO_LIMIT, PrefixCache, evict_oldest, prefix_path
from tests.conftest import path_blocks, prefix_cache_blocks


def block_keys(prefix_ids: tuple[int, ...], prompt_tokens: int, id_tokens: int, block_size: int) -> list[int]:
    """The keys of a prompt's full KV blocks that its ``prefix_ids`` identify (each id stands for
    ``id_tokens`` prompt tokens): block k's key hashes every id up to the one holding its last token."""
    covered = min(len(prefix_ids) * id_tokens, prompt_tokens)
    keys: list[int] = []
    chain, chained = 0, 0
    for k in range(covered // block_size):
        last_id = ((k + 1) * block_size - 1) // id_tokens
        while chained <= last_id:
            chain = hash((chain, prefix_ids[chained]))
            chained += 1
        keys.append(hash((chain, k)))
    return keys


class BlockCache:
    """The per-block prefix cache: who holds each block, and which nobody holds (oldest release first)."""

    def __init__(self) -> None:
        self.holders: dict[int, int] = {}
        self.idle: OrderedDict[int, int] = OrderedDict()  # key -> when it was released (the GPU's count)

    def __len__(self) -> int:
        return len(self.holders)

    def match_idle(self, keys: list[int], limit: int) -> tuple[int, int]:
        holders = self.holders
        hits = idle = 0
        end = min(limit, len(keys))
        while hits < end:
            count = holders.get(keys[hits], -1)
            if count < 0:
                break
            if count == 0:
                idle += 1
            hits += 1
        return hits, idle

    def acquire(self, keys: list[int], count: int) -> None:
        holders, idle = self.holders, self.idle
        for i in range(count):
            key = keys[i]
            held = holders[key]
            if held == 0:
                del idle[key]
            holders[key] = held + 1

    def insert_run(self, keys: list[int], start: int, end: int) -> int:
        holders = self.holders
        i = start
        while i < end:
            key = keys[i]
            if key in holders:
                break
            holders[key] = 1
            i += 1
        return i

    def release(self, keys: list[int], count: int, released_seq: int) -> int:
        holders, idle = self.holders, self.idle
        freed = 0
        i = count
        while i > 0:
            i -= 1
            key = keys[i]
            held = holders[key] - 1
            holders[key] = held
            if held == 0:
                idle[key] = released_seq
                freed += 1
        return freed

    def oldest_idle_seq(self) -> int:
        return next(iter(self.idle.values()))

    def restore(self, keys: list[int], released_seq: int) -> None:
        holders, idle = self.holders, self.idle
        for key in keys:
            if key not in holders:
                holders[key] = 0
                idle[key] = released_seq

    def evict(self, blocks: int) -> None:
        holders, idle = self.holders, self.idle
        for _ in range(min(blocks, len(idle))):
            key, _ = idle.popitem(last=False)
            del holders[key]


def block_evict_idle(caches: list[tuple[BlockCache, int]], over: int) -> None:
    """``Gpu.evict_idle_cache`` as it was: across several caches, one block at a time."""
    while over > 0:
        holding = [(cache, block_bytes) for cache, block_bytes in caches if cache.idle]
        if len(holding) == 1:
            cache, block_bytes = holding[0]
            blocks = -(-over // block_bytes)
        else:
            cache, block_bytes = min(holding, key=lambda held: held[0].oldest_idle_seq())
            blocks = 1
        cache.evict(blocks)
        over -= blocks * block_bytes


class Request:
    """A prompt on both caches: its block keys and its segments, and what it holds while it runs."""

    def __init__(self, ids: tuple[int, ...], prompt_tokens: int, id_tokens: int, block_size: int) -> None:
        self.keys = block_keys(ids, prompt_tokens, id_tokens, block_size)
        self.path = prefix_path(ids, prompt_tokens, id_tokens, block_size)
        assert self.path.blocks == len(self.keys)
        self.cache = -1  # the cache it runs on, while it runs
        self.cache_blocks = self.filled = 0


class Pair:
    """The caches of the instances on one GPU, each kept both ways, and the block keys' segment blocks."""

    def __init__(self, block_bytes: list[int]) -> None:
        self.block_bytes = block_bytes
        self.old = [BlockCache() for _ in block_bytes]
        self.new = [PrefixCache() for _ in block_bytes]
        self.blocks: dict[int, tuple[int, int]] = {}  # block key -> (segment key, offset)
        self.releases = 0  # the GPU's count

    def learn(self, request: Request) -> None:
        for key, block in zip(request.keys, path_blocks(request.path, request.path.blocks)):
            assert self.blocks.setdefault(key, block) == block
        assert len(set(self.blocks.values())) == len(self.blocks), "one block per (segment, offset)"

    def check(self) -> None:
        for old, new in zip(self.old, self.new):
            held, idle = prefix_cache_blocks(new)
            assert {self.blocks[k]: n for k, n in old.holders.items() if n} == held
            assert [(self.blocks[k], seq) for k, seq in old.idle.items()] == idle
            assert (len(old), len(old.idle)) == (len(new), new.idle_blocks)
            if old.idle:
                assert old.oldest_idle_seq() == new.oldest_idle_seq()

    def idle_bytes(self) -> int:
        return sum(len(cache.idle) * size for cache, size in zip(self.old, self.block_bytes))


SIZES = st.sampled_from([(64, 16), (512, 16), (40, 16), (16, 16), (8, 16), (24, 16), (7, 3), (5, 5), (3, 7), (1, 2)])


@st.composite
def prompts(draw, id_tokens: int) -> tuple[tuple[int, ...], int]:
    """A prompt from one of a few prefix trees: ids from a small alphabet after a tenant's first id, so that
    prompts share prefixes of every length, and a length that may end before, inside or after its ids."""
    ids = (draw(st.integers(0, 2)),) + tuple(draw(st.lists(st.integers(0, 2), max_size=7)))
    tokens = draw(st.integers(1, len(ids) * id_tokens + 2 * id_tokens))
    return ids, tokens


@settings(max_examples=250, deadline=2000, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(st.data(), SIZES, st.sampled_from([[1], [1, 1], [2, 3], [1, 2, 3], [3, 1, 1]]))
def test_segments_match_blocks_through_random_operations(data, sizes, block_bytes):
    id_tokens, block_size = sizes
    pair = Pair(block_bytes)
    count = data.draw(st.integers(2, 8))
    requests = [Request(*data.draw(prompts(id_tokens)), id_tokens, block_size) for _ in range(count)]
    for request in requests:
        pair.learn(request)
    for _ in range(data.draw(st.integers(20, 100))):
        operation = data.draw(st.sampled_from(["admit", "fill", "fill", "release", "evict", "evict_gpu", "unload"]))
        running = [r for r in requests if r.cache >= 0]
        if operation == "admit" and len(running) < len(requests):
            request = data.draw(st.sampled_from([r for r in requests if r.cache < 0]))
            request.cache = c = data.draw(st.integers(0, len(block_bytes) - 1))
            limit = data.draw(st.integers(0, len(request.keys) + 1))
            hits = pair.new[c].match_idle(request.path, limit)
            assert pair.old[c].match_idle(request.keys, limit) == hits
            assert pair.new[c].match(request.path, limit) == hits[0]
            pair.old[c].acquire(request.keys, hits[0])
            pair.new[c].acquire(request.path, hits[0])
            request.cache_blocks = request.filled = hits[0]
        elif operation == "fill" and any(r.filled < len(r.keys) for r in running):
            request = data.draw(st.sampled_from([r for r in running if r.filled < len(r.keys)]))
            request.filled = filled = data.draw(st.integers(request.filled + 1, len(request.keys)))
            if request.cache_blocks < filled:
                c = request.cache
                stop = pair.old[c].insert_run(request.keys, request.cache_blocks, filled)
                assert pair.new[c].insert_run(request.path, request.cache_blocks, filled) == stop
                request.cache_blocks = stop
        elif operation == "release" and running:
            request = data.draw(st.sampled_from(running))
            if request.cache_blocks:
                c = request.cache
                pair.releases += 1
                freed = pair.old[c].release(request.keys, request.cache_blocks, pair.releases)
                assert pair.new[c].release(request.path, request.cache_blocks, pair.releases) == freed
            request.cache, request.cache_blocks, request.filled = -1, 0, 0
        elif operation == "evict":
            c = data.draw(st.integers(0, len(block_bytes) - 1))
            blocks = data.draw(st.integers(0, len(pair.old[c].idle) + 2))
            expected = min(blocks, len(pair.old[c].idle))
            pair.old[c].evict(blocks)
            assert pair.new[c].evict(blocks, NO_LIMIT) == expected
        elif operation == "evict_gpu" and pair.idle_bytes() >= 6:
            over = data.draw(st.integers(1, pair.idle_bytes()) | st.integers(1, 6))  # often a few blocks
            block_evict_idle(list(zip(pair.old, block_bytes)), over)
            evict_oldest(list(zip(pair.new, block_bytes)), over)
        elif operation == "unload" and any(all(r.cache != c for r in requests) for c in range(len(block_bytes))):
            # An instance with nothing running moves its cache to host RAM, and a new one brings it back.
            c = data.draw(st.sampled_from([c for c in range(len(block_bytes)) if all(r.cache != c for r in requests)]))
            keys, runs = list(pair.old[c].idle), pair.new[c].idle_runs()
            assert sum(hi - lo for _, lo, hi in runs) == len(keys)
            pair.old[c], pair.new[c] = BlockCache(), PrefixCache()
            pair.releases += 1
            pair.old[c].restore(keys, pair.releases)
            pair.new[c].restore(runs, pair.releases)
        pair.check()


@settings(max_examples=200, deadline=1000)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(1, 2000), SIZES)
def test_a_path_is_its_blocks_in_segments(ids, tokens, sizes):
    id_tokens, block_size = sizes
    keys = block_keys(tuple(ids), tokens, id_tokens, block_size)
    path = prefix_path(tuple(ids), tokens, id_tokens, block_size)
    assert path.blocks == len(keys) and all(a < b for a, b in zip([0, *path.ends], path.ends))
    segment_of = [key for key, start, end in zip(path.keys, [0, *path.ends], path.ends) for _ in range(start, end)]
    # Two blocks share a segment exactly when their last tokens lie in the same id.
    owner = [((k + 1) * block_size - 1) // id_tokens for k in range(len(keys))]
    assert all((segment_of[a] == segment_of[b]) == (owner[a] == owner[b])
               for a in range(len(keys)) for b in range(a + 1))


def test_shorter_runs_held_twice_outlast_the_longest():
    """Two requests hold the first 2 blocks of a 4-block segment and a third holds all 4: when the third leaves,
    the two still hold 2, and the blocks go idle only when both have left (counted by hand)."""
    pair = Pair([1])
    longest, *shorter = Request((0,), 64, 64, 16), Request((0,), 32, 64, 16), Request((0,), 32, 64, 16)
    for request in (longest, *shorter):
        pair.learn(request)
    for cache in (pair.old[0], pair.new[0]):
        keys = cache is pair.old[0]
        assert cache.insert_run(longest.keys if keys else longest.path, 0, 4) == 4
        for request in shorter:
            assert cache.match_idle(request.keys if keys else request.path, 2) == (2, 0)
            cache.acquire(request.keys if keys else request.path, 2)
    pair.check()
    freed = [pair.new[0].release(longest.path, 4, 1), pair.new[0].release(shorter[0].path, 2, 2),
             pair.new[0].release(shorter[1].path, 2, 3)]
    for seq, (request, count) in enumerate([(longest, 4), (shorter[0], 2), (shorter[1], 2)], 1):
        pair.old[0].release(request.keys, count, seq)
    assert freed == [2, 0, 2]
    assert [run for run in pair.new[0].idle_runs()] == [(longest.path.keys[0], 2, 4), (longest.path.keys[0], 0, 2)]
    pair.check()
