"""Autoscalers: how many replicas of each model the fleet should run, decided every ``interval_s``.

An autoscaler sees one :class:`ModelSignals` per model and answers a replica count and the reason for
it; the controller (:mod:`sim.fleet.controller`) clamps it, holds scale-downs for a stabilisation
window and starts or retires instances. The reactive ones use Kubernetes' HPA rule,
``desired = ceil(replicas x metric / target)``, left alone within a 10% tolerance; they differ in the
signal: ``utilisation`` watches how busy the GPUs are (a CPU-like signal, capped at 100% however long
the queue), ``queue-depth`` and ``kv-utilisation`` watch what the Gateway API inference extension
exposes per pod. ``predictive`` forecasts the arrival rate one cold start ahead (Holt's linear trend,
as an exponentially weighted level and slope) and provisions for it, in the spirit of DynamoLLM.

A user's autoscaler is a subclass in ``path/to/file.py:ClassName``, or a ``mmsim.autoscalers`` entry point; the
controller holds every answer to the form :func:`checked_answer` names.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from sim.errors import MmsimError
from sim.files import counted, cut
from sim.policies.contract import PolicyContractError, user_label
from sim.policies.registry import apply_params, check_params, entry_point_class, is_policy_file, load_class_from_file

TOLERANCE = 0.1
"""HPA's default: a metric within 10% of its target changes nothing."""

NEGLIGIBLE_RATE = 1e-15
"""Requests per second a forecast treats as none: times any time in system short of ten days, far less than the
one-billionth of a replica that counts as one."""


@dataclass(frozen=True)
class ModelSignals:
    """What the fleet shows an autoscaler about one model at a decision."""

    model: str
    now: float
    interval_s: float
    replicas: int  # instances serving or starting, not counting those being retired
    ready: int  # of those, serving
    queued: int  # requests not in a batch: unplaced, or waiting or swapped at an instance
    running: int  # requests in a batch (prefilling or decoding)
    kv_utilisation: float  # KV blocks held / blocks that fit, over the ready instances
    utilisation: float  # share of the last interval the ready instances' GPUs were busy
    arrival_rate_per_s: float  # arrivals over the last interval
    lead_time_s: float  # how long a new instance on a new node takes to be ready

    @property
    def in_system(self) -> int:
        return self.queued + self.running


class Autoscaler:
    """Base class: keep the replicas there are. Subclasses set ``name`` and ``description`` and override
    :meth:`desired`; parameters come from the scenario's ``autoscaler.params``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    memoryless: ClassVar[bool] = False  # its answer depends on the signals alone (then it is always at rest)

    def __init__(self, **params: Any) -> None:
        apply_params(self, params)

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def param_limits(cls) -> dict[str, tuple[float, float]]:
        """The range (low, high, both allowed) of each numeric parameter that has a narrower one than [0, 1e9]."""
        return {}

    def desired(self, signals: ModelSignals) -> tuple[int, str]:
        """The replicas ``signals.model`` should have, and the signal behind the number (logged)."""
        return signals.replicas, "none"

    def at_rest(self, model: str) -> bool | None:
        """Whether, asked about ``model`` again with the signals of its last answer (``now`` aside), it would
        answer the same. The controller then passes over the decisions of a still stretch (nothing about, for
        the scenario's stabilisation and idle windows). True for a memoryless autoscaler. None (the default for
        one's own) leaves it to the controller, which takes the same answer through those windows as rest; an
        autoscaler whose answer changes with the clock alone (a schedule) returns False until its time."""
        return True if self.memoryless else None


ANSWER_FORM = "(whole number >= 0, reason text)"
"""What ``desired()`` must return: a replica count and the signal behind it."""


def checked_answer(autoscaler: Autoscaler, signals: ModelSignals, answer: object) -> tuple[int, str]:
    """``answer``, what ``autoscaler.desired(signals)`` returned, as (count, reason); a stop to the run, naming the
    autoscaler and the answer, unless it is a whole number >= 0 and a text."""
    if type(answer) is tuple and len(answer) == 2 and type(answer[0]) is int and answer[0] >= 0 \
            and type(answer[1]) is str:
        return answer  # every built-in's answer: a few type checks a decision, where a decision costs microseconds
    problem = _answer_problem(answer)
    if problem:
        raise PolicyContractError(f"{user_label('autoscaler', autoscaler.name, autoscaler)} broke the autoscaler contract at "
                                  f"t={signals.now:.3f} s: its desired() for {signals.model} returned "
                                  f"{cut(repr(answer))} ({problem}); desired() must return {ANSWER_FORM}")
    count, reason = cast("tuple[numbers.Integral, str]", answer)  # checked above
    return int(count), str(reason)


def checked_rest(autoscaler: Autoscaler, signals: ModelSignals) -> bool | None:
    """``autoscaler.at_rest(model)``: True, False or None, or a stop to the run naming what it gave."""
    rest = autoscaler.at_rest(signals.model)
    if rest is True or rest is False or rest is None:
        return rest
    raise PolicyContractError(f"{user_label('autoscaler', autoscaler.name, autoscaler)} broke the autoscaler contract "
                              f"at t={signals.now:.3f} s: its at_rest({signals.model!r}) returned {cut(repr(rest))}; it "
                              "must return True, False or None")


def _answer_problem(answer: object) -> str:
    """What is wrong with an answer of ``desired()``, or nothing (a NumPy integer, or an int or str subclass, will do)."""
    if not isinstance(answer, tuple):
        return f"type {type(answer).__name__}, not a pair"
    if len(answer) != 2:
        return f"{counted(len(answer), 'item')}, not 2"
    count, reason = answer
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):  # True would count as 1
        return f"count of type {type(count).__name__}, not a whole number"
    if count < 0:
        return "count below 0"
    if not isinstance(reason, str):
        return f"reason of type {type(reason).__name__}, not text"
    return ""


def proportional(current: int, metric: float, target: float) -> int:
    """HPA's rule: scale ``current`` by metric / target, unless that is within the tolerance."""
    ratio = metric / target
    if abs(ratio - 1.0) <= TOLERANCE:
        return current
    return math.ceil(current * ratio - 1e-9)


class NoAutoscaler(Autoscaler):
    memoryless = True
    name = "none"
    description = "A fixed fleet: the nodes and instances the scenario starts with."


class PerReplicaAutoscaler(Autoscaler):
    """HPA on a per-replica metric averaged over the ready replicas (``metric`` names a field of the signals)."""

    memoryless = True
    metric: ClassVar[str] = ""
    target: float

    @classmethod
    def param_limits(cls) -> dict[str, tuple[float, float]]:
        return {"target": (0.01, 1.0)}  # a share of the GPU's time or of its KV blocks (0 divided by zero)

    def desired(self, signals: ModelSignals) -> tuple[int, str]:
        value = getattr(signals, self.metric)
        wanted = proportional(signals.ready, value, self.target) if signals.ready else signals.replicas
        return wanted, f"{self.metric} {value:.2f} (target {self.target:g})"


class UtilisationAutoscaler(PerReplicaAutoscaler):
    name = "utilisation"
    description = "HPA on GPU busy share (a CPU-like signal): blind to the queue behind a busy GPU."
    metric = "utilisation"

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {"target": 0.6}


class KvUtilisationAutoscaler(PerReplicaAutoscaler):
    name = "kv-utilisation"
    description = "HPA on KV-cache utilisation (the inference extension's kv-cache usage)."
    metric = "kv_utilisation"

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {"target": 0.7}


class QueueDepthAutoscaler(Autoscaler):
    name = "queue-depth"
    description = "HPA on queued requests per replica (the inference extension's queue size)."
    memoryless = True
    target: float

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {"target": 4.0}

    @classmethod
    def param_limits(cls) -> dict[str, tuple[float, float]]:
        return {"target": (0.01, 1e9)}  # queued requests per replica, divided by

    def desired(self, signals: ModelSignals) -> tuple[int, str]:
        # An average-value target: the sum of the per-pod metric over the target, however many pods there are.
        per_replica = signals.queued / max(signals.replicas, 1)
        wanted = proportional(max(signals.replicas, 1), per_replica, self.target)
        return wanted, f"queue_depth {per_replica:.1f} per replica (target {self.target:g})"


class PredictiveAutoscaler(Autoscaler):
    """Replicas for the requests in system one cold start ahead: Little's law with a forecast arrival rate.

    The rate's level and trend are exponentially weighted (Holt); the requests in system then are the
    forecast rate times the time a request spends there now (in system / rate, also smoothed), and each
    replica should hold ``target_in_flight`` of them. It never asks for fewer than the requests in
    system now need, so a forecast that lags a spike does no worse than a reactive rule."""

    name = "predictive"
    description = "Forecasts the arrival rate a cold start ahead (Holt) and provisions for it (as DynamoLLM)."
    target_in_flight: float
    alpha: float
    beta: float

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {"target_in_flight": 16.0, "alpha": 0.5, "beta": 0.3}

    @classmethod
    def param_limits(cls) -> dict[str, tuple[float, float]]:
        # Holt's smoothing factors are weights of the newest figure: from 0 (never) to 1 (only it); the level's must
        # move at all.
        return {"target_in_flight": (0.01, 1e9), "alpha": (0.01, 1.0), "beta": (0.0, 1.0)}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._state: dict[str, list[float]] = {}  # model -> [rate level, rate trend per interval, seconds in system]
        self._moved: dict[str, bool] = {}  # model -> whether its last answer changed its state

    def at_rest(self, model: str) -> bool:
        return not self._moved.get(model, True)

    def desired(self, signals: ModelSignals) -> tuple[int, str]:
        rate = signals.arrival_rate_per_s
        state = self._state.get(signals.model)
        before = list(state) if state is not None else None
        if state is None:
            state = self._state[signals.model] = [rate, 0.0, 0.0]
        else:
            level, trend, _ = state
            state[0] = self.alpha * rate + (1 - self.alpha) * (level + trend)
            state[1] = self.beta * (state[0] - level) + (1 - self.beta) * trend
            if abs(state[0]) < NEGLIGIBLE_RATE and abs(state[1]) < NEGLIGIBLE_RATE:
                # With nothing arriving, level and trend halve at every decision down to subnormals and never
                # settle; a rate this small asks for no replica (see ``wanted``), so it is nothing, at rest.
                state[0] = state[1] = 0.0
        if rate > 0 and signals.in_system:
            sojourn_s = signals.in_system / rate
            state[2] = sojourn_s if state[2] == 0 else self.alpha * sojourn_s + (1 - self.alpha) * state[2]
        ahead = (signals.lead_time_s + signals.interval_s) / signals.interval_s
        forecast = max(0.0, state[0] + state[1] * ahead)
        needed_then = forecast * state[2] / self.target_in_flight
        needed_now = signals.in_system / self.target_in_flight
        wanted = math.ceil(max(needed_then, needed_now) - 1e-9)
        self._moved[signals.model] = state != before
        return wanted, (f"forecast {forecast:.2f} req/s in {signals.lead_time_s:.0f} s x {state[2]:.1f} s in system "
                        f"(target {self.target_in_flight:g} in flight per replica)")


BUILTIN = {cls.name: cls for cls in (NoAutoscaler, UtilisationAutoscaler, QueueDepthAutoscaler,
                                     KvUtilisationAutoscaler, PredictiveAutoscaler)}


def get_autoscaler_class(spec: str) -> type:
    """Resolve an autoscaler name or ``path.py:Class`` to its class."""
    if is_policy_file(spec):
        cls = load_class_from_file(spec, "autoscaler")
        if not (isinstance(cls, type) and issubclass(cls, Autoscaler)):
            raise MmsimError(f"{spec!r} is not a subclass of sim.fleet.autoscalers.Autoscaler", field="autoscaler.name")
        return cls
    if spec in BUILTIN:
        return BUILTIN[spec]
    installed = entry_point_class("mmsim.autoscalers", spec)
    if installed is not None:
        return installed
    raise MmsimError(f"unknown autoscaler {spec!r}; built-in autoscalers: {', '.join(sorted(BUILTIN))}, "
                     "or path/to/file.py:ClassName", field="autoscaler.name")


def make_autoscaler(spec: str, params: dict | None = None) -> Autoscaler:
    cls = get_autoscaler_class(spec)
    check_params(cls, params or {}, section="autoscaler")
    try:
        return cls(**(params or {}))
    except (TypeError, ValueError) as error:
        raise MmsimError(f"bad parameters for autoscaler {spec!r}: {error}", field="autoscaler.params") from None


def autoscaler_descriptions() -> dict[str, str]:
    return {name: cls.description for name, cls in sorted(BUILTIN.items())}
