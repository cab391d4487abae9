"""The policy API: the decisions a scheduler makes, with vLLM-like defaults.

A policy is called at the moments that matter (an arrival, a load finishing,
an iteration boundary, a request finishing) and acts only through the
:class:`~sim.policies.view.ClusterView` it is handed: it reads queues, KV use,
resident models and profile costs there, and asks the engine to route, load,
unload or preempt. It never changes engine state directly.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Final

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # a pure-Python install need not have mypy: the decorator only instructs mypyc
    def mypyc_attr(*_attrs: str, **_kwattrs: object) -> Any:  # type: ignore[misc, no-redef]
        return lambda cls: cls

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Iterable

    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.policies.view import ClusterView

HOT_HOOKS = ("route", "on_arrival", "on_step", "on_finish")
"""Hooks called for every request or step; a policy that keeps the default costs nothing there."""


def latest_admitted(instance: Instance) -> Request:
    """The request that joined ``instance``'s batch last (vLLM's ``running[-1]``): decoding or prefilling.

    ``max`` with a key, as a loop: compiled, the key function was a Python call per request of a full batch."""
    latest: Request | None = None
    for queue in (instance.running, instance.prefilling):
        for request in queue:
            if latest is None or request.admitted_seq > latest.admitted_seq:
                latest = request
    if latest is None:
        raise ValueError(f"instance {instance.name} has no running or prefilling request to preempt")
    return latest


WAITING_ORDERS: Final = ("fcfs", "own", "by-key", "fixed-key")
"""The kinds of ``Policy.waiting_order``. "fcfs": the queue is not reordered. "own": any reordering; fast-forward
windows then start only while the queue is empty or the batch full. "by-key": a sort by a strict total order of
the requests and the clock (ties broken by id), so the order at a boundary does not depend on the sorts before it;
windows start when no waiting request could start wherever it stood. "fixed-key": such a sort under which the
order of two waiting requests never changes as the clock moves; as under FCFS, only the head must be unable to
start, and an arrival that could start (wherever it sorts) cuts the window."""


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueOrder:
    """An admission order for :func:`sort_queue`: ``before(a, b)`` is ``key(a) < key(b)`` for the policy's sort key.

    Compared in compiled code, without the key tuples and key-function calls of ``sorted(queue, key=...)``."""

    @abstractmethod
    def before(self, a: Request, b: Request) -> bool:
        """Whether ``a`` comes before ``b`` (strictly: equal requests keep their order)."""


def sort_queue(queue: deque[Request], order: QueueOrder) -> None:
    """Sort ``queue`` in place into ``order``: the same result as ``sorted(queue, key=...)`` (both sorts are stable).

    A binary insertion sort that leaves the queue alone when it is in order already: queues are asked for their
    order at every admission, arrival and finish, and between two asks only a few requests join or change place."""
    items = list(queue)
    moved = False
    for index in range(1, len(items)):
        item = items[index]
        if not order.before(item, items[index - 1]):
            continue
        low, high = 0, index - 1  # items[:index] are in order; item goes before the first one it precedes
        while low < high:
            middle = (low + high) // 2
            if order.before(item, items[middle]):
                high = middle
            else:
                low = middle + 1
        items.pop(index)  # not ``del items[index]``: compiled, pop takes the index unboxed
        items.insert(low, item)
        moved = True
    if moved:
        queue.clear()
        queue.extend(items)


@mypyc_attr(allow_interpreted_subclasses=True)
class Policy:
    """Base class: FCFS queues, least-loaded routing, youngest-first recompute preemption.

    Subclasses set ``name`` and ``description`` and override the hooks they need.
    Parameters come from the scenario's ``policy.params`` as keyword arguments.

    Compiled builds compile the built-in policies with the engine; a policy of one's own (a plain Python
    subclass of this class or of a built-in) works the same in either build.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The engine may skip waking a busy GPU for an arrival queued behind blocked FCFS
        # requests; a policy that reorders the waiting queue must always be woken.
        cls.reorders_waiting = cls.order_waiting is not Policy.order_waiting
        own_order = "order_waiting" in vars(cls)
        if own_order and "waiting_order" not in vars(cls):
            cls.waiting_order = "own"  # an order of its own, not declared a sort by key
        if own_order and "waiting_leaders" not in vars(cls) and not str(vars(cls).get("__module__")).startswith("sim."):
            cls.waiting_leaders = Policy.waiting_leaders  # type: ignore[method-assign]  # a parent's fit its order only
        if "keeps_placement" not in vars(cls) and not str(vars(cls).get("__module__")).startswith("sim."):
            cls.keeps_placement = False  # a parent's promise holds for its own hooks only
        if cls.waiting_order not in WAITING_ORDERS:
            raise TypeError(f"policy {cls.__name__}: waiting_order is {cls.waiting_order!r}; expected one of "
                            + ", ".join(repr(kind) for kind in WAITING_ORDERS))
        # The engine skips calling hooks left at their defaults (a call per request or step otherwise).
        cls.overridden_hooks = frozenset(hook for hook in HOT_HOOKS if getattr(cls, hook) is not getattr(Policy, hook))

    reorders_waiting: ClassVar[bool] = False
    waiting_order: ClassVar[str] = "fcfs"
    """What ``order_waiting`` does, which tells fast-forward which iteration boundaries it may skip (see
    ``WAITING_ORDERS``). A subclass that overrides ``order_waiting`` gets "own" unless it declares another, and the
    default ``waiting_leaders`` unless it defines its own."""
    overridden_hooks: ClassVar[frozenset[str]] = frozenset()
    keeps_placement: ClassVar[bool] = False
    """Whether the policy never unloads a model it loaded (static placement): an instance's neighbours then stay
    for good, so the engine sizes its max_model_len beside them and refuses a request that room cannot hold,
    instead of queueing it where it could never start. A policy that moves models leaves such a request queued
    until its neighbours go. A subclass written outside mmsim does not inherit the promise: it declares it."""

    def __init__(self, **params: Any) -> None:
        from sim.policies.registry import apply_params  # the registry imports the built-ins, which import this

        apply_params(self, params)

    @property
    def label(self) -> str:
        """How messages name this policy: its registered name, or its class's for a policy without one."""
        return self.name or type(self).__name__

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        """Parameters this policy accepts, with their defaults."""
        return {}

    @classmethod
    def param_limits(cls) -> dict[str, tuple[float, float]]:
        """The range (low, high, both allowed) of each numeric parameter that has a narrower one than [0, 1e9]."""
        return {}

    # -- placement -------------------------------------------------------------------------------
    def setup(self, view: ClusterView) -> None:
        """Initial residency at time 0 (default: nothing loaded)."""

    def route(self, request: Request, view: ClusterView) -> Instance | None:
        """The instance that should queue ``request`` now, or None to leave it pending for its model.

        Default: the scenario's routing rule (``routing.rule``; least-loaded unless it says otherwise)."""
        return view.route(request)

    def on_arrival(self, request: Request, view: ClusterView) -> None:
        """After routing: a chance to change residency (load, unload)."""

    def on_instance_ready(self, instance: Instance, view: ClusterView) -> None:
        """A load finished: by default, its model's pending requests are routed."""
        for request in list(view.pending(instance.model)):
            target = self.route(request, view)
            if target is not None:
                view.assign(request, target)

    # -- batching and preemption ------------------------------------------------------------------
    def order_waiting(self, instance: Instance, view: ClusterView) -> None:
        """Reorder ``instance.waiting`` in place before admission (default: FCFS, as vLLM)."""

    def waiting_leaders(self, instance: Instance, view: ClusterView) -> Iterable[Request]:
        """For an order declared ``by-key``: the waiting requests of ``instance`` that ``order_waiting`` may put at
        the head of the queue at any boundary from now on, while none of them starts and nothing joins (default:
        all of them). Fast-forward runs past the boundaries at which none of these could start, so leaving out
        one that may lead makes it disagree with per-iteration mode."""
        return instance.waiting

    def choose_victim(self, instance: Instance, view: ClusterView) -> tuple[Request, str]:
        """The request to preempt when KV blocks run out, and how (``recompute`` or ``swap``).

        Default, as vLLM: the last request of the running batch, i.e. the most recently admitted one, even
        when it is a prefill still in progress (which is then recomputed)."""
        return latest_admitted(instance), view.config.preemption_mode

    # -- notifications ---------------------------------------------------------------------------
    def on_step(self, instance: Instance, view: ClusterView) -> None:
        """After each GPU step of ``instance``."""

    def on_finish(self, request: Request, instance: Instance, view: ClusterView) -> None:
        """A request completed on ``instance``."""

    def on_evicted(self, instance: Instance, requests: list[Request], view: ClusterView) -> None:
        """``instance`` is unloading; ``requests`` went back to their model's pending queue. By default the model's
        other ready or loading instances take them, as they would new arrivals: the built-in policies bring in
        only absent models, so a request left pending beside a live instance of its model would never be served."""
        for request in requests:
            target = self.route(request, view)
            if target is not None:
                view.assign(request, target)

    def on_unloaded(self, instance: Instance, view: ClusterView) -> None:
        """``instance``'s memory is free again."""
