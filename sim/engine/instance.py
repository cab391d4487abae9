"""A model instance: one model's weights on a GPU, with vLLM-style continuous batching.

Queues follow vLLM's vocabulary: ``waiting`` (not yet prefilled, or dropped
for recompute), ``running`` (decoding, KV on the GPU), ``swapped`` (KV moved
to host RAM). Each call to :meth:`plan` forms the next step at an iteration
boundary; :meth:`complete` applies it when its time has passed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim.costs import ModelCosts, StepCoefficients
from sim.engine.kv import PhaseHistogram, blocks_for
from sim.engine.request import Request

if TYPE_CHECKING:  # imported for their types only: both modules import this one
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.gpu import Gpu

INF = float("inf")


@dataclass(slots=True)
class Step:
    """What one GPU step does: ``iterations`` decode iterations (fast-forward when > 1),
    optionally with prefill chunks, after ``transfer_s`` of KV swaps."""

    instance: "Instance"
    iterations: int
    coefficients: StepCoefficients | None
    batch: int
    context_tokens: int
    prefills: list[tuple[Request, int]] = field(default_factory=list)
    first_iteration_s: float = 0.0
    transfer_s: float = 0.0
    start_s: float = 0.0

    def elapsed_s(self, iterations: int) -> float:
        """Seconds from the step's start to the end of its ``iterations``-th iteration."""
        if iterations <= 0:
            return self.transfer_s if iterations == 0 else 0.0
        rest = 0.0
        if iterations > 1:
            assert self.coefficients is not None  # more than one iteration: a decode window
            rest = self.coefficients.steps_s(self.context_tokens + self.batch, self.batch, iterations - 1)
        return self.transfer_s + self.first_iteration_s + rest

    def iterations_done_by(self, seconds: float) -> int:
        """Whole iterations finished ``seconds`` after the start: the largest k with ``elapsed_s(k) <= seconds``.

        ``elapsed_s`` never decreases with k, so a guess from the closed form's quadratic splits the range
        exactly; when the guess is right (the usual case) two evaluations settle it, else a binary search does."""
        low, high = 0, self.iterations
        guess = min(max(self._guess_iterations(seconds), 0), high)
        if self.elapsed_s(guess) <= seconds:
            if guess == high or self.elapsed_s(guess + 1) > seconds:
                return guess
            low = guess + 1
        else:
            high = guess - 1
        while low < high:
            mid = (low + high + 1) // 2
            if self.elapsed_s(mid) <= seconds:
                low = mid
            else:
                high = mid - 1
        return low

    def _guess_iterations(self, seconds: float) -> int:
        """Approximately solve ``elapsed_s(k) = seconds`` for k >= 1 (only a hint: rounding may be off by one)."""
        rest = seconds - self.transfer_s - self.first_iteration_s
        if rest < 0 or self.coefficients is None:
            return 0
        # elapsed_s(1 + m) - elapsed_s(1) = half * m^2 + (step - half) * m, the first of them at step seconds.
        step = self.coefficients.step_s(self.context_tokens + self.batch)
        half = self.coefficients.per_context_token_s * self.batch / 2
        linear = step - half
        if half <= 0:
            return 1 + int(rest / step) if step > 0 else self.iterations
        return 1 + int((math.sqrt(linear * linear + 4 * half * rest) - linear) / (2 * half))


def remove_request(requests: list[Request], request: Request) -> None:
    """``requests.remove(request)`` by identity: ``list.remove`` tries ``==`` on every request before it,
    which for a full decode batch made this the dearest line of a step."""
    for i in range(len(requests)):
        if requests[i] is request:
            del requests[i]
            return
    raise ValueError(f"{request!r} is not in the queue")


class Instance:
    """One model resident (or loading, or draining) on one GPU."""

    def __init__(self, uid: int, model: int, name: str, costs: ModelCosts, gpu: Gpu, gpu_share: float,
                 engine_config: EngineConfig):
        self.uid = uid
        self.model = model
        self.name = name
        self.costs = costs
        self.gpu = gpu
        self.gpu_share = gpu_share
        self.config = engine_config
        self.status = "loading"
        self.weight_bytes = costs.gpu_weight_bytes(gpu_share)
        self.block_bytes = engine_config.block_size * costs.kv_bytes_per_token
        self.waiting: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefilling: list[Request] = []
        self.finish_heap: list[tuple[int, int, Request]] = []
        self.phases = PhaseHistogram(engine_config.block_size)
        self.iteration = 0
        self.context_tokens = 0
        self.blocks = 0
        self.ready_at_s = INF
        self.last_used_s = 0.0
        self.busy_s = 0.0
        # A MIG slice has a share of the GPU's SMs and memory bandwidth: every step is slower by its inverse.
        self.slowdown = 1.0 / gpu.compute_share
        self._coefficients: dict[int, tuple[StepCoefficients, StepCoefficients]] = {}

    # -- views -----------------------------------------------------------------------------------
    @property
    def kv_bytes(self) -> int:
        return self.blocks * self.block_bytes

    @property
    def num_requests(self) -> int:
        return len(self.waiting) + len(self.swapped) + len(self.running) + len(self.prefilling)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.swapped or self.running or self.prefilling)

    def free_blocks(self) -> int:
        gpu = self.gpu  # Gpu.free_bytes, inlined: this is asked several times per step
        return int((gpu.capacity_bytes - gpu.used_bytes()) // self.block_bytes)

    def spare_blocks(self) -> int:
        """Free blocks left after this step's decodes have taken theirs."""
        return self.free_blocks() - self.decode_blocks_needed()

    def generated(self, request: Request) -> int:
        if request.state == "running":
            return request.gen_at_join + self.iteration - request.join_iter
        return request.generated

    # -- batch membership ------------------------------------------------------------------------
    def _join_running(self, request: Request) -> None:
        request.state = "running"
        request.join_iter = self.iteration
        request.gen_at_join = request.generated
        tokens = request.prompt_tokens + request.generated
        self.running.append(request)
        self.context_tokens += tokens
        self.phases.add(tokens, self.iteration)
        heapq.heappush(self.finish_heap, (self.iteration + request.remaining_tokens, request.id, request))

    def _leave_running(self, request: Request, popped: bool = False) -> None:
        request.generated = self.generated(request)
        tokens = request.prompt_tokens + request.generated
        remove_request(self.running, request)
        self.context_tokens -= tokens
        self.phases.remove(tokens, self.iteration)
        if not popped:
            self.finish_heap = [entry for entry in self.finish_heap if entry[2] is not request]
            heapq.heapify(self.finish_heap)
        # Running sequences grow block by block through the phase histogram; settle the count now.
        request.blocks = blocks_for(tokens, self.config.block_size)
        request.state = "detached"

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
        self.blocks -= freed
        return freed

    # -- planning --------------------------------------------------------------------------------
    def advance(self, iterations: int) -> None:
        """Apply ``iterations`` decode iterations of the current batch to the counters."""
        if iterations <= 0:
            return
        new_blocks = self.phases.new_blocks(self.iteration, iterations)
        self.blocks += new_blocks
        self.context_tokens += len(self.running) * iterations
        self.iteration += iterations

    def decode_blocks_needed(self) -> int:
        return self.phases.next_blocks(self.iteration)

    def plan(self, engine: Engine, now: float, fast: bool) -> Step | None:
        """Form the next step at this iteration boundary, preempting when KV blocks run short."""
        # vLLM's order: running sequences get their blocks first (preempting if short), then swapped
        # ones come back, then waiting ones start; nothing new starts in a step that preempted.
        transfer_s, preempted = 0.0, False
        while self.running and self.decode_blocks_needed() > self.free_blocks():
            transfer_s = max(transfer_s, engine.preempt_for_blocks(self, now))
            preempted = True
        if not preempted and self.swapped:
            transfer_s += engine.resume_swapped(self, now + transfer_s)
        prefills = engine.admit(self, now, admit_new=not preempted) if self.prefilling or self.waiting else []
        batch = len(self.running)
        if prefills:
            coefficients = self._decode_coefficients(batch)[1] if batch else None
            prefill_tokens = sum(chunk for _, chunk in prefills)
            prefill_context = sum(request.prefilled for request, _ in prefills)
            first = self.slowdown * self.costs.mixed_step_s(batch, self.context_tokens, prefill_tokens, prefill_context,
                                                            self.gpu_share)
        elif batch:
            # A pure decode step: the same sum ModelCosts.mixed_step_s makes, without its dispatch.
            unscaled, coefficients = self._decode_coefficients(batch)
            first = self.slowdown * unscaled.step_s(self.context_tokens)
        else:
            return None if transfer_s == 0 else self._transfer_only(transfer_s)
        iterations = 1
        if fast and not prefills and not preempted and engine.may_fast_forward(self):
            iterations = self._window()
        return Step(self, iterations, coefficients, batch, self.context_tokens, prefills, first, transfer_s)

    def _decode_coefficients(self, batch: int) -> tuple[StepCoefficients, StepCoefficients]:
        """This instance's decode-step coefficients for ``batch`` sequences, as the cost model gives them and
        scaled by the MIG slowdown; cached here, since every step asks and the share never changes."""
        cached = self._coefficients.get(batch)
        if cached is None:
            unscaled = self.costs.step_coefficients(batch, self.gpu_share)
            scaled = unscaled
            if self.slowdown != 1.0:
                scaled = StepCoefficients(unscaled.base_s * self.slowdown, unscaled.per_context_token_s * self.slowdown)
            cached = self._coefficients[batch] = (unscaled, scaled)
        return cached

    def _transfer_only(self, transfer_s: float) -> Step:
        return Step(self, 0, None, 0, 0, [], 0.0, transfer_s)

    def _window(self) -> int:
        """Iterations until the batch could change by itself: the next completion or KV exhaustion.

        Outside events (arrivals, policy timers) end the window early through :meth:`Gpu.cut_window`."""
        limit = self.finish_heap[0][0] - self.iteration
        return max(1, self.phases.max_steps(self.iteration, self.free_blocks(), limit))

    # -- completion ------------------------------------------------------------------------------
    def complete(self, engine: Engine, step: Step, iterations: int, now: float) -> None:
        """Apply the first ``iterations`` iterations of ``step``, which ended at ``now``."""
        if iterations <= 0:
            return
        self.advance(iterations)
        for request, chunk in step.prefills:
            self._finish_prefill_chunk(engine, request, chunk, now)
        while self.finish_heap and self.finish_heap[0][0] <= self.iteration:
            _, _, request = heapq.heappop(self.finish_heap)
            self._leave_running(request, popped=True)
            engine.finish(self, request, now)

    def _finish_prefill_chunk(self, engine: Engine, request: Request, chunk: int, now: float) -> None:
        request.prefilled += chunk
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
