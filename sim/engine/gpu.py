"""A GPU (or MIG slice): memory for weights and KV blocks, and the loop that runs its instances.

Co-resident instances time-share the GPU: their iterations serialise, one
instance's step after another's, round robin. When a single instance has
work, its decode iterations are fast-forwarded: one SimPy event stands for
many iterations, and the window is cut short at the next iteration boundary
when something that could change the batch happens (an arrival, a load).
"""

from __future__ import annotations

import simpy

from sim.engine.events import scheduled_event
from sim.engine.instance import Instance, Step


class Gpu:
    """One GPU's memory and its execution loop."""

    def __init__(self, env: simpy.Environment, index: int, node: int, capacity_bytes: int, compute_share: float = 1.0):
        self.env = env
        self.index = index
        self.node = node
        self.capacity_bytes = capacity_bytes
        self.compute_share = compute_share
        self.instances: list[Instance] = []
        self.busy_s = 0.0
        self.current: Step | None = None
        self._wake: simpy.Event | None = None
        self._window_end: simpy.Event | None = None
        self._turn = 0
        self.blocked: set[Instance] = set()

    # -- memory ------------------------------------------------------------------------------------
    def used_bytes(self) -> int:
        if len(self.instances) == 1:  # the common case, on the hot path of every step
            only = self.instances[0]
            return only.weight_bytes + only.blocks * only.block_bytes
        return sum(instance.weight_bytes + instance.blocks * instance.block_bytes for instance in self.instances)

    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes()

    def in_flight_bytes(self) -> int:
        """KV the step now running will allocate when it ends (its decodes' new blocks)."""
        step = self.current
        if step is None or step.iterations < 1 or not step.batch:
            return 0
        instance = step.instance
        return instance.phases.new_blocks(instance.iteration, step.iterations) * instance.block_bytes

    @property
    def current_done(self) -> simpy.Event:
        """Fires when the step now running ends."""
        return self._window_end

    # -- execution ---------------------------------------------------------------------------------
    def active_instances(self) -> list[Instance]:
        return [i for i in self.instances if i.status == "ready" and i.has_work]

    def kick(self) -> None:
        """Something changed on this GPU: wake the loop, or end a fast-forward window early."""
        self.blocked.clear()
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        elif self.current is not None and self.current.iterations > 1:
            self.cut_window()

    def sync(self) -> None:
        """Make the running instance's counters reflect the iterations finished by now."""
        step = self.current
        if step is None or step.iterations <= 1 or step.prefills:
            return
        done = step.iterations_done_by(self.env.now - step.start_s)
        if done <= 0:
            return
        elapsed = step.elapsed_s(done)
        step.instance.advance(done)
        step.start_s += elapsed
        step.iterations -= done
        step.context_tokens = step.instance.context_tokens
        step.transfer_s = 0.0
        step.first_iteration_s = step.coefficients.step_s(step.context_tokens)
        step.instance.busy_s += elapsed
        self.busy_s += elapsed

    def cut_window(self) -> None:
        """End the current fast-forward window at the first iteration boundary from now."""
        self.sync()
        step = self.current
        if step is None or step.iterations <= 1:
            return
        step.iterations = 1
        self._reschedule_end(step.start_s + step.elapsed_s(1) - self.env.now)

    def _reschedule_end(self, delay: float) -> None:
        """Move the end of the running step earlier: whoever waits for it (the loop, a drain) now
        waits for a new event, and the old one fires later with nobody listening."""
        old = self._window_end
        self._window_end = scheduled_event(self.env, delay)
        self._window_end.callbacks, old.callbacks = old.callbacks, []

    def _next_instance(self) -> Instance | None:
        if len(self.instances) == 1:
            only = self.instances[0]
            return only if only.status == "ready" and only.has_work and only not in self.blocked else None
        active = [i for i in self.active_instances() if i not in self.blocked]
        if not active:
            return None
        self._turn = (self._turn + 1) % len(active)
        return active[self._turn]

    def run(self, engine):
        """The GPU's loop: pick an instance, run its step, apply it, repeat."""
        env = self.env
        while True:
            instance = self._next_instance()
            if instance is None:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            step = instance.plan(engine, env.now, engine.fast)
            if step is None:
                # Blocked (e.g. no KV room while a co-resident instance holds it) until something changes.
                self.blocked.add(instance)
                continue
            step.start_s = env.now
            self.current = step
            self._window_end = scheduled_event(self.env, step.elapsed_s(step.iterations))
            yield self._window_end
            self.current = None
            now = env.now
            elapsed = now - step.start_s  # sync may have moved the start on
            instance.busy_s += elapsed
            self.busy_s += elapsed
            instance.last_used_s = now
            instance.complete(engine, step, step.iterations, now)
            self.blocked.clear()
            engine.after_step(instance)
