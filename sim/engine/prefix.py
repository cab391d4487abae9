"""An instance's prefix cache: full KV blocks of prompts, found again by the prompt that precedes them.

As vLLM v1's automatic prefix caching: a full block is known by a hash chain of
the prompt up to its end, so two requests share a block exactly when their
prompts agree up to there. A new request reuses the longest run of cached
blocks at the start of its prompt and prefills only the rest. Blocks are
reference-counted; one that no request holds any more stays cached, counted
as free memory, until an allocation needs the room, and then the block
released longest ago goes first.

Traces name prompt prefixes at their own granularity (``prefix_ids``, e.g.
Mooncake's 512-token ``hash_ids``); :func:`block_keys` maps them onto the
engine's ``block_size``.
"""

from __future__ import annotations

from collections import OrderedDict


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


class PrefixCache:
    """The cached blocks of one instance: who holds each, and which nobody holds (oldest release first)."""

    def __init__(self) -> None:
        self.holders: dict[int, int] = {}
        self.idle: OrderedDict[int, int] = OrderedDict()  # key -> when it was released (the GPU's count)

    def __len__(self) -> int:
        return len(self.holders)

    def match(self, keys: list[int], limit: int) -> int:
        """How many of ``keys`` (at most ``limit``), from the first, are cached."""
        return self.match_idle(keys, limit)[0]

    def match_idle(self, keys: list[int], limit: int) -> tuple[int, int]:
        """``match(keys, limit)``, and how many of those cached blocks no request holds (taking them uses free
        blocks), in one pass: a prompt's run of cached blocks is hundreds long."""
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
        """A request now holds the first ``count`` of these cached blocks."""
        holders, idle = self.holders, self.idle
        for i in range(count):
            key = keys[i]
            held = holders[key]
            if held == 0:
                del idle[key]
            holders[key] = held + 1

    def insert_run(self, keys: list[int], start: int, end: int) -> int:
        """A request filled the blocks ``keys[start:end]`` and holds them: cache them in order up to the first
        one cached already (another request filled it meanwhile). Returns where that stopped."""
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
        """A request lets go of the first ``count`` of these blocks at ``released_seq``; returns how many nobody
        holds now. The end of a prompt goes idle first, so that it is evicted before the prefix it extends (vLLM
        frees a request's blocks in reverse order for the same reason)."""
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
        """When the idle block released longest ago was released (it is evicted next)."""
        return next(iter(self.idle.values()))

    def restore(self, keys: list[int], released_seq: int) -> None:
        """Blocks brought back from host RAM, oldest first: cached, idle, evicted before anything newer."""
        holders, idle = self.holders, self.idle
        for key in keys:
            if key not in holders:
                holders[key] = 0
                idle[key] = released_seq

    def evict(self, blocks: int) -> None:
        """Forget the ``blocks`` idle blocks released longest ago."""
        holders, idle = self.holders, self.idle
        for _ in range(min(blocks, len(idle))):
            key, _ = idle.popitem(last=False)
            del holders[key]
