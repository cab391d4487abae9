"""``swap-aware``: swap a model in only when the work waiting for it pays for the swap penalty.

The paper's lesson is that preempting a model costs a per-(model, hardware)
constant dominated by the weight reload (KV transfer is ~1%). This policy
treats the swap penalty (unload + reload) as known and decides in
request-seconds, using only predicted output lengths. A reload is priced as
the engine will charge it (``sim.parallel``): a tensor- or pipeline-parallel
instance's nodes load their shards at once, each node's disk reading its
shards in turn, and a host-RAM copy comes over every GPU's own link, in
1/(tp x pp) of the one-GPU reload time; the victim's reload comes from host RAM
when ``keep_weights_on_host`` keeps its weights there.

* an absent model with pending requests is loaded into free memory at once
  (nothing is evicted);
* else in place of an *idle* instance at once: nobody is paused, the only cost
  is the idle instance's unload, which the waiting requests would sit out
  anyway;
* else in place of a *busy* instance only when its gain pays for the penalty.
  Gain of loading m = Σ over its pending requests of (predicted output tokens
  × one-sequence decode step at its prompt length) + Σ of the seconds they
  have already waited (the waiting term grows without bound, so no model
  starves). Cost = m's reload × its pending requests (each waits for the
  load) + the requests the victim holds × (its swap penalty +
  ``min_residency_s``): each is paused for the unload, for at least m's
  minimum residency, and for the reload. m is swapped in when
  gain ≥ ``benefit_ratio`` × cost. The ratio is high (16) because the cost
  compounds: the victim's requests become pending work for an absent model
  whose return evicts someone else, and a reload usually costs the SLO of
  every request it delays. On ``scenarios/mixed.yaml`` ratios 2, 4 and 8
  measured worse.
* victim rule: among ready instances whose removal makes room for m, idle ones
  first (least recently used first); a busy one must have been resident at
  least ``min_residency_s`` (no thrashing) and must not be about to finish — an
  instance whose held work drains (longest predicted remaining output × its
  current step time) in less than its own reload time is never evicted,
  waiting for it is cheaper. Among busy ones the smallest eviction cost wins;
  ties go to the most predicted remaining work (the penalty is the smallest
  fraction of what it still has to do).
  When no single instance makes room (a large model
  next to two small ones), the fewest on one GPU that do are evicted
  together, idle ones first, and their costs add up.
* a model placed next to others must leave ``kv_reserve_tokens`` of its own KV
  room (enough for one long prompt), so co-resident models cannot block each
  other with queued work that neither has room to start. At time 0 as many
  models as fit are loaded this way, smallest first.

A load is for the model's whole pending queue (the base hook routes them all
when it is ready), which amortises the reload over a batch.

Admission order: each instance's waiting queue is served shortest predicted
output first, with aging — a request's sort key is its predicted output tokens
minus ``aging_tokens_per_s`` × the seconds it has waited, so a long request
overtakes newer short ones after waiting long enough and never starves.
Short-first lets more requests meet their SLO when a GPU is behind; the key
changes only with time, so fast-forward and per-iteration runs agree.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sim.parallel import parallel_load_s
from sim.policies.base import Policy, QueueOrder, mypyc_attr, sort_queue
from sim.policies.fcfs_swap import Rechecks, eviction_group, gpu_with_room, start_bytes, unblock, youngest_victim
from sim.policies.registry import register

if TYPE_CHECKING:
    from sim.engine.gpu import Gpu
    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.policies.view import ClusterView


def drain_s(view: ClusterView, instance: Instance) -> float:
    """Predicted seconds until everything ``instance`` holds has finished, at its current batch's step time."""
    held = instance.num_requests
    if not held:
        return 0.0
    view.sync(instance.gpu)
    remaining = instance.most_predicted_left()
    return remaining * instance.costs.decode_step_s(held, instance.context_tokens, instance.gpu_share)


def pending_gain_s(view: ClusterView, model: int) -> float:
    """Request-seconds a load of ``model`` unlocks: predicted service of its pending requests plus their wait so far."""
    one_sequence = view.costs(model).step_coefficients(1)  # decode_step_s(1, ...)'s, looked up once, not per request
    now = view.now
    gain = 0.0
    for request in view.pending(model):
        gain += request.predicted_output_tokens * one_sequence.step_s(request.prompt_tokens)
        gain += now - request.arrival_s
    return gain


def load_s(view: ClusterView, model: int, gpu: Gpu) -> float:
    """What the engine will charge to load ``model`` at ``gpu`` while no other transfer holds the channels: every
    node of the GPUs the instance would span moves its share of the weights (sim.parallel), from the nodes'
    host-RAM copies when all of them hold one, as the engine loads; infinite where it cannot be placed."""
    group = view.shard_group(model, gpu)
    if group is not None and not group:
        return math.inf
    nodes = [g.node for g in group or [gpu]]
    from_host = all(view.host_cached(model, node) for node in set(nodes))
    return parallel_load_s(view.costs_on(model, gpu).reload_s(view.deployment_share(model), from_host), nodes, from_host)


class AgedShortestFirst(QueueOrder):
    """Shortest predicted output first, less ``aging_tokens_per_s`` per second waited. Every waiting request
    ages at the same rate, so the order is that of (predicted_output_tokens + aging_tokens_per_s x arrival_s,
    arrival_s, id): predicted tokens less the aging, shifted by the same amount for all. Computed without the
    clock, the order of two waiting requests is the same at every instant, in floating point too."""

    def __init__(self, aging_tokens_per_s: float):
        self.aging = float(aging_tokens_per_s)  # an int parameter multiplies as its float does

    def aged_tokens(self, request: Request) -> float:
        return request.predicted_output_tokens + self.aging * request.arrival_s

    def before(self, a: Request, b: Request) -> bool:
        aged_a, aged_b = self.aged_tokens(a), self.aged_tokens(b)
        if aged_a != aged_b:
            return aged_a < aged_b
        if a.arrival_s != b.arrival_s:
            return a.arrival_s < b.arrival_s
        return a.id < b.id


def unloading(view: ClusterView) -> bool:
    """An unload is in flight: memory is about to be freed, and its completion re-plans."""
    return any(i.status == "draining" for i in view.instances())


@mypyc_attr(allow_interpreted_subclasses=True)
class SwapAwarePolicy(Policy):
    name = "swap-aware"
    keeps_prefix_cache = False  # whether an unload keeps the instance's prefix cache in host RAM
    description = ("Swap a model in only when its waiting work pays for the (model, GPU) swap penalty; idle victims first, "
                   "shortest predicted output first with aging.")

    # Each parameter as the scenario gives it (sim.policies.registry.check_params checked it).
    benefit_ratio: Any
    min_residency_s: Any
    recheck_s: Any
    aging_tokens_per_s: Any
    kv_reserve_tokens: Any
    keep_weights_on_host: Any

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {"benefit_ratio": 16.0, "min_residency_s": 20.0, "recheck_s": 1.0, "aging_tokens_per_s": 0.5,
                "kv_reserve_tokens": 4096, "keep_weights_on_host": False}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.rechecks = Rechecks()
        self.plan_gains: dict[int, float] | None = None  # each candidate's gain, kept while a plan runs
        # Last time a request was routed to or finished on an instance: the same moments in
        # fast-forward and per-iteration mode, unlike step times.
        self.last_used_s: dict[int, float] = {}
        # Each instance's reload from disk, priced once: it depends on its model, layer share and nodes alone.
        self.disk_reload_s: dict[int, float] = {}

    def setup(self, view: ClusterView) -> None:
        # As many models resident as fit, smallest first: every model kept resident is a reload
        # its first requests do not wait for, and small models take the least memory each.
        for model in sorted(range(len(view.model_names)), key=lambda m: (view.costs(m).weight_bytes(), m)):
            self.load_full(view, model)

    def route(self, request: Request, view: ClusterView) -> Instance | None:
        target = view.route(request)
        if target is not None:
            self.last_used_s[target.uid] = view.now
        return target

    def order_waiting(self, instance: Instance, view: ClusterView) -> None:
        if len(instance.waiting) < 2:
            return  # the usual case at an admission: nothing to reorder
        sort_queue(instance.waiting, AgedShortestFirst(self.aging_tokens_per_s))

    waiting_order = "fixed-key"  # AgedShortestFirst: every request ages at the same rate

    def on_arrival(self, request: Request, view: ClusterView) -> None:
        if request.instance is None:  # not routed: its model has no instance that takes it
            self.plan(view)
        else:
            unblock(view, request.instance.gpu)

    def on_finish(self, request: Request, instance: Instance, view: ClusterView) -> None:
        self.last_used_s[instance.uid] = view.now
        unblock(view, instance.gpu)
        if view.has_pending():
            self.plan(view)

    def choose_victim(self, instance: Instance, view: ClusterView) -> tuple[Request, str]:
        return youngest_victim(instance, view)

    def on_instance_ready(self, instance: Instance, view: ClusterView) -> None:
        super().on_instance_ready(instance, view)
        self.last_used_s[instance.uid] = view.now
        unblock(view, instance.gpu)
        self.plan(view)

    def on_unloaded(self, instance: Instance, view: ClusterView) -> None:
        self.last_used_s.pop(instance.uid, None)
        self.disk_reload_s.pop(instance.uid, None)
        self.plan(view)

    # -- the decision ------------------------------------------------------------------------------
    def candidates(self, view: ClusterView) -> list[int]:
        """Absent models with pending requests, most gain first."""
        absent = [m for m in range(len(view.model_names)) if view.pending_count(m) and not view.instances_of(m)]
        return sorted(absent, key=lambda m: (-self.gain_s(view, m), m))

    def gain_s(self, view: ClusterView, model: int) -> float:
        """``pending_gain_s``, computed once per model in a plan (for its candidates' order, then to weigh a swap):
        a model's pending requests change within a plan only when it is loaded, and then it is not weighed again."""
        gains = self.plan_gains
        if gains is None:
            return pending_gain_s(view, model)
        gain = gains.get(model)
        if gain is None:
            gain = gains[model] = pending_gain_s(view, model)
        return gain

    def load_full(self, view: ClusterView, model: int) -> bool:
        """Load all of ``model`` where its weights and KV reserve already fit (costs no eviction); whether it did."""
        gpu = gpu_with_room(view, model, reserve_bytes=self.kv_reserve_bytes(view, model))
        return gpu is not None and view.load(model, gpu) is not None

    def place_in_free_memory(self, view: ClusterView, model: int) -> bool:
        """Bring ``model`` in without evicting anything; whether it did."""
        return self.load_full(view, model)

    def kv_reserve_bytes(self, view: ClusterView, model: int) -> float:
        """KV room ``model`` needs next to other models: ``kv_reserve_tokens`` of its own cache, and at least what
        its oldest pending request needs to start."""
        first = view.pending_head(model)
        head = start_bytes(view, first) if first is not None else 0
        return max(self.kv_reserve_tokens * view.costs(model).kv_bytes_per_token, head)

    def victim_reload_s(self, view: ClusterView, victim: Instance) -> float:
        """What bringing ``victim``'s model back onto its GPUs will cost, each node moving its share of the shards
        (sim.parallel): from host RAM when this policy keeps evicted weights there and every node has room for
        its part (or holds it already), else from disk."""
        if not self.keep_weights_on_host:
            known = self.disk_reload_s.get(victim.uid)
            if known is not None:
                return known
        spans = victim.shards or [victim.gpu]
        nodes = [g.node for g in spans]
        from_host = bool(self.keep_weights_on_host) and all(
            view.host_cached(victim.model, node)
            or view.host_room_for(node, victim.costs.weight_bytes() * nodes.count(node) // len(spans))
            for node in set(nodes))
        seconds = parallel_load_s(victim.costs.reload_s(victim.gpu_share, from_host), nodes, from_host)
        if not self.keep_weights_on_host:
            self.disk_reload_s[victim.uid] = seconds
        return seconds

    def eviction_cost_s(self, view: ClusterView, victim: Instance, reload_s: float | None = None) -> float:
        """What evicting ``victim`` costs its requests (``reload_s``: its ``victim_reload_s``, when known)."""
        held = victim.num_requests
        if held == 0:
            return victim.costs.unload_s(victim.gpu_share)
        if reload_s is None:
            reload_s = self.victim_reload_s(view, victim)
        # Each held request is paused for the unload, the newcomer's minimum residency and the reload.
        return held * (victim.costs.unload_s(victim.gpu_share) + reload_s + self.min_residency_s)

    def victims_for(self, view: ClusterView, model: int) -> tuple[list[Instance] | None, float, float]:
        """The instances to evict for ``model`` (see the module rule; usually one, several on one GPU when no single
        one makes room), what evicting them costs (their eviction costs added up), and the earliest time a busy
        one not yet eligible may become so."""
        groups: list[tuple[int, float, int, float, int, list[Instance]]] = []
        wait_until = math.inf
        reserve = self.kv_reserve_bytes(view, model)
        for gpu in view.gpus:
            eligible: list[tuple[Any, ...]] = []  # idle (0, ...) before busy (1, ...): see the module's victim rule
            busy_cost_s: dict[int, float] = {}  # each busy candidate priced once, for its order and its group's cost
            for instance in gpu.instances:
                if instance.status != "ready":
                    continue
                if not instance.has_work:
                    eligible.append((0, self.last_used_s.get(instance.uid, 0.0), instance.uid, instance))
                    continue
                settled_at = instance.ready_at_s + self.min_residency_s
                if view.now < settled_at:
                    wait_until = min(wait_until, settled_at)
                    continue
                drain, reload_s = drain_s(view, instance), self.victim_reload_s(view, instance)
                if drain < reload_s:
                    continue  # about to finish: its completion re-plans
                busy_cost_s[instance.uid] = self.eviction_cost_s(view, instance, reload_s)
                eligible.append((1, busy_cost_s[instance.uid], -drain, instance.uid, instance))
            group = eviction_group(view, model, [entry[-1] for entry in sorted(eligible)], reserve)
            if group is not None:
                busy, busy_cost, idle_lru = 0, 0.0, -math.inf  # added up in the group's order, as sum() would
                for victim in group:
                    if victim.has_work:
                        busy += 1
                        busy_cost += busy_cost_s[victim.uid]
                    idle_lru = max(idle_lru, self.last_used_s.get(victim.uid, 0.0))
                groups.append((busy, busy_cost, len(group), idle_lru, gpu.index, group))
        if not groups:
            return None, 0.0, wait_until
        best = min(groups, key=lambda entry: entry[:5])
        return best[5], best[1], wait_until

    def search_moot(self, view: ClusterView, model: int) -> bool:
        """Whether the victim search for ``model`` cannot change anything now, known without it (it prices every busy
        instance's drain: most of a plan, which runs at every finish while work is pending).

        Its outcomes are an eviction, a re-check at the earliest time a busy instance settles (no victim group),
        or a re-check ``recheck_s`` from now (none pays). A re-check already due within ``recheck_s`` makes the
        last moot, and the one before too when no busy instance settles before it; it remains to show that
        nothing is evicted: no GPU's idle instances make room alone (an idle group is evicted unpriced), and
        the cheapest busy instance's eviction cost, a bound on any group's (a group holds at least one and
        costs add up), does not pay for any GPU the group could be on (``pays_for`` grows no likelier to pay
        as the victims' cost grows)."""
        due_s = self.rechecks.due_at("plan")
        if not view.now < due_s <= view.now + self.recheck_s:
            return False
        cheapest_s = math.inf
        on_gpus: dict[int, Instance] = {}
        reserve = self.kv_reserve_bytes(view, model)
        for gpu in view.gpus:
            idle: list[Instance] = []
            busy: list[Instance] = []
            for instance in gpu.instances:
                if instance.status != "ready":
                    continue
                if not instance.has_work:
                    idle.append(instance)
                elif view.now < instance.ready_at_s + self.min_residency_s:
                    if instance.ready_at_s + self.min_residency_s < due_s:
                        return False  # settles before the re-check due: its own re-check would come first
                else:
                    busy.append(instance)
            idle.sort(key=lambda i: (self.last_used_s.get(i.uid, 0.0), i.uid))  # the search's order: its first
            if idle and eviction_group(view, model, idle, reserve) is not None:  # victim names the GPU it measures
                return False
            for instance in busy:
                cheapest_s = min(cheapest_s, self.eviction_cost_s(view, instance, self.victim_reload_s(view, instance)))
            if busy:
                for instance in idle + busy:  # a group's first victim, whose GPU its newcomer would load at
                    on_gpus.setdefault(instance.gpu.index, instance)
        if cheapest_s < 0:
            return False
        return not any(self.pays_for(view, model, [first], cheapest_s) for first in on_gpus.values())

    def pays_for(self, view: ClusterView, model: int, victims: list[Instance], victims_cost_s: float) -> bool:
        """Whether ``model``'s waiting work pays ``benefit_ratio`` times for its reload and the victims' swap penalties
        (``victims_cost_s``: their eviction costs added up)."""
        gain_s = self.gain_s(view, model)
        if gain_s < self.benefit_ratio * victims_cost_s:
            return False  # the reload only adds to the cost (a ratio is never negative): no need to price it
        cost_s = load_s(view, model, victims[0].gpu) * view.pending_count(model) + victims_cost_s
        return gain_s >= self.benefit_ratio * cost_s

    def plan(self, view: ClusterView) -> None:
        """Load absent models into free memory or in place of idle instances; swap one in for a busy one when it pays."""
        self.plan_gains = {}
        try:
            self._plan(view)
        finally:
            self.plan_gains = None

    def _plan(self, view: ClusterView) -> None:
        waiting = False
        for model in self.candidates(view):
            if self.place_in_free_memory(view, model):
                continue
            if unloading(view):
                continue  # memory is about to change; the unload finishing re-plans
            if self.search_moot(view, model):
                waiting = True
                continue
            victims, victims_cost_s, wait_until = self.victims_for(view, model)
            if victims is None:
                if wait_until < math.inf:
                    self.rechecks.at(view, "plan", wait_until, self.plan)
                continue
            if not any(v.has_work for v in victims) or self.pays_for(view, model, victims, victims_cost_s):
                for victim in victims:
                    view.unload(victim, mode="swap", keep_on_host=self.keep_weights_on_host,
                                keep_prefix_cache=self.keeps_prefix_cache)
                return
            waiting = True
        if waiting:
            # The gain grows as requests wait: look again shortly.
            self.rechecks.at(view, "plan", view.now + self.recheck_s, self.plan)


register(SwapAwarePolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
