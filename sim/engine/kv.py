"""Paged KV-cache accounting for one instance's decode batch.

Blocks hold ``block_size`` tokens. While a batch only decodes, every sequence
grows by one token per iteration, so a sequence's position inside its last
block, taken relative to the instance's iteration counter, never changes.
Keeping a histogram of those phases lets the engine count the blocks k
iterations will need in O(block_size), without visiting each sequence; that is
what lets fast-forward jump over many iterations at once.
"""

from __future__ import annotations


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class PhaseHistogram:
    """How many running sequences need a new block on each iteration of the cycle."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.counts = [0] * block_size
        self.total = 0

    def _phase(self, tokens: int, iteration: int) -> int:
        # A sequence holding n tokens at iteration t needs a new block on the step t -> t+1
        # exactly when n is a multiple of the block size; (n - t) mod bs is constant while decoding.
        return (tokens - iteration) % self.block_size

    def add(self, tokens: int, iteration: int) -> None:
        self.counts[self._phase(tokens, iteration)] += 1
        self.total += 1

    def remove(self, tokens: int, iteration: int) -> None:
        self.counts[self._phase(tokens, iteration)] -= 1
        self.total -= 1

    def new_blocks(self, iteration: int, steps: int) -> int:
        """Blocks allocated by the steps ``iteration -> iteration + steps``."""
        cycles, rest = divmod(steps, self.block_size)
        blocks = cycles * self.total
        bs, counts = self.block_size, self.counts
        for s in range(rest):
            blocks += counts[(-(iteration + s)) % bs]
        return blocks

    def next_blocks(self, iteration: int) -> int:
        """Blocks allocated by the one step ``iteration -> iteration + 1`` (``new_blocks(iteration, 1)``)."""
        return self.counts[-iteration % self.block_size]

    def max_steps(self, iteration: int, free_blocks: int, limit: int) -> int:
        """The most steps (at most ``limit``) whose new blocks fit in ``free_blocks``."""
        if self.total == 0:
            return limit
        cycles = min(free_blocks // self.total, limit // self.block_size)
        steps, used = cycles * self.block_size, cycles * self.total
        bs, counts = self.block_size, self.counts
        while steps < limit:
            need = counts[(-(iteration + steps)) % bs]
            if used + need > free_blocks:
                break
            used += need
            steps += 1
        return steps
