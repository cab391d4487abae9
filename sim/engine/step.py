"""A GPU step: the iterations one SimPy event stands for, and their closed-form timing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from sim.costs import StepCoefficients
from sim.engine.request import Request

if TYPE_CHECKING:  # the instance module imports this one
    from sim.engine.instance import Instance


class Step:
    """What one GPU step does: after ``transfer_s`` of KV swaps, a first iteration (decodes, plus the
    prefill chunks in ``prefills``) taking ``first_iteration_s``, then ``iterations - 1`` decode
    iterations of ``batch`` sequences (fast-forward), whose context starts at ``next_context_tokens``
    and grows by ``batch`` per iteration, each costing ``coefficients`` at its context. ``applied``: how
    many of them a sync has applied to the instance's counters already (never the last: the step's end
    applies it). Every time is a sum from ``start_s``, whatever was applied: a sync only reads the clock.

    A plain class: as a mypyc dataclass it crashed the compiled build on import, its annotations
    naming a class of the instance module, which imports this one."""

    __slots__ = ("instance", "iterations", "coefficients", "batch", "next_context_tokens", "prefills",
                 "first_iteration_s", "transfer_s", "start_s", "applied")

    def __init__(self, instance: Instance, iterations: int, coefficients: StepCoefficients | None, batch: int,
                 next_context_tokens: int, prefills: list[tuple[Request, int]], first_iteration_s: float,
                 transfer_s: float):
        self.instance = instance
        self.iterations = iterations
        self.coefficients = coefficients
        self.batch = batch
        self.next_context_tokens = next_context_tokens
        self.prefills = prefills
        self.first_iteration_s = first_iteration_s
        self.transfer_s = transfer_s
        self.start_s = 0.0
        self.applied = 0

    def elapsed_s(self, iterations: int) -> float:
        """Seconds from the step's start to the end of its ``iterations``-th iteration."""
        if iterations <= 0:
            return self.transfer_s if iterations == 0 else 0.0
        rest = 0.0
        if iterations > 1:
            assert self.coefficients is not None  # more than one iteration: a decode window
            rest = self.coefficients.steps_s(self.next_context_tokens, self.batch, iterations - 1)
        return self.transfer_s + self.first_iteration_s + rest

    def makes_progress(self) -> bool:
        """Whether the step is progress for the guard (asked before the step is applied): it emits a token (a
        decode, or a chunk that completes its prompt), or a chunk takes a prompt further than any of its
        request's prefills did. Chunks recomputing what was prefilled before are none: a prefill preempted and
        recomputed for ever, its model evicted and loaded again, would otherwise hide the loop; a first pass
        over a prompt whose chunks each take long (a long prompt on a slow machine) is."""
        if self.batch or self.iterations > 1:
            return True
        for request, chunk in self.prefills:
            reached = request.prefilled + chunk
            if reached >= request.prefill_target or reached > request.prefilled_most:
                return True
        return False

    def remaining(self) -> int:
        """Iterations not yet applied, the one running included."""
        return self.iterations - self.applied

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
        return last_at_most(self.elapsed_s, seconds, low, high)

    def _guess_iterations(self, seconds: float) -> int:
        """Approximately solve ``elapsed_s(k) = seconds`` for k >= 1 (only a hint: rounding may be off by one)."""
        rest = seconds - self.transfer_s - self.first_iteration_s
        if rest < 0 or self.coefficients is None:
            return 0
        # elapsed_s(1 + m) - elapsed_s(1) = half * m^2 + (step - half) * m, the first of them at step seconds.
        step = self.coefficients.step_s(self.next_context_tokens)
        half = self.coefficients.per_context_token_s * self.batch / 2
        linear = step - half
        if half <= 0:
            return 1 + int(rest / step) if step > 0 else self.iterations
        return 1 + int((math.sqrt(linear * linear + 4 * half * rest) - linear) / (2 * half))


def last_at_most(value_of: Callable[[int], float], bound: float, low: int, high: int) -> int:
    """The largest m in [``low``, ``high``] with ``value_of(m) <= bound``, by bisection: ``value_of`` never
    decreases, and ``value_of(low) <= bound`` (or ``low`` is the answer by convention)."""
    while low < high:
        middle = (low + high + 1) // 2
        if value_of(middle) <= bound:
            low = middle
        else:
            high = middle - 1
    return low
