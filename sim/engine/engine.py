"""The engine: a SimPy model of a cluster serving several models, driven by a policy.

The engine *does* and *charges*; the policy only *decides* (see
:mod:`sim.policies.base`). The engine owns the GPUs, the instances on them,
the per-model queue of requests not yet placed, each node's PCIe link and
disk (FIFO timelines, so concurrent transfers and loads share them), and the
host RAM that holds swapped KV caches.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import simpy

from sim.costs import ModelCosts
from sim.engine import batching, limits, preemption, residency
from sim.engine.events import make_agenda
from sim.engine.gpu import Gpu
from sim.engine.instance import Instance
from sim.engine.kv import blocks_for
from sim.engine.prefix import EMPTY_PATH, PrefixPath, prefix_path
from sim.engine.memory import reserve_bytes, shard_fractions
from sim.engine.progress import ProgressGuard
from sim.engine.recorder import Recorder
from sim.engine.routing import Router
from sim.engine.request import Request
from sim.engine.transfers import Node
from sim.policies.base import Policy
from sim.policies.contract import checked_route, checked_victim, is_user_code


@dataclass(frozen=True)
class EngineConfig:
    """vLLM-like limits of every instance."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.9
    preemption_mode: str = "recompute"
    progress_horizon_s: float = 3600.0
    progress_max_loads: int = 1000
    prefix_caching: bool = True
    prefix_block_tokens: int = 512  # prompt tokens per trace prefix id (Mooncake's hash_ids: 512)


class Engine:
    """Runs one scenario's requests through a cluster under one policy."""

    def __init__(self, env: simpy.Environment, gpus: list[Gpu], nodes: list[Node], model_names: list[str],
                 costs: list[ModelCosts], config: EngineConfig, policy: Policy, fast: bool = True,
                 max_model_lens: list[int | None] | None = None, gpu_shares: list[float] | None = None,
                 router: Router | None = None, parallel: list[tuple[int, int]] | None = None,
                 pool_costs: list[list[ModelCosts]] | None = None, pool_first_gpus: list[int] | None = None):
        self.env = env
        self.gpus = gpus
        self.nodes = nodes
        # The GPUs of nodes that are up: what policies see and place on (a fixed cluster's are all of them).
        self.live_gpus = [gpu for gpu in gpus if nodes[gpu.node].up]
        # Each pool's costs per model (pools differ in GPU type), and where the pool's GPUs start.
        self.pool_costs = pool_costs or [costs]
        self.pool_first_gpus = pool_first_gpus or [0]
        # Instances an autoscaler is retiring: routed nothing new, unloaded once empty.
        self.retiring: set[Instance] = set()
        self.arrivals_by_model = [0] * len(model_names)
        self.model_names = model_names
        self.model_index = {name: i for i, name in enumerate(model_names)}
        self.costs = costs
        self.config = config
        self.policy = policy
        # Which per-request hooks the policy overrides; the others are not called at all. Plain attributes, not a
        # dict: they are read for every request and step (the policy is fixed for the engine's life).
        hooks = policy.overridden_hooks
        self.routes_itself: bool = "route" in hooks
        self.hooks_arrival: bool = "on_arrival" in hooks
        self.hooks_step: bool = "on_step" in hooks
        self.hooks_finish: bool = "on_finish" in hooks
        self.reorders_waiting: bool = policy.reorders_waiting
        self.placement_kept: bool = policy.keeps_placement  # see Policy.keeps_placement and residents_changed
        self.checks_policy: bool = is_user_code(policy)  # a user's order_waiting is checked (sim.policies.contract)
        # What fast-forward may assume of the waiting queue's order (see sim.policies.base.WAITING_ORDERS):
        order = policy.waiting_order if policy.reorders_waiting else "fcfs"
        self.sorts_waiting_by_key: bool = order in ("by-key", "fixed-key")  # any waiting request may come first
        self.waiting_head_holds: bool = order in ("fcfs", "fixed-key")  # a head that cannot start stays ahead
        self.fast = fast
        self.pending: list[deque[Request]] = [deque() for _ in model_names]
        self.pending_total = 0  # requests in all of ``pending``: asked on every finish, where 20 queues cost a scan
        self.instances: list[Instance] = []
        # The same instances by model (in load order), so routing an arrival need not scan them all.
        self.instances_by_model: list[list[Instance]] = [[] for _ in model_names]
        self.recorder = Recorder(model_names)
        self.placement: dict[int, dict] = {}
        self.pools: list = []  # the cluster's pools (sim.fleet.hardware.PoolLayout), set by the run that builds it
        self.fleet: object = None  # the autoscaling controller (sim.fleet.controller), when the run has one
        self.slos: list = []  # the scenario's SLO per model, set by the run that builds the engine
        self.outstanding = 0
        self.arrivals_done = False
        self.all_done = env.event()
        self._next_uid = 0
        self._admissions = 0
        # (tensor, pipeline) parallel degree of each model: an instance spans tp x pp GPUs.
        self.parallel = parallel or [(1, 1)] * len(model_names)
        self.reserve_bytes = [reserve_bytes(c.spec, config.max_num_batched_tokens, config.max_num_seqs, tp)
                              for c, (tp, _) in zip(costs, self.parallel)]
        self.shard_fractions = [shard_fractions(c.spec, tp, pp) for c, (tp, pp) in zip(costs, self.parallel)]
        shares = gpu_shares or [1.0] * len(model_names)
        wanted = max_model_lens or [None] * len(model_names)
        self.deployment_shares = shares  # each deployment's GPU layer share: a whole copy of it (1.0 unless offloaded)
        self.max_model_len = [limits.deployment_max_model_len(self, m, shares[m], wanted[m])
                              for m in range(len(model_names))]
        for model in range(len(model_names)):
            limits.check_offload_fits_host(self, model, shares[model])
        self.last_progress_s = 0.0  # when a step last made progress (Step.makes_progress)
        self.busy_since_s = 0.0  # when the last arrival found nothing outstanding
        self.prefix_query_tokens = [0] * len(model_names)  # prompt tokens looked up in prefix caches, per model
        self.prefix_hit_tokens = [0] * len(model_names)  # of those, found cached
        self.progress = ProgressGuard(self)
        from sim.policies.view import ClusterView  # the view wraps the engine; imported late to avoid a cycle
        self.view = ClusterView(self)
        self.router = router or Router()
        self.agenda = make_agenda(env)  # the GPUs' step ends and the sampler's samples (see sim.engine.events)
        for gpu in gpus:
            gpu.start(self)

    # -- hardware ------------------------------------------------------------------------------------
    def costs_on(self, model: int, gpu: Gpu) -> ModelCosts:
        """What ``model`` costs on ``gpu``'s hardware (its pool's profile)."""
        return self.pool_costs[gpu.pool][model]

    def refresh_live_gpus(self) -> None:
        """A node came up or went down: the GPUs policies see change."""
        self.live_gpus = [gpu for gpu in self.gpus if self.nodes[gpu.node].up]

    def routable(self, instance: Instance) -> bool:
        """Whether new requests may queue at ``instance``: ready or loading, and not being retired."""
        status = instance.status
        # len, not the set's truth: compiled, that is a generic call, and this is asked of every candidate
        return (status == "ready" or status == "loading") and (len(self.retiring) == 0 or instance not in self.retiring)

    # -- arrivals and routing ------------------------------------------------------------------------
    def footprint_bytes(self, model: int, gpu_share: float = 1.0) -> int:
        """GPU memory an instance of ``model`` takes before any KV block, on each of its GPUs: its weights there
        (its shard of them under tensor or pipeline parallelism) and its reserve."""
        return self.shard_weight_bytes(model, gpu_share) + self.reserve_bytes[model]

    def shard_weight_bytes(self, model: int, gpu_share: float = 1.0) -> int:
        weights = self.costs[model].gpu_weight_bytes(gpu_share)
        fraction = self.shard_fractions[model][0]
        return weights if fraction == 1.0 else math.ceil(weights * fraction)

    def block_bytes(self, model: int) -> int:
        """Bytes of one KV block of ``model`` on each of its GPUs."""
        block = self.config.block_size * self.costs[model].kv_bytes_per_token
        fraction = self.shard_fractions[model][1]
        return block if fraction == 1.0 else math.ceil(block * fraction)

    def shard_group(self, model: int, gpu: Gpu) -> list[Gpu] | None:
        """The GPUs an instance of ``model`` placed at ``gpu`` spans: the aligned run of tp x pp GPUs holding
        ``gpu`` (tensor-parallel ranks on one node, pipeline stages after one another); None for one GPU."""
        tp, pp = self.parallel[model]
        size = tp * pp
        if size == 1:
            return None
        pool_start = self.pool_first_gpus[gpu.pool]
        first = gpu.index - (gpu.index - pool_start) % size
        group = self.gpus[first:first + size]
        if len(group) < size or any(g.pool != gpu.pool or not self.nodes[g.node].up for g in group):
            return []
        return group

    def arrive(self, request: Request) -> None:
        limit = self.max_model_len[request.model]
        if request.prompt_tokens + request.output_tokens > limit:
            self.drop(request, "exceeds_max_model_len" if limit else "model_exceeds_gpu")
            return
        if self.outstanding == 0:
            self.busy_since_s = self.env._now  # the progress guard's clock starts when there is work again
        self.outstanding += 1
        arrived = self.arrivals_by_model  # ``[model] += 1`` written out: compiled, the augmented form is generic
        arrived[request.model] = arrived[request.model] + 1
        if not self.routes_itself:
            instance = self.router.pick(self, request)
        elif self.checks_policy:
            instance = checked_route(self, request)
        else:
            instance = self.policy.route(request, self.view)
        if instance is not None:
            self.assign(request, instance)
        else:
            self.unplace(request)
        if self.hooks_arrival:
            self.policy.on_arrival(request, self.view)

    def least_loaded(self, model: int, candidates: list[Instance] | None = None) -> Instance | None:
        """The default route: the routable instance of ``model`` (among ``candidates``, if given) holding the
        fewest requests, the oldest on a tie."""
        best: Instance | None = None
        best_held = 0
        for instance in self.instances_by_model[model] if candidates is None else candidates:
            if not self.routable(instance):
                continue
            held = instance.num_requests
            # Instances are listed oldest first, so the first of the fewest held is the oldest on a tie.
            if best is None or held < best_held or (held == best_held and instance.uid < best.uid):
                best, best_held = instance, held
        return best

    def unplace(self, request: Request) -> None:
        """Put ``request`` in its model's pending queue, for the policy to place later."""
        request.instance = None
        request.unplaced = True
        self.pending[request.model].append(request)
        self.pending_total += 1

    def withdraw(self, request: Request) -> None:
        """Take a waiting or swapped request out of its instance's queue, for a policy to queue it elsewhere."""
        instance = request.instance
        assert instance is not None and request.state in ("waiting", "swapped")
        instance.gpu.sync()
        instance.release(request)
        request.instance = None
        instance.gpu.kick()  # the queue's head may have changed: what could not start may start now

    def assign(self, request: Request, instance: Instance) -> None:
        """Queue ``request`` at ``instance`` (swapped KV resumes there if it is on the same node)."""
        if request.unplaced:
            self.pending[request.model].remove(request)
            request.unplaced = False
            self.pending_total -= 1
        if instance.exceeds_max_model_len(request):
            self.refuse(request)
            return
        request.instance = instance
        request.gpu = instance.gpu.index
        if request.state == "swapped" and request.kv_on_host_node == instance.gpu.node:
            instance.swapped.append(request)
        else:
            if request.state == "swapped":
                preemption.drop_host_kv(self, request)
                preemption.set_recompute(request)
            request.state = "waiting"
            instance.waiting.append(request)
        if instance.status == "ready" and self._could_start(instance, request):
            instance.gpu.kick()

    def residents_changed(self, gpus: list[Gpu]) -> None:
        """Instances loaded onto, or gone from, ``gpus``. Under a policy that keeps its placement (their neighbours
        stay for good), size the max_model_len of every instance there beside them, and refuse the queued requests
        a new neighbour's weights leave no room for (a running one is refused if it is preempted:
        :func:`sim.engine.preemption.preempt`). Under one that moves models, such a request waits for its
        neighbours to leave."""
        if not self.placement_kept:
            return
        for gpu in gpus:
            refused = False
            for instance in gpu.instances:
                instance.size_max_model_len(beside_neighbours=True)
                for request in [r for r in (*instance.waiting, *instance.swapped) if instance.exceeds_max_model_len(r)]:
                    instance.release(request)
                    self.refuse(request)
                    refused = True
            if refused:
                gpu.kick()  # a new head of a queue may start

    def refuse(self, request: Request) -> None:
        """Drop ``request``, given to an instance whose KV room can never hold it (its GPU is smaller than the one
        the deployment's ``max_model_len`` was sized on): vLLM rejects it there, and queued it would block the
        instance's queue for good."""
        preemption.drop_host_kv(self, request)
        request.instance = None
        self.drop(request, "exceeds_instance_max_model_len")
        self.outstanding -= 1
        self.check_done()

    def _could_start(self, instance: Instance, request: Request) -> bool:
        """Whether ``request`` might join ``instance``'s batch at its next iteration boundary.

        Only then is a fast-forward window (or a time-shared run it takes part in) worth cutting short. A cut
        restarts the closed-form times from the cut, so the answer must be that of the counters at now: free
        blocks only shrink while batches decode, so the counters as last synced settle a no, and a yes is asked
        again after a sync."""
        step, run = instance.gpu.current, instance.gpu.run
        if step is None or (self.reorders_waiting and not self.sorts_waiting_by_key):
            return True  # wherever the policy puts it, and whatever it does to the queue's order
        if step.instance is not instance and (run is None or instance not in run.instances):
            return True  # not running there, its instance may join the GPU's round robin and change its order
        if request.state == "swapped":
            if instance.swapped[0] is not request:
                return False  # older swapped requests, which come back first, are already blocked ahead of it
        elif instance.swapped or (len(instance.waiting) > 1 and not self.reorders_waiting):
            return False  # FCFS: older requests are already blocked ahead of it, or swapped ones hold it back
        if len(instance.running) + len(instance.prefilling) >= self.config.max_num_seqs:
            return False
        if step.prefills and request.prefix_ids is not None and instance.prefix_cache is not None:
            return True  # the chunks now running may fill blocks of its prefix: its need is not known yet
        need = self._start_blocks(instance, request)
        if need > instance.free_blocks():
            return False
        cache = instance.prefix_cache
        cached = 0 if cache is None else cache.cached_blocks
        instance.gpu.sync()
        # The step synced ends no prefill of this instance here (that case returned above), so its cache can only
        # have lost idle blocks, to decodes taking free memory: the need is asked again only then.
        if cache is not None and cache.cached_blocks != cached:
            need = self._start_blocks(instance, request)
        return need <= instance.free_blocks()

    def _start_blocks(self, instance: Instance, request: Request) -> int:
        """The KV blocks ``request`` needs to start (waiting) or come back (swapped) at ``instance``."""
        if request.state == "waiting":
            return batching.start_need(self, instance, request)[0]
        return blocks_for(request.context_tokens + 1, self.config.block_size)

    def drop(self, request: Request, reason: str) -> None:
        request.state = "dropped"
        request.drop_reason = reason
        self.recorder.request(request, reason)

    def prefix_path(self, request: Request) -> PrefixPath:
        """The prefix-cache segments of ``request``'s prompt blocks (none without prefix ids); made once."""
        path = request.prefix_path
        if path is None:
            if request.prefix_ids is None:
                return EMPTY_PATH
            path = request.prefix_path = prefix_path(request.prefix_ids, request.prompt_tokens,
                                                     self.config.prefix_block_tokens, self.config.block_size)
        return path

    def route(self, request: Request, candidates: list[Instance] | None = None) -> Instance | None:
        """The instance the scenario's routing rule picks for ``request`` (among ``candidates``, if given)."""
        return self.router.pick(self, request, candidates)

    def may_fast_forward(self, instance: Instance) -> bool:
        gpu = instance.gpu
        return len(gpu.instances) == 1 or len(gpu.active_instances()) == 1

    # -- preemption (sim.engine.preemption) ------------------------------------------------------------
    def resume_swapped(self, instance: Instance, now: float) -> float:
        """Swap in KV caches that fit; returns the transfer seconds the step waits for."""
        return preemption.resume_swapped(self, instance, now) if instance.swapped else 0.0

    def preempt_for_blocks(self, instance: Instance, now: float) -> float:
        """Preempt the policy's victim; returns the KV swap-out seconds the step waits for."""
        if self.checks_policy:
            victim, mode = checked_victim(self, instance)
        else:
            victim, mode = self.policy.choose_victim(instance, self.view)
        return preemption.preempt(self, instance, victim, mode, now)

    def preempt(self, instance: Instance, request: Request, mode: str, now: float) -> float:
        """Take ``request`` off the GPU by KV swap (``swap``) or drop-and-recompute (``recompute``); returns the
        seconds of device-to-host transfer the instance must wait for."""
        return preemption.preempt(self, instance, request, mode, now)

    def charge_recompute(self, request: Request, now: float) -> None:
        preemption.charge_recompute(self, request, now)

    # -- completion ----------------------------------------------------------------------------------
    def finish(self, instance: Instance, request: Request, now: float) -> None:
        instance.release(request)
        request.prefix_path = None  # O(prompt segments) per request: kept only while it runs
        request.finish_s = now
        request.state = "finished"
        self.recorder.request(request)
        self.outstanding -= 1
        if self.hooks_finish:
            self.policy.on_finish(request, instance, self.view)
        self.check_done()

    def after_step(self, instance: Instance) -> None:
        if self.hooks_step:
            self.policy.on_step(instance, self.view)

    def settled(self) -> bool:
        """Nothing is computing, loading, starting or unloading: only an arrival or a decision can change things."""
        for gpu in self.gpus:
            if gpu.current is not None:
                return False
        for instance in self.instances:
            status = instance.status
            if status == "loading" or status == "starting" or status == "draining":
                return False
        return True

    def check_done(self) -> None:
        if self.arrivals_done and self.outstanding == 0 and not self.all_done.triggered:
            self.all_done.succeed()

    def load(self, model: int, gpu: Gpu, gpu_share: float = 1.0, cold_start: list | None = None) -> Instance | None:
        return residency.load(self, model, gpu, gpu_share, cold_start)

    def unload(self, instance: Instance, mode: str = "swap", keep_on_host: bool = False,
               keep_prefix_cache: bool = False) -> bool:
        return residency.unload(self, instance, mode, keep_on_host, keep_prefix_cache)

    def next_admission(self) -> int:
        self._admissions += 1
        return self._admissions

    def new_uid(self) -> int:
        self._next_uid += 1
        return self._next_uid
