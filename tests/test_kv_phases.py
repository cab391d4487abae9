"""The phase histogram against the blocks each sequence needs, counted one sequence and one step at a time.

The histogram never looks at a sequence after adding it: it answers "how many blocks do the next k decode
steps allocate" and "how many steps fit in F free blocks" from counts per phase. The truth here is the
definition: a sequence holding n tokens holds ceil(n / block_size) blocks, and each step adds a token.
"""

from __future__ import annotations

from conftest import wall_clock_limit
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.kv import PhaseHistogram, blocks_for

batches = st.fixed_dictionaries({
    "block_size": st.sampled_from([1, 2, 3, 16, 32]),
    "joins": st.lists(st.tuples(st.integers(1, 600), st.integers(0, 80)), max_size=40),  # (tokens, at iteration)
    "iteration": st.integers(80, 400),
})


def histogram_and_tokens(batch: dict) -> tuple[PhaseHistogram, list[int]]:
    """The histogram of sequences that joined at the given iterations, and each one's tokens at ``iteration``."""
    histogram = PhaseHistogram(batch["block_size"])
    tokens_now = []
    for tokens, joined_at in batch["joins"]:
        histogram.add(tokens, joined_at)
        tokens_now.append(tokens + batch["iteration"] - joined_at)  # one token per decode step since it joined
    return histogram, tokens_now


def blocks_taken(tokens_now: list[int], steps: int, block_size: int) -> int:
    return sum(blocks_for(n + steps, block_size) - blocks_for(n, block_size) for n in tokens_now)


@settings(max_examples=300, deadline=None)
@given(batch=batches, steps=st.integers(0, 200))
def test_new_blocks_are_the_sequences_own(batch, steps):
    histogram, tokens_now = histogram_and_tokens(batch)
    with wall_clock_limit(10):
        counted = histogram.new_blocks(batch["iteration"], steps)
    assert counted == blocks_taken(tokens_now, steps, batch["block_size"])
    assert histogram.next_blocks(batch["iteration"]) == blocks_taken(tokens_now, 1, batch["block_size"])


@settings(max_examples=300, deadline=None)
@given(batch=batches, free_blocks=st.integers(0, 400), limit=st.integers(0, 200))
def test_max_steps_is_the_longest_run_that_fits(batch, free_blocks, limit):
    histogram, tokens_now = histogram_and_tokens(batch)
    fitting = 0
    while fitting < limit and blocks_taken(tokens_now, fitting + 1, batch["block_size"]) <= free_blocks:
        fitting += 1
    with wall_clock_limit(10):
        assert histogram.max_steps(batch["iteration"], free_blocks, limit) == fitting


def test_removing_a_sequence_forgets_it():
    histogram = PhaseHistogram(16)
    histogram.add(31, 0)  # needs its next block two steps later: at 32 tokens a step fills the block
    histogram.add(100, 5)
    histogram.remove(100, 5)
    assert histogram.total == 1
    assert [histogram.new_blocks(0, steps) for steps in (1, 2, 17, 18)] == [0, 1, 1, 2]
