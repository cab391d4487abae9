"""Which runs may be ranked together: the same scenario (apart from policy and seed), profile and engine build,
and each (policy, seed) once. Mixed runs are refused, or split into groups shown one after another."""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from sim.errors import MmsimError
from sim.reports.data import RunData

IGNORED_SCENARIO_FIELDS = ("policy", "seed", "autoscaler")
"""What a comparison varies on purpose; every other scenario field must match."""


def comparison_key(run: RunData) -> dict:
    """The fields that must match between compared runs, in the order a difference is reported. A field the
    run's scenario.json lacks (written before the field existed) counts as the current schema's default."""
    if run.scenario is not None:
        scenario = with_defaults(run.scenario)
    else:
        scenario = {"name": run.summary.get("scenario")}
    return {"profile": run.summary.get("profile"), "engine_build": run.summary.get("engine_build"),
            "scenario": {k: v for k, v in scenario.items() if k not in IGNORED_SCENARIO_FIELDS}}


def with_defaults(data: dict) -> dict:
    """A scenario as recorded in a run folder, with every field the current scenario schema defaults and ``data``
    lacks filled in with that default (as ``mmsim run`` now records it). A folder written before a field existed
    ran as if it had the field's default, so it compares equal to a new run that leaves the field unset. Values
    ``data`` has are kept as they are; keys the schema no longer knows stay, and still count as a difference."""
    from sim.scenario import Scenario

    filled = _filled(data, Scenario)
    return filled if isinstance(filled, dict) else data


def _filled(value: object, annotation: object) -> object:
    """``value`` with the defaults of ``annotation`` (a pydantic model, or a list, mapping or union of them)."""
    kinds = _members(annotation)
    models = [kind for kind in kinds if isinstance(kind, type) and issubclass(kind, BaseModel)]
    if isinstance(value, dict) and models:  # a union's member is told by its keys; a lone model keeps extra keys
        fitting = models if len(kinds) == 1 else [model for model in models if _fits(value, model)]
        if len(fitting) == 1:
            return _filled_model(value, fitting[0])
    for kind in kinds:
        origin = typing.get_origin(kind)
        if origin is dict and isinstance(value, dict):
            inner = typing.get_args(kind)[1] if len(typing.get_args(kind)) == 2 else typing.Any
            return {key: _filled(item, inner) for key, item in value.items()}
        if origin is list and isinstance(value, list):
            inner = typing.get_args(kind)[0] if typing.get_args(kind) else typing.Any
            return [_filled(item, inner) for item in value]
    return value


def _filled_model(value: dict, model: type[BaseModel]) -> dict:
    filled = {}
    for name, field in model.model_fields.items():
        if name in value:
            filled[name] = _filled(value[name], field.annotation)
        elif not field.is_required():
            filled[name] = to_jsonable_python(field.get_default(call_default_factory=True))
    filled.update({key: item for key, item in value.items() if key not in filled})  # a field since removed
    return filled


def _members(annotation: object) -> list:
    """The types a field may hold: through Annotated and unions (None dropped)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [kind for member in typing.get_args(annotation) for kind in _members(member)]
    return [] if annotation is type(None) else [annotation]


def _fits(value: dict, model: type[BaseModel]) -> bool:
    """Whether ``value`` may be a ``model``: each key a field of it, and each fixed (Literal) field it gives the
    right one, so that one member of a union (``process: gamma``) is told from the others."""
    for key, item in value.items():
        field = model.model_fields.get(key)
        if field is None:
            return False
        kinds = _members(field.annotation)
        if item is not None and kinds and all(typing.get_origin(kind) is typing.Literal for kind in kinds):
            if not any(item in typing.get_args(kind) for kind in kinds):
                return False
    return True


class _Absent:
    """A field one of two compared values lacks (and the schema has no default for)."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


def first_difference(a: object, b: object, path: str = "") -> tuple[str, object, object] | None:
    """The dotted path of the first field where ``a`` and ``b`` differ, with both values (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            found = first_difference(a.get(key, ABSENT), b.get(key, ABSENT), f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}.{i}")
            if found:
                return found
        return None
    return None if a == b else (path, a, b)


def _short(value: object, quoted: bool = True) -> str:
    text = repr(value) if quoted else str(value)
    return text if len(text) <= 48 else text[:45] + "..."


def check_unique(runs: list[RunData]) -> None:
    """Refuse the same (policy, seed) twice: a glob that names one run twice would double-count it."""
    seen: dict[tuple[str, int], RunData] = {}
    for run in runs:
        key = (run.policy, run.seed)
        if key in seen:
            raise MmsimError(f"policy {run.policy} seed {run.seed} appears twice ({seen[key].path} and {run.path}); "
                             "give each run once")
        seen[key] = run


def check_comparable(runs: list[RunData]) -> None:
    """Raise one MmsimError naming the first field that differs between the runs (and both folders)."""
    reference = runs[0]
    key = comparison_key(reference)
    for run in runs[1:]:
        found = first_difference(key, comparison_key(run))
        if found:
            field, mine, theirs = found
            raise MmsimError(f"runs are not comparable: {field} is {_short(mine)} in {reference.path} but "
                             f"{_short(theirs)} in {run.path}; report on runs of one scenario (apart from policy "
                             "and seed), profile and engine build, or pass --allow-mixed to show them as separate groups")


def comparable_groups(runs: list[RunData]) -> list[tuple[str, list[RunData]]]:
    """Runs split into comparable groups (in order of first appearance), each labelled by what sets it apart."""
    groups: list[tuple[dict, list[RunData]]] = []
    for run in runs:
        key = comparison_key(run)
        for existing, members in groups:
            if first_difference(existing, key) is None:
                members.append(run)
                break
        else:
            groups.append((key, [run]))
    labelled = []
    for key, members in groups:
        parts: list[str] = []
        for other, _ in groups:
            found = first_difference(key, other) if other is not key else None
            if found and not any(part.startswith(found[0] + " ") for part in parts):
                parts.append(f"{found[0]} {_short(found[1], quoted=False)}")
        labelled.append((" · ".join(parts) or "all runs", members))
    return labelled
