"""Paged KV-cache accounting for one instance's decode batch, and the order its sequences finish in.

Blocks hold ``block_size`` tokens. While a batch only decodes, every sequence
grows by one token per iteration, so a sequence's position inside its last
block, taken relative to the instance's iteration counter, never changes.
Keeping a histogram of those phases lets the engine count the blocks k
iterations will need in O(block_size), without visiting each sequence; that is
what lets fast-forward jump over many iterations at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a local typed i64 is a machine integer (no value here nears 2**62)

    from sim.engine.request import Request


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

    # ``counts[phase] += 1`` written out: compiled, the augmented form on a list item is a generic (slower) add.
    def add(self, tokens: int, iteration: int) -> None:
        counts, phase = self.counts, self._phase(tokens, iteration)
        counts[phase] = counts[phase] + 1
        self.total += 1

    def remove(self, tokens: int, iteration: int) -> None:
        counts, phase = self.counts, self._phase(tokens, iteration)
        counts[phase] = counts[phase] - 1
        self.total -= 1

    def new_blocks(self, iteration: int, steps: int) -> int:
        """Blocks allocated by the steps ``iteration -> iteration + steps``."""
        bs: i64 = self.block_size
        counts = self.counts
        cycles: i64 = steps // bs  # not divmod: compiled, that is a generic call returning a tuple
        blocks: i64 = cycles * self.total
        # The step from iteration t serves phase -t mod bs: the phase steps down by one per iteration, wrapping
        # (counted down rather than taken modulo at every step, once the dearest operation of a step's planning).
        phase: i64 = -iteration % bs
        left: i64 = steps - cycles * bs
        while left:  # not ``for _ in range``: compiled, ``_`` is an object, boxed at every step
            blocks += counts[phase]
            phase = phase - 1 if phase else bs - 1
            left -= 1
        return blocks

    def next_blocks(self, iteration: int) -> int:
        """Blocks allocated by the one step ``iteration -> iteration + 1`` (``new_blocks(iteration, 1)``)."""
        return self.counts[-iteration % self.block_size]

    def max_steps(self, iteration: int, free_blocks: int, limit: int) -> int:
        """The most steps (at most ``limit``) whose new blocks fit in ``free_blocks``."""
        if self.total == 0:
            return limit
        bs: i64 = self.block_size
        counts = self.counts
        total: i64 = self.total
        cycles: i64 = min(free_blocks // total, limit // bs)
        steps: i64 = cycles * bs
        used: i64 = cycles * total
        if used + total <= free_blocks:
            return limit  # under a cycle's steps remain, and those never take more than a cycle's ``total`` blocks
        phase: i64 = -iteration % bs  # whole cycles leave the phase where it was (see new_blocks)
        while steps < limit:
            need: i64 = counts[phase]
            if used + need > free_blocks:
                break
            used += need
            steps += 1
            phase = phase - 1 if phase else bs - 1
        return steps


class FinishQueue:
    """Running sequences by the iteration they finish at, earliest first, the lower request id first on a tie.

    A list in the reverse of that order, so that the first to finish is last and leaves in O(1): for batches of
    a few hundred, a binary search and a list insert (a memmove) cost far less than a heap's comparisons of
    Python objects."""

    def __init__(self) -> None:
        self.requests: list[Request] = []

    @staticmethod
    def end(request: Request) -> int:
        """The iteration a running ``request`` finishes at: where its count of generated tokens reaches its output."""
        return request.join_iter + request.output_tokens - request.gen_at_join

    def push(self, request: Request) -> None:
        """Add ``request``, which has just joined the batch."""
        requests, end, rid = self.requests, self.end(request), request.id
        low, high = 0, len(requests)
        while low < high:  # the first place whose request finishes before this one
            middle = (low + high) >> 1
            held = requests[middle]
            held_end = self.end(held)
            if held_end > end or (held_end == end and held.id > rid):
                low = middle + 1
            else:
                high = middle
        requests.insert(low, request)

    def first(self) -> int:
        """The iteration the first of them finishes at (there must be one)."""
        return self.end(self.requests[-1])

    def pop(self) -> Request:
        return self.requests.pop()

    def remove(self, request: Request) -> None:
        """Take out ``request``, which leaves the batch before it finishes (preempted, or its instance unloads)."""
        requests = self.requests
        for i in range(len(requests)):
            if requests[i] is request:
                requests.pop(i)
                return
        raise ValueError(f"{request!r} is not in the batch")
