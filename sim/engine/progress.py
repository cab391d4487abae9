"""The progress guard: a run that stops making progress while work is outstanding is stopped with a diagnosis.

A policy can loop without end — two models evicting each other before either
finishes a request, or a timer re-checking a decision that never changes — and
a simulation of such a loop would run forever. The guard watches two figures
since the last step that made progress (emitted a token: a decode iteration, or a
prefill chunk that completes its prompt; or took a prompt further than it ever got:
chunks recomputed for ever are no progress), or since work arrived after a time with
none outstanding:
the loads of models unloaded in that time (reloads), and the simulated seconds passed. When either passes the scenario's limit (``engine.progress_max_loads``,
``engine.progress_horizon_s``) with requests outstanding, the run stops with
:class:`NoProgress`, naming the policy, the models and the loop. Time that passed quietly (nothing but
arrivals: no load, unload, policy timer or computation) is no loop and stops nothing, and neither is a step
running that will be progress when it ends (one step may outlast the horizon on a slow machine).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from sim.errors import MmsimError
from sim.files import counted

if TYPE_CHECKING:
    from sim.engine.engine import Engine


class NoProgress(MmsimError):
    """The run made no progress for longer than the scenario allows."""


class ProgressGuard:
    """Loads and simulated time since the engine last made progress, and the stop when they run away."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.counted_since_s = 0.0  # the engine's last progress time when the counts below started
        self.loads: Counter[str] = Counter()
        self.unloads: Counter[str] = Counter()
        self.reloads = 0  # loads of a model unloaded in that time: what a loop of evictions is made of
        self.timers = 0  # policy timers (view.call_at) fired in that time
        self.quiet_seen_s = 0.0  # the run was quiet with requests outstanding until then (see seen_quiet)

    @property
    def last_progress_s(self) -> float:
        """The last step that made progress, or the last arrival that found nothing outstanding if later: an
        idle gap between arrivals (a trace's quiet night) is no loop."""
        return max(self.engine.last_progress_s, self.engine.busy_since_s)

    @property
    def watched_since_s(self) -> float:
        """Where the time and counts the limits apply to start: the last progress, or the end of the last quiet
        time seen if later (a request outstanding that nothing serves makes no stretch of quiet a loop)."""
        return max(self.last_progress_s, self.quiet_seen_s)

    def seen_quiet(self, until_s: float) -> None:
        """A sample found the run quiet (:meth:`quiet`) with nothing due before ``until_s``: the time up to then is
        no loop. Without this, the first sample after a long quiet stretch, taken while a step that ends it has
        begun, would stop the run."""
        self.quiet_seen_s = until_s

    def _recount(self) -> None:
        """Start the counts afresh when a step has made progress (or work arrived after a lull) since they began."""
        since = self.watched_since_s
        if since != self.counted_since_s:
            self.counted_since_s = since
            self.loads.clear()
            self.unloads.clear()
            self.reloads = 0
            self.timers = 0

    def loaded(self, model: str, now: float) -> None:
        self._recount()
        self.loads[model] += 1
        # Only reloads count towards the limit: loads alone are bounded by memory, and a large cluster's first
        # placement may start thousands of them before any token.
        if self.unloads[model]:
            self.reloads += 1
            if self.reloads >= self.engine.config.progress_max_loads:
                self.stop(now)
        self.check(now)

    def unloaded(self, model: str) -> None:
        self._recount()
        self.unloads[model] += 1

    def timer_fired(self) -> None:
        self._recount()
        self.timers += 1

    def check(self, now: float) -> None:
        """Stop the run if nothing made progress for longer than the horizon while work is outstanding, unless
        the time passed quietly or a step running now is progress."""
        if self.engine.outstanding and now - self.watched_since_s > self.engine.config.progress_horizon_s:
            if not self.quiet() and not self.progress_under_way():
                self.stop(now)

    def progress_under_way(self) -> bool:
        """Whether a GPU is running a step that is progress (:meth:`Step.makes_progress`): one step may outlast the
        horizon (a long prompt's chunk on a slow machine) and its end is progress, so nothing loops."""
        for gpu in self.engine.gpus:
            step = gpu.current
            if step is not None and step.makes_progress():
                return True
        return False

    def quiet(self) -> bool:
        """Whether nothing but arrivals happened since the last progress: no load, unload or policy timer, and
        nothing computing or loading now. Then nothing loops (arrivals are finite); the outstanding requests
        are ones the policy left where nothing serves them (a model static never placed), dropped at the end."""
        self._recount()
        return not self.timers and not self.loads and not self.unloads and self.engine.settled()

    def stop(self, now: float) -> None:
        raise NoProgress(self.diagnosis(now))

    def diagnosis(self, now: float) -> str:
        engine = self.engine
        self._recount()  # the loads since the last progress only, not those of a lull before it
        head = (f"{engine.policy.label}: no progress (no token computed, no prompt prefilled further) since "
                f"t={self.last_progress_s:,.1f} s (now t={now:,.1f} s) with {counted(engine.outstanding, 'request')} outstanding")
        loads = sum(self.loads.values())
        if self.reloads:
            models = sorted(self.loads, key=lambda m: (-self.loads[m], m))
            named = " and ".join(f"{m} ({self.loads[m]:,} loads, {self.unloads[m]:,} unloads)" for m in models[:4])
            loop = "evict each other" if len(models) > 1 else "is loaded and unloaded over and over"
            head += f"; {loads:,} model loads in that time, {self.reloads:,} of them reloads: {named} {loop}"
        else:
            if self.timers:  # no eviction loop: what fired over and over is the policy's own timer
                head += f"; {self.timers:,} policy timers (view.call_at) fired in that time"
            head += f"; {self.waiting_summary()}"
        return (f"{head}. The run is stopped: the policy loops without serving anyone "
                f"(engine.progress_max_loads / progress_horizon_s set the limits; millions of events at one instant "
                f"always stop it)")

    def waiting_summary(self) -> str:
        """Where the outstanding requests sit, per model: what a person needs to see why nothing runs."""
        engine = self.engine
        held: Counter[str] = Counter()
        for model, queue in enumerate(engine.pending):
            if queue:
                held[f"{engine.model_names[model]} unplaced"] += len(queue)
        for instance in engine.instances:
            for state, queue in (("waiting", instance.waiting), ("swapped", instance.swapped)):
                if queue:
                    held[f"{instance.name} {state} on GPU {instance.gpu.index}"] += len(queue)
        if not held:
            return "nothing is queued anywhere"
        return "requests wait as " + ", ".join(f"{where}: {count:,}" for where, count in held.most_common(6))
