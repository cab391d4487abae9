"""Sweep files: a base scenario and axes of values; expanded into one validated scenario per combination.

An axis is a dotted path into the scenario (``policy.name``, ``seed``,
``workload.generator.arrivals.rate_per_s``, ``slo.default.ttft_s``...) or one
of the convenience axes: ``load`` (multiplies the arrival rate by dividing
``workload.time_scale``) and ``gpus`` (total GPU count, laid out as nodes ×
GPUs per node). A key that holds dots (a model ``qwen2.5-3b``, a class ``gold.v2``) may be written in double
quotes, ``slo."qwen2.5-3b".ttft_s``, or as it is: unquoted, dots that fall inside a key the base scenario has
(longest first), or inside a mapping's key followed by a field the schema knows, are read as part of the key
(:func:`axis_keys`). ``autoscaler.name`` drops the base's ``autoscaler.params`` when it names another
autoscaler, as ``mmsim run --autoscaler`` does; a pool is ``cluster.pools.N.FIELD``.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim.errors import MmsimError, validate_mapping
from sim.sweep.axis_paths import CONVENIENCE_AXES, axis_keys, axis_tokens, set_path, spell
from sim.files import cut
from sim.runner import check_run_size
from sim.scenario import Scenario, parse_scenario, read_yaml
from sim.workload.config import MAX_NAME_CHARS

"""Most keys an axis path may have (MAX_DEPTH of a data file: no field is deeper)."""
MAX_RUNS = 100_000
"""Most runs one sweep may expand to: every combination is validated before the first run (about a quarter of a
millisecond each), so a grid of millions would sit for minutes before reporting anything."""


class SweepSpec(BaseModel):
    """A whole sweep file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="sweep", min_length=1, max_length=MAX_NAME_CHARS)
    base: str = Field(description="base scenario YAML, relative to the sweep file's folder (or the current one)")
    axes: dict[str, list[typing.Any]] = Field(min_length=1)

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, axes: dict[str, list]) -> dict[str, list]:
        for path, values in axes.items():
            if not values:
                raise ValueError(f"axis {path!r} has no values")
            if len({json.dumps(_same_number(v), sort_keys=True) for v in values}) != len(values):
                raise ValueError(f"axis {path!r} lists a value twice (1 and 1.0 are one value)")
            if path in CONVENIENCE_AXES and not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and math.isfinite(v) and 0 < v <= 1e6 for v in values):
                raise ValueError(f"axis {path!r} needs positive finite numbers (at most 1e6)")
            if path == "gpus" and not all(float(v).is_integer() for v in values):
                raise ValueError(f"axis 'gpus' needs whole numbers of GPUs, not {next(v for v in values if not float(v).is_integer())}")
        for path in axes:
            if path not in CONVENIENCE_AXES:
                try:
                    axis_tokens(path)  # a quote left open or an empty key: named before the base is read
                except MmsimError as error:
                    raise ValueError(error.args[0]) from None
        _no_two_axes_set_one_field(list(axes))
        runs = math.prod(len(values) for values in axes.values())
        if runs > MAX_RUNS:
            raise ValueError(f"the axes make {runs:,} runs ({' x '.join(str(len(v)) for v in axes.values())}); "
                             f"a sweep may have at most {MAX_RUNS:,}")
        return axes


CONVENIENCE_FIELDS = {"load": ("workload.time_scale",), "gpus": ("cluster.nodes", "cluster.gpus_per_node")}
"""The scenario fields each convenience axis sets."""


def _no_two_axes_set_one_field(paths: list[str], keys: dict[str, tuple[str, ...]] | None = None) -> None:
    """Refuse two axes that set the same field (``load`` and ``workload.time_scale``; ``gpus`` and
    ``cluster.nodes``; a field and one inside it): the later one won, and the index named the other's value.
    ``keys`` are the paths as read against the base (:func:`axis_keys`); without it each dot splits."""
    def fields_of(path: str) -> list[tuple[str, ...]]:
        if path in CONVENIENCE_FIELDS:
            return [tuple(field.split(".")) for field in CONVENIENCE_FIELDS[path]]
        return [keys[path] if keys is not None else tuple(text for text, _ in axis_tokens(path))]

    fields = [(path, fields_of(path)) for path in paths]
    for i, (first, first_fields) in enumerate(fields):
        for second, second_fields in fields[i + 1:]:
            for a in first_fields:
                for b in second_fields:
                    if a[:len(b)] == b or b[:len(a)] == a:
                        raise ValueError(f"axes {first!r} and {second!r} both set {spell(min(a, b, key=len))}; "
                                         "keep one of them")


def _same_number(value):
    """``value`` with every whole float as the int it equals, so that 2 and 2.0 compare as the one value they are."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _same_number(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_same_number(item) for item in value]
    return value


@dataclass
class RunTask:
    """One run of a sweep: its id, its axis values and the full (validated) scenario as plain data."""

    run_id: str
    axes: dict
    scenario_data: dict
    base_dir: str


def run_id(axes: dict) -> str:
    """A stable, readable id: the axis values as a short slug plus a hash of the exact values."""
    digest = hashlib.sha1(json.dumps(axes, sort_keys=True, default=str).encode()).hexdigest()[:8]
    slug = "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", str(v)).strip("-") for v in axes.values())
    return f"{slug[:60]}-{digest}" if slug else digest


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file."""
    data = read_yaml(Path(path), "sweep file")
    if isinstance(data, dict) and "base" not in data and {"models", "workload"} & set(data):
        raise MmsimError("is a scenario, not a sweep file (a sweep file has base: SCENARIO.yaml and axes: {PATH: "
                         "[values]}); run a scenario with mmsim run, or its policies side by side with mmsim compare",
                         source=str(path))
    return validate_mapping(SweepSpec, data, str(path), strict=True)


def resolve_base(spec: SweepSpec, sweep_path: Path) -> Path:
    """The base scenario: relative to the sweep file's folder first, then to the current folder."""
    candidates = [Path(spec.base)] if Path(spec.base).is_absolute() else [sweep_path.parent / spec.base, Path(spec.base)]
    candidates = list(dict.fromkeys(candidates))  # the sweep's folder may be the current one: name it once
    for candidate in candidates:
        if os.path.isfile(candidate):
            if candidate.resolve() == sweep_path.resolve():
                raise MmsimError("names this sweep file itself; base is the scenario the axes change",
                                 source=str(sweep_path), field="base")
            return candidate.resolve()
    folder = next((c for c in candidates if os.path.isdir(c)), None)
    if folder is not None:
        raise MmsimError(f"base scenario {spec.base!r} is a folder ({folder}); give the scenario's YAML file",
                         source=str(sweep_path), field="base")
    raise MmsimError(f"base scenario {spec.base!r} not found (looked in {', '.join(str(c) for c in candidates)})",
                     source=str(sweep_path), field="base")


def gpu_layout(total: int, max_per_node: int) -> tuple[int, int] | None:
    """(nodes, GPUs per node) for ``total`` GPUs on the fewest nodes, or None if it does not split evenly."""
    nodes = math.ceil(total / max_per_node)
    return (nodes, total // nodes) if total % nodes == 0 else None


def gpus_per_node_of(data: dict, base_dir: Path) -> int:
    """The most GPUs a node may hold: the scenario's ``cluster.gpus_per_node`` or its profile's."""
    from sim.profile import load_profile

    given = (data.get("cluster") or {}).get("gpus_per_node")
    return int(given) if given else load_profile(data.get("profile", "paper-rtx5000"), base_dir).hardware.gpu.gpus_per_node


def apply_axis(data: dict, path: str, value, base_dir: Path, keys: tuple[str, ...] | None = None) -> None:
    """Apply one axis value to a scenario dict (convenience axes included); ``keys``: the path as
    :func:`axis_keys` reads it (else it is read against ``data``)."""
    if path not in CONVENIENCE_AXES and keys is None:
        keys = axis_keys(path, data)
    if path == "load":
        workload = data.setdefault("workload", {})
        workload["time_scale"] = float(workload.get("time_scale", 1.0)) / float(value)
    elif keys == ("autoscaler", "name"):
        section = data.setdefault("autoscaler", {})
        if section.get("name", "none") != value:
            section.pop("params", None)  # another autoscaler's parameters would be unknown to it
        section["name"] = value
    elif path == "gpus":
        if (data.get("cluster") or {}).get("pools") is not None:
            raise MmsimError("the gpus axis lays out a cluster of one kind of node, and this one has cluster.pools: "
                             "use cluster.pools.N.nodes (or mmsim capacity --cheapest-fleet)", field="gpus")
        per_node = gpus_per_node_of(data, base_dir)
        layout = gpu_layout(int(value), per_node)
        if layout is None or int(value) != value:
            raise MmsimError(f"{value} GPUs cannot be laid out evenly on nodes of at most {per_node} GPUs", field="gpus")
        cluster = data.setdefault("cluster", {})
        cluster["nodes"], cluster["gpus_per_node"] = layout
    else:
        set_path(data, keys or path, copy.deepcopy(value))


def apply_axes(data: dict, axes: dict, base_dir: Path, keys: dict[str, tuple[str, ...]] | None = None) -> None:
    """Apply every axis value; ``autoscaler.name`` first, so that an ``autoscaler.params...`` axis outlives it.
    Every path is read (:func:`axis_keys`) against ``data`` as it was before any of them is applied, unless
    ``keys`` gives them so read."""
    if keys is None:
        keys = {path: axis_keys(path, data) for path in axes if path not in CONVENIENCE_AXES}
    for path in sorted(axes, key=lambda p: keys.get(p) != ("autoscaler", "name")):
        apply_axis(data, path, axes[path], base_dir, keys.get(path))


def expand(spec: SweepSpec, sweep_path: Path) -> list[RunTask]:
    """Every combination of axis values as a validated run; a bad value names the run and the field."""
    sweep_path = Path(sweep_path)
    base_path = resolve_base(spec, sweep_path)
    base_data = read_yaml(base_path, "base scenario")
    parse_scenario(base_data, str(base_path), base_path.parent)
    assert isinstance(base_data, dict)  # parse_scenario accepts nothing else
    keys = {}
    for path in spec.axes:
        if path in CONVENIENCE_AXES:
            continue
        try:
            keys[path] = axis_keys(path, base_data)
        except MmsimError as error:
            raise MmsimError(f"axis {cut(path)!r} is not a field of the base scenario {base_path.name}: "
                             f"{error.args[0]} (convenience axes: {', '.join(CONVENIENCE_AXES)})",
                             source=str(sweep_path), field=f"axes.{cut(path)}") from None
    try:
        _no_two_axes_set_one_field(list(spec.axes), keys)  # two spellings of one key
    except ValueError as error:
        raise MmsimError(str(error), source=str(sweep_path), field="axes") from None
    names = list(spec.axes)
    tasks = []
    built: set[str] = set()
    for combination in itertools.product(*(spec.axes[n] for n in names)):
        axes = dict(zip(names, combination))
        identifier = run_id(axes)
        data = copy.deepcopy(base_data)
        source = f"{sweep_path} run {identifier}"
        try:
            apply_axes(data, axes, base_path.parent, keys)
        except MmsimError as error:
            raise MmsimError(str(error), source=source) from None
        scenario = parse_scenario(data, source, base_path.parent)
        scenario.check_requested_models(source)
        check_run_size(scenario, base_path.parent, source)
        check_buildable(scenario, data, base_path.parent, source, built)
        tasks.append(RunTask(identifier, axes, data, str(base_path.parent)))
    return tasks


CLUSTER_FREE_KEYS = frozenset({"name", "description", "seed", "policy", "workload", "slo"})
"""Scenario keys a run's cluster is built without: runs that differ only in these (seeds, loads, policies) are one
build."""


def check_buildable(scenario: Scenario, data: dict, base_dir: Path, source: str, built: set[str]) -> None:
    """Refuse up front a run whose cluster cannot be built (a missing profile, a deployment's ``max_model_len``
    beyond its KV room, its offloaded layers beyond a node's RAM): checked as its engine is made, which costs no
    simulation, once for each cluster ``built`` has not seen. Made with the built-in ``static`` policy: these
    limits do not depend on the policy, and a policy file named in the scenario must not run before the sweep's
    ``--allow-policy-files`` is checked."""
    from sim.simulation import build_engine

    cluster = json.dumps({key: value for key, value in data.items() if key not in CLUSTER_FREE_KEYS},
                         sort_keys=True, default=str)
    if cluster in built:
        return
    try:
        build_engine(scenario, base_dir, "static", {})
    except MmsimError as error:
        raise MmsimError(error.args[0], source=source, field=error.field) from None
    built.add(cluster)
