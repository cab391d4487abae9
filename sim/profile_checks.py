"""What a profile's numbers may be: each within the physical range of its unit, and measured grids in order and
never falling as the batch grows. Checked on a profile's data as read (``check_bounds``) and by its models'
validators."""

from __future__ import annotations

import math
import types
import typing

from sim.errors import MmsimError

MAX_COST_S = 1e4
"""Longest duration a profile may give any one cost (a weight reload from a slow disk is minutes)."""


def is_numeric(annotation) -> bool:
    """Whether a field holds a number (``int``, ``float``, or one of them or None)."""
    kinds = set(typing.get_args(annotation)) - {type(None)} if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else {annotation}
    return bool(kinds) and kinds <= {int, float}


def _limit(name: str) -> tuple[float, float, str]:
    """(lowest, highest, unit) a number of this field name may take: finite and physically possible.

    Bounds are by unit (the name's suffix), so fields added later are bounded too; a cost of 1e300 s
    or a bandwidth of 1e-300 B/s would make a run never end.
    """
    if name.endswith("bytes_per_s") or name.endswith("flops_per_s"):
        return (1e3 if "bandwidth" in name else 1e6), 1e18, "per second"
    if name.endswith("_bytes"):
        return 0.0, float(2**60), "bytes"
    if name.endswith("_s") or name.endswith("seconds") or name.endswith("per_gib"):
        return 0.0, MAX_COST_S, "seconds"
    return 0.0, 1e9, ""


def check_grid_axis(points: list, axis: str) -> list:
    """Refuse a measured grid whose ``axis`` (batch, gpu_share) repeats a value or goes back. Two points at one
    value make interpolation ambiguous (the cost model would keep one and drop the other without a word); and
    `mmsim calibrate` writes grids in increasing order, so a point out of order is a hand edit gone wrong (a
    typo'd batch), which is why it is refused rather than sorted."""
    values = [getattr(point, axis) for point in points]
    seen = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{axis} {value:g} appears twice (expected each {axis} once)")
        seen.add(value)
    for previous, value in zip(values, values[1:]):
        if value < previous:
            raise ValueError(f"{axis} {value:g} comes after {axis} {previous:g} (expected the points in increasing "
                             f"{axis} order)")
    return points


def check_never_falls(grid: list, fields: tuple[str, ...], where: str) -> None:
    """Refuse a measured grid that prices a bigger batch below a smaller one (physics never inverts)."""
    points = sorted(grid, key=lambda point: point.batch)
    for smaller, bigger in zip(points, points[1:]):
        for name in fields:
            low, high = getattr(smaller, name), getattr(bigger, name)
            if high < low:
                raise ValueError(f"{where}: {name} falls from {low:.6g} at batch {smaller.batch} to {high:.6g} at batch "
                                 f"{bigger.batch}; a grid must not fall as the batch grows (more sequences never cost "
                                 "less: `mmsim calibrate` fits it so)")


def check_bounds(data: object, source: str) -> None:
    """Every number of a profile's data within the physical range of its unit (see ``_limit``); the
    ``samples`` and ``validation`` records are kept as measured. Checked on the data, not on the models,
    because the cost model also builds these models from derived numbers."""
    pending = [(data, "", "")]
    while pending:
        node, key, path = pending.pop()
        if isinstance(node, dict):
            pending.extend((value, str(name), f"{path}.{name}" if path else str(name)) for name, value in node.items()
                           if name not in ("samples", "validation"))
        elif isinstance(node, list):
            pending.extend((value, key, f"{path}.{index}") for index, value in enumerate(node))
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and node and math.isfinite(node):
            low, high, unit = _limit(key)
            if not low <= abs(node) <= high:
                raise MmsimError(f"{node:g} is out of range (at most {high:g}{' ' + unit if unit else ''}"
                                 f"{f', at least {low:g}' if low else ''})", source=source, field=path)
