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
    """Turns of conversations in arrival order, from conversation starts and per-turn draws.

    A conversation's turns are made at once, in numpy, kept as :class:`Turns` and handed out sorted by (arrival,
    order)."""

    def __init__(self, tenants: int, system_prompt_tokens: int, turns_low: int, turns_high: int,
                 think_time_s: float, block_tokens: int, rng: np.random.Generator):
        self.tenants = tenants
        self.system_prompt_tokens = system_prompt_tokens
        self.turns = (turns_low, turns_high)
        self.think_time_s = think_time_s
        self.block_tokens = block_tokens
        self.rng = rng
        self._pending = Turns.empty()
        self._order = 0
        self._started = 0

    def start(self, times: np.ndarray, models: np.ndarray, model_codes: np.ndarray, messages: np.ndarray,
              outputs: np.ndarray) -> None:
        """Start one conversation per arrival; ``messages``/``outputs`` give each turn's new user tokens and
        answer (one row per conversation, as many columns as the most turns)."""
        rng, n, width = self.rng, len(times), messages.shape[1]
        tenants = rng.integers(0, self.tenants, n)
        turns = rng.integers(self.turns[0], self.turns[1] + 1, n)
        thinks = rng.exponential(self.think_time_s, (n, width)) if self.think_time_s > 0 else np.zeros((n, width))
        live = np.arange(width) < turns[:, None]  # the turns each conversation has, row by row
        exchanged = messages + outputs
        # A turn's prompt: the system prompt, every earlier message and answer, and its own message.
        prompts = self.system_prompt_tokens + np.cumsum(exchanged, axis=1) - exchanged + messages
        # A turn arrives the think times of the turns before it after the conversation's start, added in turn
        # order (cumsum adds left to right).
        arrivals = np.cumsum(np.concatenate([np.asarray(times, float)[:, None], thinks[:, :-1]], axis=1), axis=1)
        made = int(live.sum())
        self._pending = self._pending.joined(Turns(
            arrivals[live], np.arange(self._order, self._order + made), np.repeat(np.asarray(models, object), turns),
            prompts[live], outputs[live], self._prefix_ids(model_codes, tenants, turns, prompts, made)))
        self._order += made
        self._started += n

    def _prefix_ids(self, model_codes: np.ndarray, tenants: np.ndarray, turns: np.ndarray, prompts: np.ndarray,
                    made: int) -> np.ndarray:
        """Each turn's prefix ids, conversation by conversation: a turn's are the first of its last turn's (its
        prompt extends every earlier one), made once, each turn's a slice sharing the same int objects."""
        system, block_tokens = self.system_prompt_tokens, self.block_tokens
        column: list[tuple[int, ...]] = []
        # As Python numbers: indexing numpy arrays one element at a time cost most of this loop.
        rows = zip(range(self._started, self._started + len(turns)), model_codes.tolist(), tenants.tolist(),
                   turns.tolist(), prompts.tolist())
        for conversation, code, tenant, count, row_prompts in rows:
            ids = prompt_ids(code, tenant, conversation, system, row_prompts[count - 1], block_tokens)
            column.extend(ids[:prompt // block_tokens] for prompt in row_prompts[:count])
        return np.fromiter(column, dtype=object, count=made)

    def take(self, until_s: float) -> Turns:
        """The pending turns arriving before ``until_s`` (all of them when it is infinite), in order."""
        pending = self._pending
        due = pending.arrival_s < until_s
        self._pending = pending.picked(~due)
        taken = pending.picked(due)
        return taken.picked(np.lexsort((taken.order, taken.arrival_s)))


class Turns:
    """Conversation turns as columns: arrival, the order they were made in (ties in arrival go by it), model,
    prompt and output tokens, prefix ids."""

    def __init__(self, arrival_s: np.ndarray, order: np.ndarray, model: np.ndarray, prompt_tokens: np.ndarray,
                 output_tokens: np.ndarray, prefix_ids: np.ndarray):
        self.arrival_s = arrival_s
        self.order = order
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefix_ids = prefix_ids

    @staticmethod
    def empty() -> Turns:
        return Turns(np.empty(0, float), np.empty(0, np.int64), np.empty(0, object), np.empty(0, np.int64),
                     np.empty(0, np.int64), np.empty(0, object))

    def __len__(self) -> int:
        return len(self.arrival_s)

    def _columns(self) -> tuple[np.ndarray, ...]:
        return self.arrival_s, self.order, self.model, self.prompt_tokens, self.output_tokens, self.prefix_ids

    def picked(self, rows) -> Turns:
        """The turns at ``rows`` (a mask, indices or a slice)."""
        return Turns(*(column[rows] for column in self._columns()))

    def joined(self, other: Turns) -> Turns:
        return Turns(*(np.concatenate(pair) for pair in zip(self._columns(), other._columns())))

    def as_chunk(self, first_id: int) -> RequestChunk:
        return RequestChunk(self.arrival_s, self.model, self.prompt_tokens.astype(np.int64, copy=False),
                            self.output_tokens.astype(np.int64, copy=False), prefix_ids=self.prefix_ids,
                            first_id=first_id)


def start_next(starts, mix, lengths, codes: dict[str, int], conversations, chunk_rows: int,
               most_turns: int) -> np.ndarray:
    """Start the next (up to ``chunk_rows``) conversations of ``starts``, each with its model drawn from ``mix`` and
    each of its possible turns' new message and answer from ``lengths``; their start times (none: the starts are
    over)."""
    times = starts.take(chunk_rows)
    if len(times):
        models = mix.draw(len(times))
        messages, outputs = lengths.draw(len(times) * most_turns)
        shape = (len(times), most_turns)
        conversations.start(times, models, np.array([codes[m] for m in models]), np.reshape(messages, shape),
                            np.reshape(outputs, shape))
    return times


def generate_conversations(starts, mix, lengths, model_names: list[str], conversations: Conversations,
                           max_requests: int | None, duration_s: float | None, chunk_rows: int,
                           most_turns: int) -> Iterator[RequestChunk]:
    """Turns in arrival order, in chunks of up to ``chunk_rows``: conversations start at the arrival process's
    times (``starts``); each turn's new message and answer are drawn as a generated request's prompt and output."""
    codes = {name: code for code, name in enumerate(model_names)}
    emitted = 0
    ready = Turns.empty()
    horizon = float("inf") if duration_s is None else duration_s
    done = False
    while not done:
        times = start_next(starts, mix, lengths, codes, conversations, chunk_rows, most_turns)
        # Every later conversation starts at or after the last start drawn: turns before it are final.
        until = float(times[-1]) if len(times) else float("inf")
        done = not len(times)
        turns = conversations.take(until)
        kept = int(np.searchsorted(turns.arrival_s, horizon, side="right"))  # the first past the horizon ends it
        if max_requests is not None:
            kept = min(kept, max_requests - emitted - len(ready))
        done = done or kept < len(turns)
        ready = ready.joined(turns.picked(slice(0, kept)))
        while len(ready) >= chunk_rows:
            yield ready.picked(slice(0, chunk_rows)).as_chunk(emitted)
            emitted, ready = emitted + chunk_rows, ready.picked(slice(chunk_rows, None))
    if len(ready):
        yield ready.as_chunk(emitted)
