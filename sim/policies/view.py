"""The read-only view of the cluster that policies see, and the actions they may ask for."""

from __future__ import annotations


class ClusterView:
    """What a policy may read (queues, KV use, resident models, costs) and ask (route, load, unload)."""

    def __init__(self, engine):
        self._engine = engine

    # -- reading ---------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._engine.env.now

    @property
    def config(self):
        return self._engine.config

    @property
    def gpus(self) -> tuple:
        return tuple(self._engine.gpus)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(self._engine.model_names)

    def model_index(self, name: str) -> int:
        return self._engine.model_index[name]

    def costs(self, model: int):
        """The :class:`sim.costs.ModelCosts` of a model: reload/unload seconds, swap penalty, offload steps."""
        return self._engine.costs[model]

    def footprint_bytes(self, model: int, gpu_share: float = 1.0) -> int:
        """GPU memory an instance of ``model`` takes before its first KV block: its weights at ``gpu_share`` and
        its activation and non-torch reserve. A load needs this much free memory."""
        return self._engine.footprint_bytes(model, gpu_share)

    def max_model_len(self, model: int) -> int:
        """The longest prompt + output the deployment accepts (requests longer are rejected at arrival)."""
        return self._engine.max_model_len[model]

    def instances(self) -> tuple:
        return tuple(self._engine.instances)

    def instances_of(self, model: int, ready_only: bool = False) -> list:
        wanted = ("ready",) if ready_only else ("ready", "loading")
        return [i for i in self._engine.instances_by_model[model] if i.status in wanted]

    def least_loaded(self, model: int, candidates: list | None = None):
        """The ready or loading instance of ``model`` (among ``candidates``, if given) holding the fewest
        requests (the oldest on a tie), or None."""
        return self._engine.least_loaded(model, candidates)

    def placement(self, model: int) -> dict:
        """The scenario's placement hints for a model: ``gpus``, ``replicas``, ``gpu_share``, ``demand`` (mix share)."""
        return self._engine.placement.get(model, {})

    def slo(self, model: int):
        """The scenario's :class:`sim.scenario.Slo` for a model (its own, else the default; fields may be None)."""
        slos = getattr(self._engine, "slos", None)
        if slos:
            return slos[model]
        from sim.scenario import Slo  # an engine built without a scenario has no SLOs
        return Slo()

    def pending(self, model: int) -> tuple:
        """Requests of ``model`` that no instance holds (waiting for placement)."""
        return tuple(self._engine.pending[model])

    def pending_count(self, model: int) -> int:
        return len(self._engine.pending[model])

    def order_waiting(self, instance) -> None:
        """Put ``instance.waiting`` in the order its next admission will try it (the policy's own order)."""
        policy = self._engine.policy
        if policy.reorders_waiting:
            policy.order_waiting(instance, self)

    def sync(self, gpu) -> None:
        """Bring a fast-forwarding GPU's counters up to now before reading them."""
        gpu.sync()

    # -- acting ----------------------------------------------------------------------------------
    def assign(self, request, instance) -> None:
        self._engine.assign(request, instance)

    def load(self, model: int, gpu, gpu_share: float = 1.0):
        """Start loading (from the node's host-RAM copy if one is cached, else disk); returns the new
        instance, or None if the weights do not fit."""
        return self._engine.load(model, gpu, gpu_share)

    def unload(self, instance, mode: str = "swap", keep_on_host: bool = False) -> bool:
        """Start unloading; running requests are preempted by ``swap`` or ``recompute``. ``keep_on_host``
        keeps the weights in the node's RAM (if there is room) for a faster reload there."""
        return self._engine.unload(instance, mode, keep_on_host)

    def host_cached(self, model: int, node: int) -> bool:
        """Whether ``node`` holds a host-RAM copy of ``model``'s weights."""
        return model in self._engine.nodes[node].host_weights

    def preempt(self, instance, request, mode: str) -> None:
        """Preempt one running request now (at the next iteration boundary it is off the GPU)."""
        instance.gpu.sync()
        if request.state != "running" or request.instance is not instance:
            raise ValueError(f"only a request decoding on this instance can be preempted; {request!r} is not")
        self._engine.preempt(instance, request, mode, self.now)
        instance.gpu.kick()

    def call_at(self, time_s: float, callback) -> None:
        """Run ``callback(view)`` at simulated time ``time_s`` (timers for quanta and deadlines)."""
        env = self._engine.env
        timer = env.timeout(max(0.0, time_s - env.now))
        timer.callbacks.append(lambda _event: callback(self))
