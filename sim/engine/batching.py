"""Batch formation at an iteration boundary (called by :meth:`Instance.plan`): in-flight prefill chunks,
then new admissions, each given the KV blocks its chunk fills, with the prefix cache's hits taken first.

These are the rules of docs/engine.md sections 5, 6 and 9, as functions of the engine whose state they
change (its config, policy, admission counter and prefix-cache counters).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sim.engine.kv import blocks_for
from sim.engine.request import Request
from sim.policies.contract import checked_waiting_leaders

if TYPE_CHECKING:  # the engine imports this module
    from sim.engine.engine import Engine
    from sim.engine.instance import Instance


def start_need(engine: Engine, instance: Instance, request: Request) -> tuple[int, int, int]:
    """What a waiting ``request`` needs to start on ``instance``: the free blocks it must find (all of its
    prompt's, less those the prefix cache holds, plus the idle cached ones it would take from the free
    pool, as vLLM counts them), the blocks the cache holds, and how many of those are idle."""
    block_size = engine.config.block_size
    total = blocks_for(request.prefill_target + 1, block_size)
    cache = instance.prefix_cache
    if cache is None or request.prefix_ids is None:
        return total, 0, 0
    path = engine.prefix_path(request)
    # At least one prompt token is computed, as in vLLM, to produce the first output token's logits.
    hits, idle = cache.match_idle(path, (request.prefill_target - 1) // block_size)
    return total - hits + idle, hits, idle


def continue_prefills(engine: Engine, instance: Instance, now: float) -> tuple[list[tuple[Request, int]], float, bool]:
    """This step's chunks of in-flight prefills, in order, each given the KV blocks it fills.

    vLLM allocates a prompt's blocks chunk by chunk; a chunk short of blocks preempts the policy's
    victim until it fits or is itself the victim, and then no later prefill runs this step. Returns
    the chunks, the KV swap-out seconds the step waits for, and whether anything was preempted."""
    prefilling = instance.prefilling
    prefills: list[tuple[Request, int]] = []
    transfer_s, preempted = 0.0, False
    budget = engine.config.max_num_batched_tokens - len(instance.running)
    index = 0
    while index < len(prefilling) and budget > 0:
        request = prefilling[index]
        chunk = min(request.prefill_target - request.prefilled, budget)
        extra = chunk_blocks(engine, request, chunk) - request.blocks
        while extra > instance.spare_blocks() and request.state == "prefilling":
            transfer_s = max(transfer_s, engine.preempt_for_blocks(instance, now))
            preempted = True
        if request.state != "prefilling":
            break
        if preempted:  # the victim may have been a running sequence or a prefill already given its chunk
            prefills = [(held, size) for held, size in prefills if held.state == "prefilling"]
            budget = engine.config.max_num_batched_tokens - len(instance.running) - sum(size for _, size in prefills)
            index = len(prefills)
        request.blocks += extra
        instance.blocks += extra
        prefills.append((request, chunk))
        budget -= chunk
        index += 1
    return prefills, transfer_s, preempted


def chunk_blocks(engine: Engine, request: Request, chunk: int) -> int:
    """Blocks ``request`` holds once ``chunk`` more prompt tokens are in; the chunk that completes the
    prompt also takes the slot of the first output token (reserved at admission)."""
    tokens = request.prefilled + chunk
    if tokens >= request.prefill_target:
        tokens = request.prefill_target + 1
    return blocks_for(tokens, engine.config.block_size)


def admit(engine: Engine, instance: Instance, now: float, prefills: list[tuple[Request, int]]) -> None:
    """Start waiting requests, in policy order, after this step's in-flight ``prefills``.

    As vLLM's ``scheduler_reserve_full_isl``: a request starts only if blocks for its whole prompt are
    free now, but takes only those of its first chunk."""
    waiting, running, prefilling = instance.waiting, instance.running, instance.prefilling
    config = engine.config
    budget = config.max_num_batched_tokens - len(running) - sum(chunk for _, chunk in prefills)
    if waiting and engine.reorders_waiting:  # the default order is FCFS: nothing to do
        engine.view.order_waiting(instance)
    max_num_seqs, chunked, block_size = config.max_num_seqs, config.chunked_prefill, config.block_size
    while waiting and budget > 0:
        if len(running) + len(prefilling) >= max_num_seqs:
            break
        request = waiting[0]
        need_blocks, hits, idle_hits = start_need(engine, instance, request)
        need = request.prefill_target - hits * block_size
        if not chunked and need > budget and (prefills or running):
            break
        if need_blocks > instance.spare_blocks():
            break
        waiting.popleft()
        request.admitted_seq = engine.next_admission()
        take_cached_prefix(engine, instance, request, hits, idle_hits)
        chunk = min(need, budget) if chunked else need
        blocks = chunk_blocks(engine, request, chunk) - request.blocks
        request.blocks += blocks
        instance.blocks += blocks
        request.state = "prefilling"
        prefilling.append(request)
        if math.isnan(request.first_scheduled_s):
            request.first_scheduled_s = now
        prefills.append((request, chunk))
        budget -= chunk


def head_starts(engine: Engine, instance: Instance, request: Request) -> bool:
    """Whether :func:`admit` would start ``request``, the head of the waiting queue, at a boundary where
    ``instance`` decodes its batch and has no prefill chunks to continue."""
    config = engine.config
    budget = config.max_num_batched_tokens - len(instance.running)
    if budget <= 0 or len(instance.running) + len(instance.prefilling) >= config.max_num_seqs:
        return False
    need_blocks, hits, _ = start_need(engine, instance, request)
    if not config.chunked_prefill and request.prefill_target - hits * config.block_size > budget and instance.running:
        return False
    return need_blocks <= instance.spare_blocks()


def any_waiting_starts(engine: Engine, instance: Instance, budget_whole: bool) -> bool:
    """Whether any of ``instance``'s waiting requests that a policy sorting by key may put at the head of the queue
    (its ``waiting_leaders``) would start at a boundary if it stood there: :func:`head_starts` for each, or, with
    ``budget_whole`` (after a prefill iteration, whose chunks leave the token budget whole again), by KV room
    alone."""
    if engine.checks_policy:
        leaders: Iterable[Request] = checked_waiting_leaders(engine, instance)
    else:
        leaders = engine.policy.waiting_leaders(instance, engine.view)
    for request in leaders:
        if budget_whole:
            if start_need(engine, instance, request)[0] <= instance.spare_blocks():
                return True
        elif head_starts(engine, instance, request):
            return True
    return False


def take_cached_prefix(engine: Engine, instance: Instance, request: Request, hits: int, idle_hits: int) -> None:
    """A request starting on ``instance`` holds the ``hits`` cached blocks its prompt begins with and
    prefills from there; counted for the model's prefix-cache hit rate."""
    if instance.prefix_cache is None:
        return
    model = request.model
    queried = engine.prefix_query_tokens  # ``[model] +=`` written out: compiled, the augmented form is generic
    queried[model] = queried[model] + request.prefill_target
    instance.prefix_query_tokens += request.prefill_target
    if hits == 0:
        return
    path = request.prefix_path
    assert path is not None
    instance.prefix_cache.acquire(path, hits)
    instance.blocks += idle_hits
    request.blocks = request.cache_blocks = hits
    request.prefilled = request.prefill_start = hits * engine.config.block_size
    hit = engine.prefix_hit_tokens
    hit[model] = hit[model] + request.prefilled
    instance.prefix_hit_tokens += request.prefilled
    if math.isnan(request.first_scheduled_s):
        request.cached_tokens = request.prefilled
