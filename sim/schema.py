"""Walking the scenario schema's annotations: the types a field may hold, and a scenario as a run folder recorded
it with the fields it lacks filled in by the schema's defaults."""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from sim.scenario import Scenario


def with_defaults(data: dict) -> dict:
    """A scenario as recorded in a run folder, with every field the current scenario schema defaults and ``data``
    lacks filled in with that default (as ``mmsim run`` now records it). A folder written before a field existed
    ran as if it had the field's default, so it compares equal to a new run that leaves the field unset. Values
    ``data`` has are kept as they are; keys the schema no longer knows stay, and still count as a difference."""
    filled = _filled(data, Scenario)
    return filled if isinstance(filled, dict) else data


def _filled(value: object, annotation: object) -> object:
    """``value`` with the defaults of ``annotation`` (a pydantic model, or a list, mapping or union of them)."""
    kinds = members(annotation)
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


def members(annotation: object) -> list:
    """The types a field may hold: through Annotated and unions (None dropped)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [kind for member in typing.get_args(annotation) for kind in members(member)]
    return [] if annotation is type(None) else [annotation]


def _fits(value: dict, model: type[BaseModel]) -> bool:
    """Whether ``value`` may be a ``model``: each key a field of it, and each fixed (Literal) field it gives the
    right one, so that one member of a union (``process: gamma``) is told from the others."""
    for key, item in value.items():
        field = model.model_fields.get(key)
        if field is None:
            return False
        kinds = members(field.annotation)
        if item is not None and kinds and all(typing.get_origin(kind) is typing.Literal for kind in kinds):
            if not any(item in typing.get_args(kind) for kind in kinds):
                return False
    return True
