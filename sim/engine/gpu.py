"""A GPU (or MIG slice): memory for weights and KV blocks, and the loop that runs its instances.

Co-resident instances time-share the GPU: their iterations serialise, one
instance's step after another's, round robin. When a single instance has
work, its decode iterations are fast-forwarded: one entry in SimPy's event
queue stands for many iterations, and the window is cut short at the next
iteration boundary when something that could change the batch happens (an
arrival, a load). When several have work and each of them only decodes (or
waits for room, passed over), one entry stands for a run of their iterations
in turn (:mod:`sim.engine.timeshare`), cut short the same way.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import simpy

from sim.engine.events import Agenda, AgendaEntry, process_now
from sim.engine.instance import Instance
from sim.engine.preemption import apply_policy_preemptions
from sim.engine.prefix import evict_oldest
from sim.engine.step import Step
from sim.engine.timeshare import TimeSharedRun, start_run

if TYPE_CHECKING:
    from sim.engine.engine import Engine


class Gpu(AgendaEntry):
    """One GPU's memory and its execution loop: its due time on the agenda is its running step's end (or a
    wake-up of its idle loop)."""

    # As Instance's: no attributes but these in either build.
    __slots__ = ("env", "index", "node", "pool", "capacity_bytes", "compute_share", "instances", "busy_s", "current",
                 "run", "idle", "_done", "_turn", "_synced_s", "blocked", "_engine", "_agenda", "releases")

    _agenda: Agenda  # the engine's, from start()

    def __init__(self, env: simpy.Environment, index: int, node: int, capacity_bytes: int, compute_share: float = 1.0,
                 pool: int = 0):
        super().__init__()
        self.env = env
        self.index = index
        self.node = node
        self.pool = pool  # the cluster's node pool this GPU belongs to (its hardware profile, its price)
        self.capacity_bytes = capacity_bytes
        self.compute_share = compute_share
        self.instances: list[Instance] = []
        self.busy_s = 0.0
        self.current: Step | None = None  # the step running (in a time-shared run: its iteration running)
        self.run: TimeSharedRun | None = None  # the time-shared run in flight, if any: it ends at the due time
        self.idle = True  # nothing to run: the next kick starts a step
        self._done: simpy.Event | None = None  # what a SimPy process waits on for the running step's end
        self._turn = 0
        self._synced_s = math.nan  # the last instant synced at: a second sync then finds nothing more done
        self.blocked: set[Instance] = set()
        self._engine: Engine | None = None
        self.releases = 0  # orders the releases of cached prefix blocks on this GPU, for eviction

    # -- memory ------------------------------------------------------------------------------------
    def used_bytes(self) -> int:
        if len(self.instances) == 1:  # the common case, on the hot path of every step
            only = self.instances[0]
            return only.resident_bytes + only.blocks * only.block_bytes
        return sum(instance.resident_bytes + instance.blocks * instance.block_bytes for instance in self.instances)

    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes()

    def idle_cache_bytes(self) -> int:
        """Memory held by cached prefix blocks no request holds: free to allocate, evicted when needed."""
        return sum(i.prefix_cache.idle_blocks * i.block_bytes for i in self.instances if i.prefix_cache is not None)

    def settle_idle_cache(self, allocating: Instance) -> None:
        """``allocating`` just took free blocks, some of which may have been idle cached ones (its own, or on a
        shared GPU any instance's): evict those. The common case, one instance with nothing idle, costs a check."""
        if len(self.instances) > 1 or (allocating.prefix_cache is not None and allocating.prefix_cache.idle_blocks):
            self.evict_idle_cache()

    def evict_idle_cache(self) -> None:
        """Evict idle cached blocks, released longest ago first across this GPU's instances, until the rest
        fit in the free memory (allocations take free blocks, and an idle cached block is a free one)."""
        over = self.idle_cache_bytes() - self.free_bytes()
        if over > 0:
            evict_oldest([(i.prefix_cache, i.block_bytes) for i in self.instances if i.prefix_cache is not None], over)

    def in_flight_bytes(self) -> int:
        """KV the iteration now running will allocate when it ends (its decodes' new blocks).

        Only that iteration: a fast-forward window is cut at its end as soon as anything acts on what
        it reads here, so counting the rest of the window would make fast and exact mode disagree.
        Callers sync first, so that the window's counters stand at the iteration now running."""
        step = self.current
        if step is None or step.remaining() < 1:
            return 0
        instance = step.instance
        return instance.phases.next_blocks(instance.iteration) * instance.block_bytes

    @property
    def current_done(self) -> simpy.Event:
        """Fires when the step now running ends (right after the GPU has applied it and planned its next)."""
        if self._done is None:
            self._done = simpy.Event(self.env)
        return self._done

    # -- execution ---------------------------------------------------------------------------------
    def active_instances(self) -> list[Instance]:
        """Instances with work whose steps this GPU runs (a parallel instance's run on its first GPU)."""
        return [i for i in self.instances if i.status == "ready" and i.has_work and i.gpu is self]

    def kick(self) -> None:
        """Something changed on this GPU: wake the loop, or end a fast-forward window (or run) early."""
        self.blocked.clear()
        if self.idle:
            # Woken by an event of its own, after whatever else happens at this instant (e.g. more arrivals).
            self.idle = False
            self._agenda.schedule(self, self.env._now)
        elif self.run is not None or (self.current is not None and self.current.remaining() > 1):
            self.cut_window()

    def sync(self) -> None:
        """Make the running instances' counters reflect the iterations finished by now."""
        self._sync_to(self.env._now)  # SimPy's clock itself: its ``now`` property is a Python call

    def _sync_to(self, now: float) -> None:
        # Policies sync every GPU for each model they weigh: many times at one instant. After the first, whatever
        # runs there has done nothing more (a step or run started since starts now). What a sync applies is a
        # function of the clock alone (times are sums from the window's start, busy seconds credited whole at
        # its end), so that how often a policy looks never moves a result, not even in its last bits.
        if now == self._synced_s:
            return
        self._synced_s = now
        # Only the iterations that end before now: one ending at now is applied after what happens at now (an
        # arrival there joins the next iteration, as in per-iteration mode, where arrivals come first). ``done``
        # counts those within ``now - start``; at a tie, or where that difference rounded, the absolute end
        # decides (it can only be later: an iteration past the difference never ends before now).
        run = self.run
        if run is not None:
            done = run.done_by(now - run.start_s)
            while done > run.applied and run.start_s + run.elapsed_s(done) >= now:
                done -= 1
            self._advance_run(run, done)
            return
        step = self.current
        if step is None or step.iterations <= 1:
            return
        # Never the last iteration: the step's end applies it, and finishes the requests it completes.
        done = min(step.iterations_done_by(now - step.start_s), step.iterations - 1)
        while done > step.applied and step.start_s + step.elapsed_s(done) >= now:
            done -= 1
        if done <= step.applied:
            return
        engine = self._engine
        assert engine is not None
        instance = step.instance
        if step.prefills:  # until the first iteration is applied
            instance.end_first_iteration(engine, step, step.start_s + step.elapsed_s(1))
            instance.advance(done - 1)
        else:
            instance.advance(done - step.applied)
        step.applied = done
        ended = step.start_s + step.elapsed_s(done)
        # What the finished iterations' ends would have set (_step_done): another GPU's step may have ended later.
        instance.last_used_s = ended
        if engine.last_progress_s < ended:
            engine.last_progress_s = ended

    def _advance_run(self, run: TimeSharedRun, done: int) -> None:
        """Apply the first ``done`` iterations of ``run``: the step running is then the iteration after them."""
        if done <= run.applied:
            return
        assert self._engine is not None
        run.apply(self._engine, done)
        self._turn = run.turn
        self.current = run.running_step()

    def cut_window(self) -> None:
        """End the current fast-forward window (or time-shared run) at the first iteration boundary from now."""
        now: float = self.env._now
        self._sync_to(now)
        step = self.current
        if self.run is not None:
            self.run = None
            assert step is not None
            self._agenda.schedule(self, now + max(step.start_s + step.elapsed_s(1) - now, 0.0))  # the end moves earlier
            return
        if step is None or step.remaining() <= 1:
            return
        step.iterations = step.applied + 1
        self._agenda.schedule(self, now + max(step.start_s + step.elapsed_s(step.iterations) - now, 0.0))

    def _next_instance(self) -> Instance | None:
        if len(self.instances) == 1:
            only = self.instances[0]
            return only if only.status == "ready" and only.has_work and only not in self.blocked and only.gpu is self else None
        active = [i for i in self.active_instances() if i not in self.blocked]
        if not active:
            return None
        self._turn = (self._turn + 1) % len(active)
        return active[self._turn]

    def start(self, engine: Engine) -> None:
        """Attach the GPU's loop to ``engine``; it idles until the first kick.

        The loop (pick an instance, run its step, apply it when its time is up, repeat) is a chain of due times
        on the engine's agenda rather than a SimPy process: one per step (see :mod:`sim.engine.events`) instead
        of a generator resumed through the process machinery, on the hottest path of a run."""
        self._engine = engine
        self._agenda = engine.agenda

    def _next_step(self, now: float) -> None:
        engine = self._engine
        assert engine is not None
        while True:
            instance = self._next_instance()
            if instance is None:
                self.idle = True
                return
            step = instance.plan(engine, now, engine.fast)
            if step is not None:
                break
            # Blocked (e.g. no KV room while a co-resident instance holds it) until something changes.
            self.blocked.add(instance)
        self.settle_idle_cache(instance)  # the step's allocations took free blocks
        step.start_s = now
        self.current = step
        end_s = step.elapsed_s(step.iterations)
        if len(self.instances) > 1 and step.iterations == 1 and engine.fast:
            run = self._time_shared_run(engine, step)
            if run is not None:
                self.run = run
                end_s = run.elapsed_s(run.iterations)
        self._agenda.schedule(self, now + max(end_s, 0.0))

    def _time_shared_run(self, engine: Engine, step: Step) -> TimeSharedRun | None:
        """A run of this GPU's active instances' decode iterations from ``step``, the one just planned, if one
        can stand for two or more of them (see :mod:`sim.engine.timeshare`)."""
        if engine.hooks_step or step.prefills or step.transfer_s != 0.0 or step.coefficients is None:
            return None  # an on_step hook is called at every boundary
        active = self.active_instances()
        if len(active) < 2:
            return None
        shards = step.instance.shards  # instances sharing a GPU span the same GPUs: each allocates on all of them
        free = self.free_bytes() if shards is None else min([shard.free_bytes() for shard in shards])
        return start_run(engine, active, self._turn, step, free)

    def entry_due(self, now: float) -> None:
        """This GPU's due time ``now`` came (SimPy's clock stands at it): its running step ends, or its idle loop
        wakes up."""
        if self.current is None:
            self._next_step(now)
        else:
            self._step_done(now)

    def _step_done(self, now: float) -> None:
        run = self.run
        if run is not None:  # its last iteration ends now: the ones before it are applied, it ends as a step
            self.run = None
            self._advance_run(run, run.iterations - 1)
        step, engine = self.current, self._engine
        assert step is not None and engine is not None
        self.current = None
        instance = step.instance
        elapsed = now - step.start_s  # the whole step: syncs credit no busy time
        instance.busy_s += elapsed
        self.add_busy(instance, elapsed)
        instance.last_used_s = now
        if step.makes_progress():
            engine.last_progress_s = now  # read by the progress guard; one store per step on the hot path
        instance.complete(engine, step, step.remaining(), now)
        if instance.policy_preemptions:
            apply_policy_preemptions(engine, instance, now)
        self.blocked.clear()
        engine.after_step(instance)
        self._next_step(now)
        done = self._done
        if done is not None:
            self._done = None  # a waiter that finds the next step its instance's waits on a new one
            process_now(done)

    def busy_by(self, now: float) -> float:
        """Busy seconds by ``now``: those of the steps ended, and the running step's so far (a step is credited as it
        ends, and a long prefill is one step: a sample or a utilisation reading in its middle saw the GPU idle)."""
        step = self.current
        if step is None:
            for instance in self.instances:
                if instance.gpu is not self:  # a parallel instance: its first GPU runs the steps, on all of its GPUs
                    step = instance.gpu.current
                    break
        if step is None or now <= step.start_s:
            return self.busy_s
        return self.busy_s + (now - step.start_s)

    def add_busy(self, instance: Instance, elapsed: float) -> None:
        """A step of ``instance`` kept this GPU busy, and every other GPU it spans."""
        self.busy_s += elapsed
        if instance.shards is not None:
            for shard in instance.shards:
                if shard is not self:
                    shard.busy_s += elapsed
