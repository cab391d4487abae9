"""Axis paths: how a sweep axis such as ``slo."qwen2.5-3b".ttft_s`` names keys of a scenario, read against the
base scenario and the scenario schema (a key holding dots is quoted, or found where the base or the schema
makes it unambiguous), and how a value is set there."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from sim.errors import MmsimError
from sim.files import cut
from sim.scenario import Scenario
from sim.schema import members

CONVENIENCE_AXES = ("load", "gpus")
MAX_AXIS_KEYS = 64


def axis_tokens(path: str) -> list[tuple[str, bool]]:
    """The dot-separated parts of an axis path, each with whether it was quoted (``slo."qwen2.5-3b".ttft_s``:
    a quoted part is one key, dots and all); a quote left open or an empty part is an error naming the path."""
    tokens: list[tuple[str, bool]] = []
    rest, shown = path, cut(path)
    if not path:
        raise MmsimError("an axis needs a path into the scenario (policy.name, seed, slo.default.ttft_s...) or "
                         f"a convenience axis ({', '.join(CONVENIENCE_AXES)}), not ''", field="axes")
    while True:
        if rest.startswith('"'):
            end = rest.find('"', 1)
            if end < 0:
                raise MmsimError(f"axis {shown!r} opens a quote it does not close; write a key that holds dots as "
                                 '"KEY", e.g. slo."qwen2.5-3b".ttft_s', field=f"axes.{shown}")
            text, rest, quoted = rest[1:end], rest[end + 1:], True
            if rest and not rest.startswith("."):
                raise MmsimError(f"axis {shown!r}: a quoted key must be followed by a dot or end the path, not by "
                                 f"{rest[:1]!r}", field=f"axes.{shown}")
        else:
            end = rest.find(".")
            text, rest, quoted = (rest, "", False) if end < 0 else (rest[:end], rest[end:], False)
            if '"' in text:
                raise MmsimError(f"axis {shown!r}: a quote must enclose a whole key (\"KEY\" between dots), "
                                 f"not part of {cut(text)!r}", field=f"axes.{shown}")
        if not text and not quoted:
            raise MmsimError(f"axis {shown!r} has an empty key (two dots in a row, or a dot at an end)",
                             field=f"axes.{shown}")
        tokens.append((text, quoted))
        if len(tokens) > MAX_AXIS_KEYS:
            raise MmsimError(f"axis {shown!r} has more than {MAX_AXIS_KEYS} keys; no scenario field is that deep",
                             field=f"axes.{shown}")
        if not rest:
            return tokens
        rest = rest[1:]
        if not rest:
            raise MmsimError(f"axis {shown!r} has an empty key (two dots in a row, or a dot at an end)",
                             field=f"axes.{shown}")


def spell(keys: tuple[str, ...] | list[str]) -> str:
    """Keys as an axis path: dotted, a key that holds a dot (or a quote) quoted."""
    return ".".join(f'"{key}"' if "." in key or '"' in key or not key else key for key in keys)


class _Free:
    """Any key and anything below it (``policy.params``, an untyped mapping)."""


FREE = _Free
_MISSING = object()


def _members(annotation) -> list:
    """The types a value of ``annotation`` may have (:func:`sim.schema.members`), FREE for Any or an untyped
    container."""
    found = []
    for kind in members(annotation):
        origin = typing.get_origin(kind)
        untyped = kind in (dict, list) or (origin in (dict, list) and not typing.get_args(kind))
        found.append(FREE if kind is typing.Any or untyped else kind)
    return found


def _below(kinds: list, key: str) -> list:
    """The types of what ``key`` names inside a value of one of ``kinds``."""
    found: list = []
    for kind in kinds:
        origin = typing.get_origin(kind)
        if kind is FREE:
            found.append(FREE)
        elif isinstance(kind, type) and issubclass(kind, BaseModel) and key in kind.model_fields:
            found += _members(kind.model_fields[key].annotation)
        elif origin is dict:
            found += _members(typing.get_args(kind)[1])
        elif origin is list and key.isdigit():
            found += _members(typing.get_args(kind)[0])
    return found


def _candidates(tokens: list[tuple[str, bool]], i: int, node, kinds: list):
    """(key, next token) pairs the tokens from ``i`` may start with, in the order they are tried: a key ``node``
    has (longest first), a field of the schema, then a new key of a mapping (shortest first: each dot splits,
    as before dots could be part of a key)."""
    text, quoted = tokens[i]
    ends = [i + 1] if quoted else [j for j in range(i + 1, len(tokens) + 1) if not any(q for _, q in tokens[i + 1:j])]
    keys = [(".".join(t for t, _ in tokens[i:j]), j) for j in ends]
    if isinstance(node, list):  # an axis can set an item of a list the base has, not add one
        if text.isdigit() and int(text) < len(node):
            yield text, i + 1
        return
    tried = set()
    if isinstance(node, dict):
        for key, j in reversed(keys):
            if key in node:
                tried.add(key)
                yield key, j
    if text not in tried and any(isinstance(k, type) and issubclass(k, BaseModel) and text in k.model_fields
                                 for k in kinds):
        tried.add(text)
        yield text, i + 1
    if any(kind is FREE or typing.get_origin(kind) is dict for kind in kinds):
        for key, j in keys:
            if key not in tried and (j == i + 1 or j < len(tokens)):  # a new key with dots at the end: quoted
                yield key, j


def _walk(tokens: list[tuple[str, bool]], i: int, node, kinds: list, keys: list[str],
          deepest: dict) -> list[str] | None:
    """The keys that ``tokens[i:]`` name below ``node`` (of one of ``kinds``; ``keys`` lead there), or None;
    ``deepest`` keeps where the furthest try stopped, for the message."""
    if i == len(tokens):
        return []
    for key, j in _candidates(tokens, i, node, kinds):
        if isinstance(node, list):
            child = node[int(key)]
        else:
            child = node.get(key, _MISSING) if isinstance(node, dict) else _MISSING
        rest = _walk(tokens, j, child, _below(kinds, key), [*keys, key], deepest)
        if rest is not None:
            return [key, *rest]
    if i > deepest["at"]:
        deepest.update(at=i, keys=keys, part=tokens[i][0], node=node, kinds=kinds)
    return None


def axis_keys(path: str, data: dict) -> tuple[str, ...]:
    """The keys an axis path names in the scenario ``data``: each dot separates two keys unless it lies in a
    quoted key (``slo."qwen2.5-3b".ttft_s``), in a key ``data`` has (``workload.generator.mix.qwen2.5-3b``,
    longest first), or in a new key of a mapping followed by a field its values have (``slo.qwen2.5-3b.ttft_s``:
    ``ttft_s`` is a field of an SLO, ``5-3b`` is not). A path that names nothing is an MmsimError saying where
    it stops."""
    tokens = axis_tokens(path)
    deepest: dict = {"at": -1}
    found = _walk(tokens, 0, data, [Scenario], [], deepest)
    if found is not None:
        return tuple(found)
    keys, part, node, kinds = deepest["keys"], deepest["part"], deepest["node"], deepest["kinds"]
    where = f"under {spell(keys)}" if keys else "at the top of the scenario"
    is_list = any(kind is list or typing.get_origin(kind) is list for kind in kinds)
    if isinstance(node, list):
        indexes = f"0 to {len(node) - 1}" if node else "none"
        problem = (f"{spell(keys)} is a list of {len(node)} in the base, and {cut(part)!r} is not one of its indexes "
                   f"({indexes}): an axis can set an item of a list the base has, not add one")
    elif is_list and part.isdigit():
        problem = (f"{spell(keys)} is not a list in the base: an axis can set an item of a list the base has, "
                   "not add one")
    else:
        problem = f"there is no field {cut(part)!r} {cut(where, 200)}"
    mappings, below = 0, [Scenario]
    for key in keys:  # a key of a mapping (slo, slo_classes, mix, params) may hold dots
        mappings += any(kind is FREE or typing.get_origin(kind) is dict for kind in below)
        below = _below(below, key)
    hint = '; a key that holds dots is one key when quoted, e.g. slo."qwen2.5-3b".ttft_s' if mappings else ""
    raise MmsimError(problem + hint, field=f"axes.{cut(path)}")


def set_path(data: dict, path: str | tuple[str, ...], value) -> None:
    """Set a path (dotted, or as keys from :func:`axis_keys`) in a scenario dict, creating missing mappings on
    the way."""
    parts = path.split(".") if isinstance(path, str) else list(path)
    node = data
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
            continue
        if not isinstance(node.get(part), (dict, list)):
            node[part] = {}
        node = node[part]
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value
