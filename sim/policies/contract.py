"""The policy contract, checked where a user's code could break it.

A policy decides; the engine moves requests. The one queue a policy touches directly is
``instance.waiting`` in ``order_waiting``, which it may reorder but not add to or take from.
Built-in policies are held to that by the tests; a policy of one's own (a file, an entry point,
a subclass) is checked at every ``order_waiting`` call, and every run ends with a count: each
request that arrived finished or was dropped with a reason, exactly once. A user's hook that
raises ends the run in one line naming the policy, the hook and the line, not a traceback.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, cast

from sim.engine.request import Request
from sim.errors import MmsimError
from sim.files import counted, cut

if TYPE_CHECKING:
    from sim.engine.engine import Engine
    from sim.engine.instance import Instance


class PolicyContractError(MmsimError):
    """A user's policy (or autoscaler) broke the contract the engine relies on, or raised."""


def is_user_code(obj: object) -> bool:
    """Whether ``obj``'s class was written outside mmsim (a user's file, an entry point, a subclass of a built-in)."""
    return not type(obj).__module__.startswith("sim.")


def policy_label(engine: Engine) -> str:
    return user_label("policy", engine.policy.label, engine.policy)


def user_label(kind: str, name: str, obj: object) -> str:
    """How messages name a policy or autoscaler: by its name, and its class where that is another."""
    cls = type(obj).__name__
    return f"{kind} {name or cls!r}" if name in ("", cls) else f"{kind} {name!r} ({cls})"


def checked_order_waiting(engine: Engine, instance: Instance) -> None:
    """Call the policy's ``order_waiting`` and stop the run if it did more than reorder the queue."""
    waiting = instance.waiting
    before = sorted(map(id, waiting))
    engine.policy.order_waiting(instance, engine.view)
    if instance.waiting is not waiting:
        problem = "replaced instance.waiting with another object (reorder it in place: clear() then extend())"
    elif sorted(map(id, waiting)) != before:
        problem = _difference(len(before), waiting)
    else:
        return
    raise PolicyContractError(f"{policy_label(engine)} broke the policy contract at t={engine.env.now:.3f} s: its "
                              f"order_waiting on {instance.name} (GPU {instance.gpu.index}) {problem}; order_waiting may only reorder the queue "
                              "(requests move between queues only through the view's actions)")


QUEUEABLE_STATES = ("pending", "waiting", "swapped")  # not in a batch, nor done


def check_target(engine: Engine, request: Request, target: object, hook: str, leaving: bool = False) -> None:
    """Stop the run unless ``request`` waits to be queued (not in a batch, nor done) and ``target``, where a user's
    ``hook`` (route, or the view's assign) sent it, is a ready or loading instance of the request's model: another
    model's would decode it with the wrong weights, and a gone one would hold it where nothing runs."""
    from sim.engine.instance import Instance

    name = engine.model_names[request.model]
    expected = f"a ready or loading instance of {name}{' or None' if hook == 'route' else ''}"
    if request.state not in QUEUEABLE_STATES and not leaving:  # leaving: preempted, it leaves as its step ends
        where = f" on {request.instance.name}" if request.instance is not None else ""
        problem = f"was given request {request.id} ({name}), which is {request.state}{where}"
        expected = "a pending, waiting or swapped request (preempt a running one first)"
    elif not isinstance(target, Instance):
        problem = f"gave {cut(repr(target))} for request {request.id} ({name})"
    elif target.model != request.model:
        problem = f"sent request {request.id} ({name}) to {target.name}, an instance of another model"
    elif not engine.routable(target):
        problem = f"sent request {request.id} ({name}) to {target.name}, which is {target.status}"
    else:
        return
    raise PolicyContractError(f"{policy_label(engine)} broke the policy contract at t={engine.env.now:.3f} s: its "
                              f"{hook} {problem}; expected {expected}")


def checked_route(engine: Engine, request: Request) -> Instance | None:
    """The user's policy's ``route`` answer, once :func:`check_target` passed it (the compiled engine would refuse a
    wrong type itself, in a traceback from mmsim's code)."""
    answer: object = engine.policy.route(request, engine.view)
    if answer is not None:
        check_target(engine, request, answer, "route")
    return cast("Instance | None", answer)


VICTIM_FORM = "(a request of instance.running or instance.prefilling, 'swap' or 'recompute')"


def checked_victim(engine: Engine, instance: Instance) -> tuple[Request, str]:
    """The user's policy's ``choose_victim`` answer, and a stop to the run unless it is a request running or
    prefilling on ``instance`` and a preemption mode (a waiting one looped for ever, another instance's or None was a
    traceback, and an unknown mode was taken as recompute)."""
    answer: object = engine.policy.choose_victim(instance, engine.view)
    problem = ""
    if not isinstance(answer, tuple) or len(answer) != 2:
        problem = f"gave {cut(repr(answer))}, not a pair"
    else:
        request, mode = answer
        if not isinstance(request, Request) or request.instance is not instance \
                or request.state not in ("running", "prefilling"):
            problem = f"named {cut(repr(request))}, which is not running or prefilling on it"
        elif mode not in ("swap", "recompute"):
            problem = f"gave the mode {cut(repr(mode))}"
    if problem:
        raise PolicyContractError(
            f"{policy_label(engine)} broke the policy contract at t={engine.env.now:.3f} s: its choose_victim on "
            f"{instance.name} (GPU {instance.gpu.index}) {problem}; it must return {VICTIM_FORM}")
    return cast("tuple[Request, str]", answer)


def checked_waiting_leaders(engine: Engine, instance: Instance) -> list[Request]:
    """The policy's ``waiting_leaders``, and a stop to the run unless it named requests waiting on ``instance``."""
    answer: object = engine.policy.waiting_leaders(instance, engine.view)  # a user's: anything at all
    try:
        leaders: list[object] = list(answer)  # type: ignore[call-overload]
    except TypeError:
        leaders = [answer]  # not a collection: named as the one wrong thing below
    for request in leaders:
        if not isinstance(request, Request):
            problem = f"gave {cut(repr(answer))}, where it should give requests"
        elif request.state != "waiting" or request.instance is not instance:
            problem = f"named {request!r}, which is not in its waiting queue"
        else:
            continue
        raise PolicyContractError(
            f"{policy_label(engine)} broke the policy contract at t={engine.env.now:.3f} s: its waiting_leaders on "
            f"{instance.name} (GPU {instance.gpu.index}) {problem} (it may name only requests of instance.waiting)")
    return cast("list[Request]", leaders)  # each one checked above


def _difference(count_before: int, waiting) -> str:
    """What changed in a queue that should hold the same requests."""
    count_after = len(waiting)
    if count_after < count_before:
        return f"removed {counted(count_before - count_after, 'request')} from the waiting queue"
    if len({id(request) for request in waiting}) < count_after:
        return "put one request into the waiting queue twice"
    if count_after > count_before:
        return f"added {counted(count_after - count_before, 'request')} to the waiting queue"
    return "swapped requests of the waiting queue for others"


def check_accounted(engine: Engine, arrived: int) -> None:
    """Every request that arrived ended once, finished or dropped with a reason; else name the policy."""
    ended = engine.recorder.rows
    if ended == arrived:
        return
    if ended < arrived:
        what = (f"lost {arrived - ended:,} of {arrived:,} requests: they arrived but neither finished nor were "
                "dropped (taken out of a queue by the policy's own code?)")
    else:
        what = (f"ended {counted(ended - arrived, 'request')} twice ({ended:,} endings for {arrived:,} arrivals: a request "
                "put into two queues by the policy's own code?)")
    raise PolicyContractError(f"{policy_label(engine)} {what}; requests move between queues only through the "
                              "view's actions")


def user_code_error(error: BaseException, engine: Engine, autoscaler: object | None) -> PolicyContractError | None:
    """The one-line error for an exception raised in a user's policy or autoscaler code; None if it came from
    elsewhere (mmsim's own defect, which keeps its traceback)."""
    suspects: list[tuple[str, object]] = [(policy_label(engine), engine.policy)]
    if autoscaler is not None:
        suspects.append((user_label("autoscaler", getattr(autoscaler, "name", ""), autoscaler), autoscaler))
    for label, obj in suspects:
        where = where_raised(error, type(obj)) if is_user_code(obj) else None
        if where is not None:
            return PolicyContractError(f"{label} raised {type(error).__name__}: {error} {where} at "
                                       f"t={engine.env.now:.3f} s")
    return None


def where_raised(error: BaseException, cls: type) -> str | None:
    """``(in FUNCTION, FILE line N)``: the last frame of ``error`` in the code of the user's class ``cls`` (None if
    none is)."""
    files = _source_files(cls)
    mine = [frame for link in _chain(error) for frame in traceback.extract_tb(link.__traceback__)
            if frame.filename in files]
    return None if not mine else f"(in {mine[-1].name}, {mine[-1].filename} line {mine[-1].lineno})"


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes: SimPy re-raises a process's exception as a copy whose cause is the original."""
    links: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in links:
        links.append(link)
        link = link.__cause__ or link.__context__
    return links


def _source_files(cls: type) -> set[str]:
    """The files that define ``cls``'s methods outside mmsim (a user's class and its non-mmsim bases)."""
    files = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("sim.") or klass.__module__ == "builtins":
            continue
        for member in vars(klass).values():
            code = getattr(getattr(member, "__func__", member), "__code__", None)
            if code is not None:
                files.add(code.co_filename)
    return files
