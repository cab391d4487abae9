"""An instance's prefix cache: full KV blocks of prompts, found again by the prompt that precedes them.

As vLLM v1's automatic prefix caching: a full block is known by a hash chain of
the prompt up to its end, so two requests share a block exactly when their
prompts agree up to there. A new request reuses the longest run of cached
blocks at the start of its prompt and prefills only the rest. Blocks are
reference-counted; one that no request holds any more stays cached, counted
as free memory, until an allocation needs the room, and then the block
released longest ago goes first.

Traces name prompt prefixes at their own granularity (``prefix_ids``, e.g.
Mooncake's 512-token ``hash_ids``). A block is known by the chain of ids up to
the one holding its last token, so the consecutive blocks whose last tokens
fall in one id (a *segment*: 32 blocks of 16 tokens for a 512-token id) are
shared by exactly the same prompts. The cache keeps its state per segment,
not per block, and each operation costs the segments of a prompt (tens)
rather than its blocks (hundreds):

- the blocks of a segment that are cached are a run from its first one: a
  block is cached only by a request that holds the block before it, and is
  released no later than that one (see below), so it is never evicted after it;
- each request holds the first ``cache_blocks`` of its prompt's blocks, so in
  each segment a run from the first block; a block's holders are the requests
  whose run passes it, and the held blocks are a run up to the longest one;
- the cached blocks past it are idle. A release lets go of a prompt's blocks
  from its end back, so a run of blocks that goes idle together lies under
  those of the same segment that went idle before it: a segment's idle blocks
  are a stack of runs, the oldest on top, and each run is also one entry in
  the cache's list of idle runs, oldest release first (its blocks in the
  order the release let go of them: highest first). Eviction takes blocks
  from the head of that list, which is the top of its segment; an allocation
  takes a segment's idle blocks from the bottom, the newest run.
"""

from __future__ import annotations

from typing import Final, cast

SegmentKey = object
"""A segment's key, a hash of a chain of prefix ids. Typed ``object`` so that the compiled build hands it to lists
and dicts as the Python int it is: typed ``int``, each use unboxed it into a native integer and boxed it again,
a heap allocation for most values."""

IdleRuns = list[tuple[SegmentKey, int, int]]
"""A cache's idle blocks as runs ``(segment key, lo, hi)``, oldest release first (:meth:`PrefixCache.idle_runs`)."""

NO_LIMIT: Final = (1 << 62) - 1
"""A release count no GPU reaches: evict regardless of when the blocks were released. The largest value the compiled
build holds unboxed (1 << 62 was a Python int object, and every comparison with it a slow call)."""


class PrefixPath:
    """A prompt's full KV blocks as the prefix cache knows them: its segments, each by its key (the chain of
    prefix ids up to the id its blocks end in), and where each ends among the prompt's blocks."""

    def __init__(self, keys: list[SegmentKey], ends: list[int]) -> None:
        self.keys = keys
        self.ends = ends  # segment i is blocks ends[i - 1] (0 for the first) to ends[i] - 1
        self.blocks = ends[-1] if ends else 0


EMPTY_PATH: Final = PrefixPath([], [])


def prefix_path(prefix_ids: tuple[object, ...], prompt_tokens: int, id_tokens: int, block_size: int) -> PrefixPath:
    """The segments of a prompt's full KV blocks that its ``prefix_ids`` identify (each id stands for
    ``id_tokens`` prompt tokens): block k ends in id ((k + 1) * block_size - 1) // id_tokens, so id j's segment
    is blocks j * id_tokens // block_size to (j + 1) * id_tokens // block_size - 1 (none when no block ends in
    it), the last one cut where the prompt's full blocks end."""
    blocks = min(len(prefix_ids) * id_tokens, prompt_tokens) // block_size
    keys: list[SegmentKey] = []
    ends: list[int] = []
    chain: SegmentKey = 0
    start = j = 0
    while start < blocks:
        chain = cast(SegmentKey, hash((chain, prefix_ids[j])))  # cast: typed int, mypyc would unbox it to box again
        end = min((j + 1) * id_tokens // block_size, blocks)
        if end > start:
            keys.append(chain)  # the chain of ids 0..j: j itself is its length, so it tells no two chains apart
            ends.append(end)
            start = end
        j += 1
    return PrefixPath(keys, ends)


class Segment:
    """The cached blocks of one segment: how many (from its first), how many of those requests hold, and by
    whom; the rest are idle.

    Most holders hold the same run, the longest (every block of a segment but a prompt's last): they are a count,
    and only shorter runs are counted in a dict."""

    def __init__(self, key: SegmentKey) -> None:
        self.key = key
        self.cached = 0
        self.held = 0  # the longest of its holders' runs
        self.longest = 0  # how many hold that run
        self.shorter: dict[int, int] | None = None  # the end of a shorter run -> how many hold it (made when needed)
        self.runs: list[IdleRun] = []  # the idle blocks held..cached-1, the bottom (newest) run last

    def hold_shorter(self, end: int, count: int) -> None:
        """``count`` more holders of a run ending at ``end``, short of the longest."""
        shorter = self.shorter
        if shorter is None:
            shorter = self.shorter = {}
        shorter[end] = shorter.get(end, 0) + count

    def holder_runs(self) -> dict[int, int]:
        """The end of each holder's run -> how many hold that run."""
        runs = dict(self.shorter or {})
        if self.longest:
            runs[self.held] = self.longest
        return runs


class IdleRun:
    """Blocks ``lo``..``hi - 1`` of a segment that went idle in one release (numbered ``seq`` by its GPU): an
    entry of its cache's doubly linked list of idle runs, oldest release first."""

    def __init__(self, segment: Segment, lo: int, hi: int, seq: int) -> None:
        self.segment = segment
        self.lo = lo
        self.hi = hi
        self.seq = seq
        self.prev: IdleRun = self
        self.next: IdleRun = self


class PrefixCache:
    """The cached blocks of one instance, segment by segment, and its idle runs in the order they are evicted."""

    def __init__(self) -> None:
        self.segments: dict[SegmentKey, Segment] = {}
        self.cached_blocks = 0
        self.idle_blocks = 0  # cached blocks no request holds
        self.lru = IdleRun(Segment(0), 0, 0, 0)  # the list's sentinel: lru.next is the oldest run, lru.prev the newest
        self._spare: list[IdleRun] = []  # runs off the list, made again by the next release (most releases make some)

    def __len__(self) -> int:
        return self.cached_blocks

    def match(self, path: PrefixPath, limit: int) -> int:
        """How many of the path's blocks (at most ``limit``), from the first, are cached."""
        return self.match_idle(path, limit)[0]

    def match_idle(self, path: PrefixPath, limit: int) -> tuple[int, int]:
        """``match(path, limit)``, and how many of those cached blocks no request holds (taking them uses
        free blocks)."""
        segments, keys, ends = self.segments, path.keys, path.ends
        end = min(limit, path.blocks)
        hits = idle = 0
        i = 0
        while hits < end:
            segment = segments.get(keys[i])
            if segment is None:
                break
            stop = min(ends[i], end)
            found = min(stop - hits, segment.cached)
            if found > segment.held:
                idle += found - segment.held
            if found < stop - hits:
                return hits + found, idle
            hits = stop
            i += 1
        return hits, idle

    def acquire(self, path: PrefixPath, count: int) -> None:
        """A request now holds the first ``count`` of the path's blocks, all cached."""
        segments, keys, ends = self.segments, path.keys, path.ends
        start = i = 0
        while start < count:
            segment = segments[keys[i]]
            run = min(ends[i], count) - start
            assert run <= segment.cached
            if run == segment.held:
                segment.longest += 1
            elif run < segment.held:
                segment.hold_shorter(run, 1)
            else:
                if segment.longest:
                    segment.hold_shorter(segment.held, segment.longest)
                segment.longest = 1
                self._take_idle(segment, run)
            start = ends[i]
            i += 1

    def _take_idle(self, segment: Segment, held: int) -> None:
        """Hold a segment's blocks up to ``held``: the idle ones among them leave the bottom of its stack."""
        self.idle_blocks -= held - segment.held
        segment.held = held
        runs = segment.runs
        while runs and runs[-1].lo < held:
            run = runs[-1]
            if run.hi > held:
                run.lo = held
                break
            runs.pop()
            run.prev.next = run.next
            run.next.prev = run.prev
            self._recycle(run)

    def insert_run(self, path: PrefixPath, start: int, end: int) -> int:
        """A request that holds the path's first ``start`` blocks filled the blocks ``start``..``end - 1``
        and holds them: cache them in order up to the first one cached already (another request filled it
        meanwhile). Returns where that stopped."""
        segments, keys, ends = self.segments, path.keys, path.ends
        i = 0
        while ends[i] <= start:
            i += 1
        while start < end:
            first = ends[i - 1] if i else 0
            offset = start - first  # the request holds the segment's blocks up to here
            segment = segments.get(keys[i])
            if segment is None:
                segment = segments[keys[i]] = Segment(keys[i])
            if segment.cached > offset:
                break
            stop = min(ends[i], end) - first
            if offset:  # its run grows: the longest, as the segment had no blocks past it
                left = segment.longest - 1
                if left:
                    segment.hold_shorter(offset, left)
            segment.longest = 1
            self.cached_blocks += stop - offset
            segment.cached = segment.held = stop
            start = first + stop
            i += 1
        return start

    def release(self, path: PrefixPath, count: int, released_seq: int) -> int:
        """A request lets go of the path's first ``count`` blocks at ``released_seq``; returns how many nobody
        holds now. The end of a prompt goes idle first, so that it is evicted before the prefix it extends (vLLM
        frees a request's blocks in reverse order for the same reason)."""
        segments, keys, ends = self.segments, path.keys, path.ends
        i = 0
        while ends[i] < count:
            i += 1
        freed = 0
        while i >= 0:
            first = ends[i - 1] if i else 0
            segment = segments[keys[i]]
            run = min(ends[i], count) - first
            if run < segment.held:
                shorter = segment.shorter
                assert shorter is not None  # a run shorter than the longest is counted there
                left = shorter[run] - 1
                if left:
                    shorter[run] = left
                else:
                    del shorter[run]
            elif segment.longest > 1:
                segment.longest -= 1
            else:
                shorter = segment.shorter
                held = 0
                if shorter:
                    for end in shorter:  # a loop, not max(): compiled, it never boxes a key
                        if end > held:
                            held = end
                    segment.longest = shorter.pop(held)
                else:
                    segment.longest = 0
                self._append_idle(segment, held, run, released_seq)
                segment.held = held
                freed += run - held
            i -= 1
        self.idle_blocks += freed
        return freed

    def _append_idle(self, segment: Segment, lo: int, hi: int, seq: int) -> None:
        """Blocks ``lo``..``hi - 1`` of ``segment`` went idle at ``seq``: the newest run, at the bottom of the
        segment's stack and the end of the eviction list."""
        spare = self._spare
        if spare:
            idle = spare.pop()
            idle.segment = segment
            idle.lo = lo
            idle.hi = hi
            idle.seq = seq
        else:
            idle = IdleRun(segment, lo, hi, seq)
        lru = self.lru
        idle.prev = lru.prev
        idle.next = lru
        lru.prev.next = idle
        lru.prev = idle
        segment.runs.append(idle)

    def _recycle(self, run: IdleRun) -> None:
        run.segment = self.lru.segment  # not the segment it left, which may be forgotten
        self._spare.append(run)

    def oldest_idle_seq(self) -> int:
        """When the idle block released longest ago was released (it is evicted next)."""
        assert self.idle_blocks
        return self.lru.next.seq

    def idle_runs(self) -> IdleRuns:
        """The idle blocks, oldest release first, as runs ``(segment key, lo, hi)``: blocks ``hi - 1`` down to
        ``lo`` of the segment, in that order."""
        runs: IdleRuns = []
        run = self.lru.next
        while run is not self.lru:
            runs.append((run.segment.key, run.lo, run.hi))
            run = run.next
        return runs

    def restore(self, runs: IdleRuns, released_seq: int) -> None:
        """Blocks brought back from host RAM (:meth:`idle_runs` of an unloaded instance) into this empty cache,
        oldest first: cached, idle, evicted before anything newer."""
        assert not self.segments  # restored while the instance loads: nothing has run on it
        segments = self.segments
        for key, lo, hi in runs:
            segment = segments.get(key)
            if segment is None:
                segment = segments[key] = Segment(key)
            segment.cached = max(segment.cached, hi)
            self._append_idle(segment, lo, hi, released_seq)
            self.cached_blocks += hi - lo
            self.idle_blocks += hi - lo

    def evict(self, blocks: int, before_seq: int) -> int:
        """Forget up to ``blocks`` idle blocks, released longest ago first, among those released before
        ``before_seq``; returns how many."""
        lru, segments = self.lru, self.segments
        evicted = 0
        while evicted < blocks:
            run = lru.next
            if run is lru or run.seq >= before_seq:
                break
            segment = run.segment
            assert segment.runs[0] is run and run.hi == segment.cached  # the segment's top run: nothing above it
            taken = min(blocks - evicted, run.hi - run.lo)
            run.hi -= taken
            segment.cached -= taken
            evicted += taken
            if run.hi == run.lo:
                lru.next = run.next
                run.next.prev = lru
                segment.runs.pop(0)  # not del: compiled, del is a generic call
                self._recycle(run)
                if not segment.cached:
                    del segments[segment.key]
        self.cached_blocks -= evicted
        self.idle_blocks -= evicted
        return evicted


def evict_oldest(caches: list[tuple[PrefixCache, int]], over: int) -> None:
    """Evict idle blocks of the ``(cache, block bytes)`` sharing a GPU, released longest ago first across them
    (the first listed on a tie), until ``over`` bytes are free. One cache holding idle blocks gives its oldest
    at once; among several, the one holding the oldest gives those released before every other's oldest."""
    while over > 0:
        holding = [pair for pair in caches if pair[0].idle_blocks]
        if len(holding) == 1:
            cache, block_bytes = holding[0]
            blocks = -(-over // block_bytes)
            cache.evict(blocks, NO_LIMIT)
            over -= blocks * block_bytes
            continue
        chosen, oldest = 0, holding[0][0].oldest_idle_seq()
        for index in range(1, len(holding)):
            seq = holding[index][0].oldest_idle_seq()
            if seq < oldest:
                chosen, oldest = index, seq
        before = NO_LIMIT  # the chosen cache's blocks go first while released before this
        for index in range(len(holding)):
            if index != chosen:
                seq = holding[index][0].oldest_idle_seq()
                before = min(before, seq if index < chosen else seq + 1)
        cache, block_bytes = holding[chosen]
        over -= cache.evict(-(-over // block_bytes), before) * block_bytes
