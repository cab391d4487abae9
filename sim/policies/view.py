"""The read-only view of the cluster that policies see, and the actions they may ask for."""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any, Callable

from sim.errors import MmsimError
from sim.files import cut
from sim.policies.contract import check_target, checked_order_waiting

if TYPE_CHECKING:  # the engine imports this module: its types are for the type checker and mypyc only
    from sim.costs import ModelCosts
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.gpu import Gpu
    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.engine.routing import Router


class ClusterView:
    """What a policy may read (queues, KV use, resident models, costs) and ask (route, load, unload)."""

    __slots__ = ("_engine",)  # a policy's state lives on the policy, in either build (compiled, it takes no other)

    def __init__(self, engine: Engine):
        self._engine = engine

    # -- reading ---------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        # SimPy's clock itself (what its ``now`` property returns): policies ask several times per request, and
        # the property is a Python call each time. The engine relies on the same attribute (sim.engine.arrivals).
        now: float = self._engine.env._now
        return now

    @property
    def config(self) -> EngineConfig:
        return self._engine.config

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        """The GPUs of the nodes that are up (in an elastic pool, nodes come and go)."""
        return tuple(self._engine.live_gpus)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(self._engine.model_names)

    def model_index(self, name: str) -> int:
        """The index of the model the scenario serves as ``name`` (its alias, where it has one)."""
        index = self._engine.model_index.get(name)
        if index is None:
            served = ", ".join(repr(model) for model in self._engine.model_names)
            raise MmsimError(f"{self._engine.policy.label} asks for model "
                             f"{name!r}, which the scenario does not serve (it serves {served})", field="policy.params")
        return index

    def costs(self, model: int) -> ModelCosts:
        """The :class:`sim.costs.ModelCosts` of a model: reload/unload seconds, swap penalty, offload steps."""
        return self._engine.costs[model]

    def costs_on(self, model: int, gpu: Gpu) -> ModelCosts:
        """What ``model`` costs on ``gpu``'s hardware: pools of other GPU types have other step and load times."""
        return self._engine.costs_on(model, gpu)

    def price_per_gpu_hour(self, gpu: Gpu) -> float:
        """What ``gpu``'s pool charges per GPU-hour (US$)."""
        pools = self._engine.pools
        return pools[gpu.pool].price_per_gpu_hour if pools else 0.0

    def deployment_share(self, model: int) -> float:
        """The GPU layer share of a whole copy of ``model``: its deployment's ``gpu_share`` (1.0 unless the scenario
        keeps some of its layers on the CPU)."""
        return self._engine.deployment_shares[model]

    def footprint_bytes(self, model: int, gpu_share: float | None = None) -> int:
        """GPU memory an instance of ``model`` takes before its first KV block: its weights at ``gpu_share`` (by
        default its deployment's) and its activation and non-torch reserve. A load needs this much free memory."""
        return self._engine.footprint_bytes(model, self._share(model, gpu_share))

    def _share(self, model: int, gpu_share: float | None) -> float:
        """``gpu_share``, or the deployment's when it is None."""
        return self._engine.deployment_shares[model] if gpu_share is None else gpu_share

    def max_model_len(self, model: int) -> int:
        """The longest prompt + output the deployment accepts (requests longer are rejected at arrival)."""
        return self._engine.max_model_len[model]

    def instances(self) -> tuple[Instance, ...]:
        return tuple(self._engine.instances)

    def instances_of(self, model: int, ready_only: bool = False) -> list[Instance]:
        wanted = ("ready",) if ready_only else ("ready", "loading")
        return [i for i in self._engine.instances_by_model[model] if i.status in wanted]

    def least_loaded(self, model: int, candidates: list[Instance] | None = None) -> Instance | None:
        """The ready or loading instance of ``model`` (among ``candidates``, if given) holding the fewest
        requests (the oldest on a tie), or None."""
        return self._engine.least_loaded(model, candidates)

    def route(self, request: Request, candidates: list[Instance] | None = None) -> Instance | None:
        """The instance the scenario's routing rule (``routing.rule``) picks for ``request`` among its model's
        ready or loading instances (or ``candidates``), or None."""
        return self._engine.route(request, candidates)

    def route_by(self, router: Router, request: Request, candidates: list[Instance] | None = None) -> Instance | None:
        """The instance a policy's own routing rule (a :class:`sim.engine.routing.Router`) picks."""
        return router.pick(self._engine, request, candidates)

    def placement(self, model: int) -> dict[str, Any]:
        """The scenario's placement hints for a model: ``gpus``, ``replicas``, ``gpu_share``, ``demand`` (mix share)."""
        return self._engine.placement.get(model, {})

    def slo(self, model: int) -> Any:
        """The scenario's :class:`sim.scenario.Slo` for a model (its own, else the default; fields may be None)."""
        slos = self._engine.slos
        if slos:
            return slos[model]
        from sim.scenario import Slo  # an engine built without a scenario has no SLOs
        return Slo()

    def slo_of(self, request: Request) -> Any:
        """The limits ``request`` is held to: its SLO class's (``slo_classes``), each one the class leaves unset its
        model's; its model's (:meth:`slo`) when it has no class or one the scenario does not name."""
        return self.slo_for_class(request.model, request.slo_class)

    def slo_for_class(self, model: int, slo_class: int) -> Any:
        """The limits a request of ``model`` and SLO class code ``slo_class`` (an index into :attr:`slo_classes`;
        -1: none) is held to, as :meth:`slo_of` gives them."""
        slo = self.slo(model)
        return slo if slo_class < 0 else slo.for_class(self._engine.recorder.slo_class_names[slo_class])

    @property
    def slo_classes(self) -> tuple[str, ...]:
        """The SLO class labels of the requests that have arrived so far: ``request.slo_class`` indexes them."""
        return tuple(self._engine.recorder.slo_class_names)

    @property
    def slo_class_count(self) -> int:
        """How many SLO class labels have arrived so far (``len(slo_classes)`` without copying them)."""
        return len(self._engine.recorder.slo_class_names)

    def pending(self, model: int) -> tuple[Request, ...]:
        """Requests of ``model`` that no instance holds (waiting for placement)."""
        return tuple(self._engine.pending[model])

    def pending_count(self, model: int) -> int:
        return len(self._engine.pending[model])

    def pending_head(self, model: int) -> Request | None:
        """The oldest request of ``model`` that no instance holds, or None (without copying the queue)."""
        queue = self._engine.pending[model]
        return queue[0] if queue else None

    def has_pending(self) -> bool:
        """Whether any model has requests that no instance holds (asked on every finish)."""
        return self._engine.pending_total > 0

    def order_waiting(self, instance: Instance) -> None:
        """Put ``instance.waiting`` in the order its next admission will try it (the policy's own order)."""
        engine = self._engine
        if engine.reorders_waiting:
            if engine.checks_policy:
                checked_order_waiting(engine, instance)
            else:
                engine.policy.order_waiting(instance, self)

    def sync(self, gpu: Gpu) -> None:
        """Bring a fast-forwarding GPU's counters up to now before reading them."""
        gpu.sync()

    # -- acting ----------------------------------------------------------------------------------
    def assign(self, request: Request, instance: Instance) -> None:
        """Queue a pending request at ``instance``; one waiting or swapped at another instance moves there (a
        swapped one keeps its host KV on the same node, and is recomputed on another), and one whose preemption
        waits for its step's end moves as it ends."""
        engine = self._engine
        held = request.instance
        if held is not None and request.state == "running" and any(r is request for r, _ in held.policy_preemptions):
            # Preempted mid-step, it leaves the batch as the step ends: it moves then (see preempt).
            if engine.checks_policy:
                check_target(engine, request, instance, "assign", leaving=True)
            held.policy_moves.append((request, instance))
            return
        if engine.checks_policy:
            check_target(engine, request, instance, "assign")
        if held is not None:
            if held is instance:
                return  # queued there already: it keeps its place
            engine.withdraw(request)
        engine.assign(request, instance)

    def load(self, model: object, gpu: Gpu, gpu_share: float | None = None) -> Instance | None:
        """Start loading (from the node's host-RAM copy if one is cached, else disk) at ``gpu_share`` (by default
        the deployment's); returns the new instance, or None if the weights do not fit."""
        engine = self._engine
        # -1 would load the last model, and True the second (untyped here: compiled, an int parameter takes True as 1)
        if isinstance(model, bool) or not isinstance(model, int):
            raise ValueError(f"a model index is a Python int, not {cut(repr(model))}")
        if not 0 <= model < len(engine.model_names):
            raise ValueError(f"model index {model!r} is not one of this scenario's 0..{len(engine.model_names) - 1}")
        share = self._share(model, gpu_share)
        if not 0 <= share <= 1:  # 0: every layer on the CPU (the paper's fully offloaded runs)
            raise ValueError(f"gpu_share must be from 0 to 1, not {share!r}")
        return engine.load(model, gpu, share)

    def unload(self, instance: Instance, mode: str = "swap", keep_on_host: bool = False,
               keep_prefix_cache: bool = False) -> bool:
        """Start unloading; running requests are preempted by ``swap`` or ``recompute``. ``keep_on_host``
        keeps the weights in the node's RAM (if there is room) for a faster reload there;
        ``keep_prefix_cache`` moves the cached prefix blocks there too, to come back with the next load."""
        _check_mode(mode)
        return self._engine.unload(instance, mode, keep_on_host, keep_prefix_cache)

    def shard_group(self, model: int, gpu: Gpu) -> list[Gpu] | None:
        """The GPUs an instance of ``model`` placed at ``gpu`` would span (None: just ``gpu``; empty: it cannot
        be placed there, e.g. the group would leave its pool or reach a node that is down)."""
        return self._engine.shard_group(model, gpu)

    def gpus_per_instance(self, model: int) -> int:
        """How many GPUs an instance of ``model`` spans: its tensor_parallel x pipeline_parallel."""
        tp, pp = self._engine.parallel[model]
        return tp * pp

    def cached_prefix_bytes(self, instance: Instance) -> int:
        """GPU memory of ``instance``'s cached prompt-prefix blocks (held or idle): what unloading it loses,
        unless it keeps them in host RAM."""
        cache = instance.prefix_cache
        if cache is None:
            return 0
        instance.gpu.sync()  # a prefill chunk's end, which a window may not have applied yet, fills blocks
        return cache.cached_blocks * instance.block_bytes

    def host_room_for(self, node: int, nbytes: int) -> bool:
        """Whether ``node``'s RAM has ``nbytes`` free beside offloaded layers, swapped KV, cached weights and prefixes."""
        return self._engine.nodes[node].host_free_bytes() >= nbytes

    def host_cached(self, model: int, node: int) -> bool:
        """Whether ``node`` holds a host-RAM copy of ``model``'s weights."""
        return model in self._engine.nodes[node].host_weights

    def preempt(self, instance: Instance, request: Request, mode: str) -> None:
        """Preempt one decoding request: at once if its instance is between steps, else as the step running ends
        (its token counted; the instance's next step waits for the KV swap-out)."""
        _check_mode(mode)
        gpu = instance.gpu
        gpu.sync()
        if request.state != "running" or request.instance is not instance:
            raise ValueError(f"only a request decoding on this instance can be preempted; {request!r} is not")
        step = gpu.current
        if step is not None and step.instance is instance:
            instance.policy_preemptions.append((request, mode))
            gpu.cut_window()  # a window of several iterations ends at the next boundary
            return
        self._engine.preempt(instance, request, mode, self.now)
        gpu.kick()

    def call_at(self, time_s: float, callback: Callable[[ClusterView], object]) -> None:
        """Run ``callback(view)`` at simulated time ``time_s`` (timers for quanta and deadlines)."""
        env = self._engine.env
        if not math.isfinite(time_s):  # NaN fired at once, and a timer at infinity never does
            raise ValueError(f"call_at needs a finite time, not {time_s!r}")
        if self._engine.checks_policy:
            _check_callback(callback)
        timer = env.timeout(max(0.0, time_s - env.now))

        def fire(_event: object) -> None:
            self._engine.progress.timer_fired()
            callback(self)

        timer.callbacks.append(fire)


def _check_callback(callback: object) -> None:
    """Refuse a timer callback that cannot be called with the view: it failed only when the timer fired, inside
    mmsim's code, as a traceback."""
    try:
        inspect.signature(callback).bind(None)  # type: ignore[arg-type]
    except TypeError as error:  # not callable, or not with one argument
        raise ValueError(f"call_at needs a callback taking the view, callback(view); {cut(repr(callback))} cannot "
                         f"be called so ({error})") from None
    except ValueError:
        return  # a builtin whose signature Python cannot tell: left to the call


def _check_mode(mode: str) -> None:
    """Refuse a preemption mode other than the engine's two (another dropped every request it touched)."""
    if mode != "swap" and mode != "recompute":
        raise ValueError(f"mode must be 'swap' or 'recompute', not {mode!r}")
