"""A model instance: one model's weights on a GPU, with vLLM-style continuous batching.

Queues follow vLLM's vocabulary: ``waiting`` (not yet prefilled, or dropped
for recompute), ``running`` (decoding, KV on the GPU), ``swapped`` (KV moved
to host RAM). Each call to :meth:`plan` forms the next step at an iteration
boundary; :meth:`complete` applies it when its time has passed.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from sim.costs import ModelCosts, StepCoefficients
from sim.engine import batching
from sim.engine.kv import FinishQueue, PhaseHistogram, blocks_for
from sim.engine.memory import fitting_tokens
from sim.engine.prefix import PrefixCache
from sim.engine.request import Request
from sim.engine.step import Step

if TYPE_CHECKING:  # imported for their types only: both modules import this one
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.gpu import Gpu

INF = float("inf")


def remove_request(requests: list[Request], request: Request) -> None:
    """``requests.remove(request)`` by identity: ``list.remove`` tries ``==`` on every request before it,
    which for a full decode batch made this the dearest line of a step."""
    for i in range(len(requests)):
        if requests[i] is request:
            requests.pop(i)  # not del: compiled, pop(i) is a direct call and del a generic one
            return
    raise ValueError(f"{request!r} is not in the queue")


class Instance:
    """One model resident (or loading, or draining) on one GPU."""

    # The compiled build's instances take no attributes but these; the pure build's must refuse the same (a policy
    # tagging an instance worked in an editable install and failed after ``pip install .``).
    __slots__ = ("uid", "model", "name", "costs", "gpu", "shards", "gpu_share", "config", "status", "weight_bytes",
                 "resident_bytes", "block_bytes", "deployment_max_model_len", "max_model_len", "waiting", "swapped", "running", "prefilling", "finishing", "_joins",
                 "phases", "iteration", "context_tokens", "blocks", "ready_at_s", "last_used_s", "busy_s",
                 "_coefficients", "prefix_cache", "prefix_query_tokens", "prefix_hit_tokens",
                 "policy_preemptions", "policy_moves", "owed_transfer_s")

    def __init__(self, uid: int, model: int, name: str, costs: ModelCosts, gpu: Gpu, gpu_share: float,
                 engine_config: EngineConfig, reserve_bytes: int = 0, weight_bytes: int | None = None,
                 block_bytes: int | None = None, shards: list[Gpu] | None = None, max_model_len: int | None = None):
        self.uid = uid
        self.model = model
        self.name = name
        self.costs = costs
        self.gpu = gpu  # the GPU whose loop runs its steps: the first of ``shards`` when it spans several
        self.shards = shards  # every GPU of a tensor/pipeline-parallel instance (None: only ``gpu``)
        self.gpu_share = gpu_share
        self.config = engine_config
        self.status = "loading"
        # Sizes are per GPU: a parallel instance holds a shard of its weights and of each KV block on each GPU.
        self.weight_bytes = costs.gpu_weight_bytes(gpu_share) if weight_bytes is None else weight_bytes
        # Weights plus the activation peak and non-torch memory (sim.engine.memory) held beside them, never KV.
        self.resident_bytes = self.weight_bytes + reserve_bytes
        self.block_bytes = engine_config.block_size * costs.kv_bytes_per_token if block_bytes is None else block_bytes
        self.deployment_max_model_len = max_model_len
        self.max_model_len = 0
        self.size_max_model_len(beside_neighbours=False)
        self.waiting: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefilling: list[Request] = []
        self.finishing = FinishQueue()  # the running requests, by the iteration they finish at
        self._joins = 0  # requests that joined the running batch so far (numbers them: see _remove_running)
        self.phases = PhaseHistogram(engine_config.block_size)
        self.iteration = 0
        self.context_tokens = 0
        self.blocks = 0
        self.ready_at_s = INF
        self.last_used_s = 0.0
        self.busy_s = 0.0
        self._coefficients: dict[int, StepCoefficients] = {}
        self.prefix_cache: PrefixCache | None = PrefixCache() if engine_config.prefix_caching else None
        self.prefix_query_tokens = 0  # prompt tokens looked up in its prefix cache, at every admission
        self.prefix_hit_tokens = 0  # of those, found there
        # A policy's preemptions asked for while a step of this instance runs: they happen as it ends
        # (sim.engine.preemption.apply_policy_preemptions), and the swap-outs they start hold up the next step.
        self.policy_preemptions: list[tuple[Request, str]] = []
        self.policy_moves: list[tuple[Request, Instance]] = []  # where those requests are assigned once preempted
        self.owed_transfer_s = 0.0

    def size_max_model_len(self, beside_neighbours: bool) -> None:
        """Size ``max_model_len`` on the memory this instance's GPUs leave it, as vLLM sizes it per engine, on the
        smallest of its GPUs: whole, or beside the weights and reserves of the instances resident there with it.
        In a fleet of mixed GPUs, at another share than the deployment's, or beside a model that stays for good,
        a request within the deployment's limit may never fit here, and queued it would block the queue."""
        spans = self.shards or [self.gpu]
        if beside_neighbours:
            room = min(shard.capacity_bytes - sum(other.resident_bytes for other in shard.instances if other is not self)
                       for shard in spans)
        else:
            room = min(shard.capacity_bytes for shard in spans)
        fits = fitting_tokens(room, self.resident_bytes, self.block_bytes, self.config.block_size)
        limit = self.deployment_max_model_len
        self.max_model_len = fits if limit is None else min(fits, limit)

    def exceeds_max_model_len(self, request: Request) -> bool:
        return request.prompt_tokens + request.output_tokens > self.max_model_len

    def busy_by(self, now: float) -> float:
        """Seconds its steps kept its GPU busy by ``now``, the running one's so far included (see ``Gpu.busy_by``)."""
        step = self.gpu.current
        if step is None or step.instance is not self or now <= step.start_s:
            return self.busy_s
        return self.busy_s + (now - step.start_s)

    # -- views -----------------------------------------------------------------------------------
    @property
    def kv_bytes(self) -> int:
        return self.blocks * self.block_bytes

    @property
    def num_requests(self) -> int:
        return len(self.waiting) + len(self.swapped) + len(self.running) + len(self.prefilling)

    @property
    def has_work(self) -> bool:
        # Lengths, the batch's first: compiled, a list's is read natively, and ``bool(a or b)`` tested each queue twice.
        return len(self.running) > 0 or len(self.prefilling) > 0 or len(self.waiting) > 0 or len(self.swapped) > 0

    def free_blocks(self) -> int:
        if self.shards is not None:
            return int(min(shard.capacity_bytes - shard.used_bytes() for shard in self.shards) // self.block_bytes)
        gpu = self.gpu  # Gpu.free_bytes, inlined: this is asked several times per step
        return int((gpu.capacity_bytes - gpu.used_bytes()) // self.block_bytes)

    def spare_blocks(self) -> int:
        """Free blocks left after this step's decodes have taken theirs."""
        return self.free_blocks() - self.decode_blocks_needed()

    def generated(self, request: Request) -> int:
        if request.state == "running":
            return request.gen_at_join + self.iteration - request.join_iter
        return request.generated

    def most_predicted_left(self) -> int:
        """The most predicted output tokens any request it holds has still to generate, at least 1 (what a
        policy's drain estimate multiplies by a step time), as of its last sync."""
        longest = 1
        iteration = self.iteration
        for request in self.running:  # ``generated`` inlined: a policy asks this at every plan of every busy instance
            left = request.predicted_output_tokens - (request.gen_at_join + iteration - request.join_iter)
            if left > longest:
                longest = left
        for queue in (self.prefilling, self.waiting, self.swapped):
            for request in queue:
                left = request.predicted_output_tokens - request.generated
                if left > longest:
                    longest = left
        return longest

    # -- batch membership ------------------------------------------------------------------------
    def _join_running(self, request: Request) -> None:
        request.state = "running"
        request.join_iter = self.iteration
        request.gen_at_join = request.generated
        self._joins += 1
        request.join_seq = self._joins
        tokens = request.prompt_tokens + request.generated
        self.running.append(request)
        self.context_tokens += tokens
        self.phases.add(tokens, self.iteration)
        self.finishing.push(request)

    def _leave_running(self, request: Request, popped: bool = False) -> None:
        request.generated = self.generated(request)
        tokens = request.prompt_tokens + request.generated
        self._remove_running(request)
        self.context_tokens -= tokens
        self.phases.remove(tokens, self.iteration)
        if not popped:
            self.finishing.remove(request)
        # Running sequences grow block by block through the phase histogram; settle the count now.
        request.blocks = blocks_for(tokens, self.config.block_size)
        request.state = "detached"

    def _remove_running(self, request: Request) -> None:
        """``remove_request(self.running, request)`` by bisection: the batch keeps the order its requests joined
        it in, which ``join_seq`` numbers (a scan of a full batch cost more than the rest of a request's exit)."""
        running, seq = self.running, request.join_seq
        low, high = 0, len(running)
        while low < high:
            middle = (low + high) >> 1
            if running[middle].join_seq < seq:
                low = middle + 1
            else:
                high = middle
        if low < len(running) and running[low] is request:
            running.pop(low)
        else:
            remove_request(running, request)  # the batch was reordered from outside: find it the slow way

    def release(self, request: Request) -> int:
        """Take a request out of whatever queue it is in here; return the KV blocks it held."""
        state = request.state
        if state == "running":
            self._leave_running(request)
        elif state == "prefilling":
            remove_request(self.prefilling, request)
        elif state == "waiting":
            self.waiting.remove(request)
        elif state == "swapped":
            self.swapped.remove(request)
        freed, request.blocks = request.blocks, 0
        if request.cache_blocks:
            self.blocks -= self._release_cached(request, freed)
        else:
            self.blocks -= freed
        return freed

    def _release_cached(self, request: Request, held: int) -> int:
        """Let go of a request's ``held`` blocks, the first of which are the prefix cache's: returns how
        many this instance no longer counts (its own, and cached ones nobody else holds, which turn idle)."""
        cache, path = self.prefix_cache, request.prefix_path
        assert cache is not None and path is not None
        shared = request.cache_blocks
        request.cache_blocks = 0
        self.gpu.releases += 1
        return held - shared + cache.release(path, shared, self.gpu.releases)

    # -- planning --------------------------------------------------------------------------------
    def advance(self, iterations: int) -> None:
        """Apply ``iterations`` decode iterations of the current batch to the counters."""
        if iterations <= 0:
            return
        new_blocks = self.phases.new_blocks(self.iteration, iterations)
        self.blocks += new_blocks
        self.context_tokens += len(self.running) * iterations
        self.iteration += iterations
        if new_blocks:
            self.gpu.settle_idle_cache(self)

    def decode_blocks_needed(self) -> int:
        return self.phases.next_blocks(self.iteration)

    def plan(self, engine: Engine, now: float, fast: bool) -> Step | None:
        """Form the next step at this iteration boundary, preempting when KV blocks run short."""
        # vLLM's order: running sequences get their blocks first (preempting if short), then swapped
        # ones come back, then waiting ones start; nothing new starts in a step that preempted, nor
        # while a swapped request still waits to come back (vLLM v0's scheduler; v1's preempted
        # requests wait at the head of the queue, to the same effect).
        transfer_s, preempted = self.owed_transfer_s, False
        self.owed_transfer_s = 0.0
        while self.running and self.decode_blocks_needed() > self.free_blocks():
            transfer_s = max(transfer_s, engine.preempt_for_blocks(self, now))
            preempted = True
        if not preempted and self.swapped:
            transfer_s += engine.resume_swapped(self, now + transfer_s)
        prefills: list[tuple[Request, int]] = []
        if self.prefilling:
            prefills, chunk_transfer_s, chunk_preempted = batching.continue_prefills(engine, self, now)
            transfer_s, preempted = max(transfer_s, chunk_transfer_s), preempted or chunk_preempted
        if self.waiting and not preempted and not self.swapped:
            batching.admit(engine, self, now, prefills)
        batch = len(self.running)
        forward = fast and not preempted and engine.may_fast_forward(self)
        if prefills:
            prefill_tokens = sum(chunk for _, chunk in prefills)
            prefill_quadratic = sum(chunk * (chunk + 2 * request.prefilled) for request, chunk in prefills)
            first = self.costs.mixed_step_s(batch, self.context_tokens, prefill_tokens, prefill_quadratic, len(prefills),
                                            self.gpu_share)
            decodes, after_batch, after_context = self._window_after_prefill(engine, prefills) if forward else (0, 0, 0)
            if decodes == 0:
                return Step(self, 1, None, batch, self.context_tokens + batch, prefills, first, transfer_s)
            coefficients = self.decode_coefficients(after_batch)
            return Step(self, 1 + decodes, coefficients, after_batch, after_context, prefills, first, transfer_s)
        if not batch:
            if transfer_s == 0 and preempted:
                # The step preempted its last sequence (by recompute) and so has nothing to run: the next step
                # starts at once, and may now bring back or admit what the preemption made room for.
                return self.plan(engine, now, fast)
            return None if transfer_s == 0 else self._transfer_only(transfer_s)
        # A pure decode step: the same sum ModelCosts.mixed_step_s makes, without its dispatch.
        coefficients = self.decode_coefficients(batch)
        first = coefficients.step_s(self.context_tokens)
        iterations = self._window() if forward and self._nothing_can_start(engine, after_prefill=False) else 1
        return Step(self, iterations, coefficients, batch, self.context_tokens + batch, [], first, transfer_s)

    def decode_coefficients(self, batch: int) -> StepCoefficients:
        """This instance's decode-step coefficients for ``batch`` sequences; cached here, since every step asks and
        the share never changes."""
        cached = self._coefficients.get(batch)
        if cached is None:
            cached = self._coefficients[batch] = self.costs.step_coefficients(batch, self.gpu_share)
        return cached

    def _transfer_only(self, transfer_s: float) -> Step:
        return Step(self, 0, None, 0, 0, [], 0.0, transfer_s)

    def _window(self) -> int:
        """Iterations until the batch could change by itself: the next completion or KV exhaustion.

        Outside events (arrivals, policy timers) end the window early through :meth:`Gpu.cut_window`."""
        limit = self.finishing.first() - self.iteration
        return max(1, self.phases.max_steps(self.iteration, self.free_blocks(), limit))

    def _window_after_prefill(self, engine: Engine, prefills: list[tuple[Request, int]]) -> tuple[int, int, int]:
        """Decode iterations that can follow this step's prefill iteration in the same event, and the batch
        size and context they start from; zeros when the batch could change at the boundary between.

        That boundary changes nothing by itself when every chunk completes its prompt, nobody finishes
        there, nothing else can start there and the next decode's KV fits: it is then a boundary inside a
        window like any other (an arrival or a load still cuts the window there)."""
        if engine.hooks_step or not self._nothing_can_start(engine, after_prefill=True):
            return 0, 0, 0
        if self._may_fill_waiting_prefix(engine, prefills):
            return 0, 0, 0
        following = self.iteration + 1
        finishing = self.finishing
        if finishing.requests and finishing.first() <= following:
            return 0, 0, 0
        limit = finishing.first() - following if finishing.requests else 1 << 62
        batch, context = len(self.running), self.context_tokens + len(self.running)
        joining: list[int] = []
        joining_tokens = 0
        for request, chunk in prefills:
            remaining = request.output_tokens - request.generated - 1
            if request.prefilled + chunk < request.prefill_target or remaining <= 0:
                return 0, 0, 0
            limit = min(limit, remaining)
            joining.append(request.prefill_target + 1)  # its tokens once the first one is out
            joining_tokens += request.prefill_target + 1
        free = self.free_blocks() - self.phases.next_blocks(self.iteration)
        for tokens in joining:
            self.phases.add(tokens, following)
        steps = self.phases.max_steps(following, free, limit)
        for tokens in joining:
            self.phases.remove(tokens, following)
        if steps < 1:
            return 0, 0, 0
        return steps, batch + len(joining), context + joining_tokens

    def _may_fill_waiting_prefix(self, engine: Engine, prefills: list[tuple[Request, int]]) -> bool:
        """Whether this step's chunks may put blocks in the prefix cache that the waiting head (any waiting
        request, when the queue's order changes with the clock) would find, so that it needs fewer free blocks at the
        boundary after them than it does now."""
        if self.prefix_cache is None or not self.waiting:
            return False
        if not engine.waiting_head_holds:
            if all(request.prefix_ids is None for request in self.waiting):
                return False
        elif self.waiting[0].prefix_ids is None:
            return False
        return any(request.prefix_path is not None for request, _ in prefills)

    def _nothing_can_start(self, engine: Engine, after_prefill: bool) -> bool:
        """Whether no waiting or swapped request can start at a boundary before the next completion, so that
        fast-forward may run to it (``after_prefill``: from the end of this step's prefill iteration).

        A full batch stays full, and KV room only shrinks while a batch decodes. Between decode iterations
        the token budget stays the same too, so an FCFS head that cannot start now cannot start later;
        after a prefill iteration the budget is whole again, and only a head without KV room stays out.
        A policy whose order changes with the clock may put another request at its head at any boundary: if it
        sorts by key, none of them may be able to start there; if not, the queue must be empty."""
        if not self.waiting or len(self.running) + len(self.prefilling) >= self.config.max_num_seqs:
            return True  # swapped requests come back by KV room and batch size alone: they stay out too
        if self.swapped:
            return True  # and while one is out, nothing waiting starts
        if not engine.waiting_head_holds:
            return engine.sorts_waiting_by_key and not batching.any_waiting_starts(engine, self, after_prefill)
        if not after_prefill:
            return True
        return batching.start_need(engine, self, self.waiting[0])[0] > self.spare_blocks()

    # -- completion ------------------------------------------------------------------------------
    def complete(self, engine: Engine, step: Step, iterations: int, now: float) -> None:
        """Apply the first ``iterations`` iterations of ``step``, which ended at ``now``."""
        if iterations <= 0:
            return
        if step.prefills:
            self.end_first_iteration(engine, step, now if iterations == 1 else step.start_s + step.elapsed_s(1))
            iterations -= 1
        self.advance(iterations)
        self._finish_due(engine, now)

    def end_first_iteration(self, engine: Engine, step: Step, now: float) -> None:
        """The first iteration of ``step``, holding prefill chunks, ended at ``now``: its decodes advance,
        completed prefills emit their first token and join the batch; the step decodes from here on."""
        self.advance(1)
        for request, chunk in step.prefills:
            self._finish_prefill_chunk(engine, request, chunk, now)
        step.prefills = []
        self._finish_due(engine, now)

    def _cache_filled_blocks(self, request: Request) -> None:
        """Hand the prompt blocks a chunk filled to the prefix cache, up to the first one cached already
        (another request filled it meanwhile: this copy stays the request's own until that one is evicted)."""
        cache, path = self.prefix_cache, request.prefix_path
        assert cache is not None and path is not None
        filled = min(request.prefilled // self.config.block_size, path.blocks)
        if request.cache_blocks < filled:
            request.cache_blocks = cache.insert_run(path, request.cache_blocks, filled)

    def _finish_due(self, engine: Engine, now: float) -> None:
        finishing = self.finishing
        while finishing.requests and finishing.first() <= self.iteration:
            request = finishing.pop()
            self._leave_running(request, popped=True)
            engine.finish(self, request, now)

    def _finish_prefill_chunk(self, engine: Engine, request: Request, chunk: int, now: float) -> None:
        request.prefilled += chunk
        if request.prefilled > request.prefilled_most:
            request.prefilled_most = request.prefilled
        if request.prefix_path is not None:
            self._cache_filled_blocks(request)
        if request.prefilled < request.prefill_target:
            return
        remove_request(self.prefilling, request)
        if request.prefill_target > request.prompt_tokens:
            engine.charge_recompute(request, now)
        request.generated += 1
        if request.generated == 1:
            request.first_token_s = now
        tokens = request.prompt_tokens + request.generated
        extra = blocks_for(tokens, self.config.block_size) - request.blocks
        request.blocks += extra
        self.blocks += extra
        if request.generated >= request.output_tokens:
            request.state = "detached"
            engine.finish(self, request, now)
        else:
            self._join_running(request)
