"""Shared-prefix workloads: tenants' system prompts and multi-turn conversations, with prefix ids.

Each arrival of the generator's process starts a conversation of a model (from
the mix) and a tenant. Its first prompt is the tenant's system prompt followed
by the user's message; every later turn's prompt carries the whole
conversation so far (system prompt, earlier messages and answers) and a new
message, and arrives a think time after the turn before. Prompts are named by
prefix ids, one per ``prefix_block_tokens`` tokens, as Mooncake's traces do:
the blocks of a system prompt are the same for every conversation of its
tenant and model, and a conversation's own blocks are the same in each of its
later turns, so a prefix cache can find both.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import numpy as np

from sim.errors import MmsimError
from sim.workload.chunk import RequestChunk

CONVERSATION_BIT = 1 << 62
"""Ids of a conversation's own blocks are set apart from system-prompt ids by this bit."""


BLOCK_BITS = 20
"""A prefix id's low bits number the block within its prompt: at most 2**20 blocks, or ids would run into the
tenant's and conversation's bits and two prompts would share blocks they do not."""


def system_block_id(model: int, tenant: int, block: int) -> int:
    return (model << 40) | (tenant << BLOCK_BITS) | block


def conversation_block_id(conversation: int, block: int) -> int:
    return CONVERSATION_BIT | (conversation << BLOCK_BITS) | block


def prompt_ids(model: int, tenant: int, conversation: int, system_tokens: int, prompt_tokens: int,
               block_tokens: int) -> tuple[int, ...]:
    """The prefix ids of a prompt's full blocks: a block wholly inside the system prompt is the tenant's,
    any later one (or one straddling the system prompt's end) is the conversation's."""
    blocks = prompt_tokens // block_tokens
    if blocks >> BLOCK_BITS:
        raise MmsimError(f"a conversation's prompt of {prompt_tokens:,} tokens is {blocks:,} prefix blocks of "
                         f"{block_tokens} tokens, more than the {1 << BLOCK_BITS:,} a prompt's ids can number; "
                         f"raise prefix_block_tokens or shorten the conversations",
                         field="workload.prefix_block_tokens")
    shared = min(blocks, system_tokens // block_tokens)  # block b is the tenant's when (b + 1) x block_tokens fits
    # Below 2**BLOCK_BITS, a block's id is its first id plus its index: consecutive ids, made as ranges.
    system, own = system_block_id(model, tenant, 0), conversation_block_id(conversation, 0)
    return (*range(system, system + shared), *range(own + shared, own + blocks))


class Conversations:
    """Turns of conversations in arrival order, from conversation starts and per-turn draws."""

    def __init__(self, tenants: int, system_prompt_tokens: int, turns_low: int, turns_high: int,
                 think_time_s: float, block_tokens: int, rng: np.random.Generator):
        self.tenants = tenants
        self.system_prompt_tokens = system_prompt_tokens
        self.turns = (turns_low, turns_high)
        self.think_time_s = think_time_s
        self.block_tokens = block_tokens
        self.rng = rng
        self._pending: list[tuple[float, int, int, str, int, int]] = []  # (arrival, order, conv, model, prompt, out)
        self._ids: dict[int, tuple[int, ...]] = {}
        self._order = 0
        self._started = 0

    def start(self, times: np.ndarray, models: np.ndarray, model_codes: np.ndarray, messages: np.ndarray,
              outputs: np.ndarray) -> None:
        """Start one conversation per arrival; ``messages``/``outputs`` give each turn's new user tokens and
        answer (one row per conversation, as many columns as the most turns)."""
        rng = self.rng
        tenants = rng.integers(0, self.tenants, len(times))
        turns = rng.integers(self.turns[0], self.turns[1] + 1, len(times))
        thinks = rng.exponential(self.think_time_s, (len(times), messages.shape[1])) if self.think_time_s > 0 else \
            np.zeros((len(times), messages.shape[1]))
        system, block_tokens = self.system_prompt_tokens, self.block_tokens
        # As Python numbers: indexing numpy arrays one element at a time cost most of this loop.
        rows = zip(times.tolist(), [str(m) for m in models], model_codes.tolist(), tenants.tolist(), turns.tolist(),
                   messages.tolist(), outputs.tolist(), thinks.tolist())
        for arrival, model, code, tenant, count, row_messages, row_outputs, row_thinks in rows:
            conversation = self._started
            self._started += 1
            prompts = []
            context = system
            for turn in range(count):
                prompts.append(context + row_messages[turn])
                context = prompts[-1] + row_outputs[turn]
            # A turn's ids are the first of its last turn's (its prompt extends every earlier one): made once,
            # each turn's a slice sharing the same int objects.
            ids = prompt_ids(code, tenant, conversation, system, prompts[-1], block_tokens)
            for turn in range(count):
                self._push(arrival, conversation, model, prompts[turn], row_outputs[turn],
                           ids[:prompts[turn] // block_tokens])
                arrival += row_thinks[turn]

    def _push(self, arrival: float, conversation: int, model: str, prompt: int, output: int, ids: tuple[int, ...]) -> None:
        self._ids[self._order] = ids
        heapq.heappush(self._pending, (arrival, self._order, conversation, model, prompt, output))
        self._order += 1

    def take(self, until_s: float) -> Iterator[tuple[float, str, int, int, tuple[int, ...]]]:
        """The pending turns arriving before ``until_s`` (all of them when it is infinite), in order."""
        pending = self._pending
        while pending and pending[0][0] < until_s:
            arrival, order, _, model, prompt, output = heapq.heappop(pending)
            yield arrival, model, prompt, output, self._ids.pop(order)


def as_chunk(turns: list[tuple[float, str, int, int, tuple[int, ...]]], first_id: int) -> RequestChunk:
    ids = np.empty(len(turns), object)
    ids[:] = [turn[4] for turn in turns]
    return RequestChunk(np.array([t[0] for t in turns], float), np.array([t[1] for t in turns], object),
                        np.array([t[2] for t in turns], np.int64), np.array([t[3] for t in turns], np.int64),
                        prefix_ids=ids, first_id=first_id)


def generate_conversations(starts, mix, lengths, model_names: list[str], conversations: Conversations,
                           max_requests: int | None, duration_s: float | None, chunk_rows: int,
                           most_turns: int) -> Iterator[RequestChunk]:
    """Turns in arrival order, in chunks of up to ``chunk_rows``: conversations start at the arrival process's
    times (``starts``); each turn's new message and answer are drawn as a generated request's prompt and output."""
    codes = {name: code for code, name in enumerate(model_names)}
    emitted = 0
    ready: list[tuple[float, str, int, int, tuple[int, ...]]] = []
    horizon = float("inf") if duration_s is None else duration_s
    done = False
    while not done:
        times = starts.take(chunk_rows)
        if len(times):
            models = mix.draw(len(times))
            messages, outputs = lengths.draw(len(times) * most_turns)
            conversations.start(times, models, np.array([codes[m] for m in models]),
                                np.reshape(messages, (len(times), most_turns)), np.reshape(outputs, (len(times), most_turns)))
        # Every later conversation starts at or after the last start drawn: turns before it are final.
        until = float(times[-1]) if len(times) else float("inf")
        done = not len(times)
        for turn in conversations.take(until):
            if turn[0] > horizon or (max_requests is not None and emitted + len(ready) >= max_requests):
                done = True
                break
            ready.append(turn)
            if len(ready) == chunk_rows:
                yield as_chunk(ready, emitted)
                emitted, ready = emitted + len(ready), []
    if ready:
        yield as_chunk(ready, emitted)
