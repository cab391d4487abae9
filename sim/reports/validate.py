"""What a report checks of a run folder before drawing anything: every figure of summary.json it reads has the
type ``mmsim run`` writes, and every number column of the run's tables holds what a run can hold (finite times;
NaN only where a request never got that far). A damaged file is one MmsimError naming it (and the field or
column): a report would otherwise fail deep in matplotlib or pandas, or draw nonsense.

The table checks are one vectorised pass per column (a ten-million-request run: a few tens of milliseconds)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from sim.errors import MmsimError
from sim.files import cut

# -- summary.json ------------------------------------------------------------------------------------------------
Check = Callable[[object, str, Path], None]


def _refuse(path: Path, field: str, expected: str, value: object) -> MmsimError:
    return MmsimError(f"expected {expected}, found {cut(repr(value))}", source=str(path), field=field)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(minimum: float | None = None, maximum: float | None = None, whole: bool = False,
            nullable: bool = False) -> Check:
    """A finite number (JSON's NaN and Infinity refused), within the bounds, whole if asked; None too if nullable."""
    kind = "a finite whole number" if whole else "a finite number"
    if minimum is not None and maximum is not None:
        kind += f" from {minimum:g} to {maximum:g}"
    elif minimum is not None:
        kind += f", {minimum:g} or more"

    def check(value: object, field: str, path: Path) -> None:
        if value is None and nullable:
            return
        if not _is_number(value):
            raise _refuse(path, field, "a number" + (" or null" if nullable else ""), value)
        assert isinstance(value, (int, float))
        if (isinstance(value, float) and not (math.isfinite(value) and (not whole or value.is_integer()))) or \
                (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise _refuse(path, field, kind, value)
    return check


def _text(nullable: bool = False) -> Check:
    def check(value: object, field: str, path: Path) -> None:
        if not isinstance(value, str) and not (nullable and value is None):
            raise _refuse(path, field, "text" + (" or null" if nullable else ""), value)
    return check


def _mapping(fields: dict[str, Check] | None = None, *, each: Check | None = None, required: tuple[str, ...] = (),
             nullable: bool = False) -> Check:
    """A JSON object: the listed ``fields`` checked where present (``required`` ones must be), or ``each`` value."""
    def check(value: object, field: str, path: Path) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, dict):
            raise _refuse(path, field, "a JSON object" + (" or null" if nullable else ""), value)
        missing = [key for key in required if key not in value]
        if missing:
            raise MmsimError(f"lacks {', '.join(missing)}", source=str(path), field=field)
        for key, item in value.items():
            inner = f"{field}.{cut(key, 40)}" if field else key
            if each is not None:
                each(item, inner, path)
            elif fields is not None and key in fields:
                fields[key](item, inner, path)
    return check


def _list(each: Check, nullable: bool = False) -> Check:
    def check(value: object, field: str, path: Path) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, list):
            raise _refuse(path, field, "a JSON list" + (" or null" if nullable else ""), value)
        for index, item in enumerate(value):
            each(item, f"{field}.{index}", path)
    return check


COUNT = _number(0, whole=True)
SHARE = _number(0, 1)
FIGURE = _number(nullable=True)
LATENCY = _mapping({name: FIGURE for name in ("mean", "p50", "p90", "p99")}, nullable=True)
CLASS_FIGURES = {"requests": COUNT, "slo_attainment": _number(0, 1, nullable=True)}
POOL = _mapping({"gpus_per_node": COUNT, "nodes_at_start": COUNT, "nodes_peak": COUNT,
                 "price_per_gpu_hour": _number(0)},
                required=("gpus_per_node", "nodes_at_start", "nodes_peak", "price_per_gpu_hour"))
FLEET = _mapping({"autoscaler": _text(nullable=True), "pools": _mapping(each=POOL), "cold_starts": COUNT,
                  **{name: FIGURE for name in ("gpu_hours", "cost_usd", "cost_per_1k_requests_usd",
                                               "cost_per_million_output_tokens_usd", "busy_share_of_billed")}},
                 required=("pools",))
INSTANCE = _mapping({"instance": _number(whole=True, nullable=True), "model": _text(), "gpus": _list(_number(whole=True)),
                     "prefix_queried_tokens": COUNT, "prefix_hit_tokens": COUNT, "prefix_hit_rate": SHARE},
                    required=("instance", "model", "gpus", "prefix_queried_tokens", "prefix_hit_tokens",
                              "prefix_hit_rate"))


def _fleet(value: object, field: str, path: Path) -> None:
    """The fleet figures; ``{}`` or null (an engine without pools) is no fleet."""
    if value is None or value == {}:
        return
    FLEET(value, field, path)


SUMMARY_FIELDS: dict[str, Check] = {
    "policy": _text(), "seed": _number(whole=True),
    "requests_total": COUNT, "requests_completed": COUNT, "requests_dropped": COUNT,
    "goodput_requests_per_s": _number(), "slo_attainment": SHARE,
    **{name: _text(nullable=True) for name in ("scenario", "profile", "engine_build", "mode")},
    **{name: FIGURE for name in ("throughput_tokens_per_s", "throughput_requests_per_s", "simulated_seconds",
                                 "mean_resident_models_per_gpu")},
    "gpu_busy_share": _number(0, 1, nullable=True), "preemptions": _number(0, whole=True, nullable=True),
    **{name: LATENCY for name in ("ttft_s", "tpot_s", "e2e_s", "queue_s")},
    "lost_seconds": _mapping(each=_number(), nullable=True),
    "drop_reasons": _mapping(each=COUNT, nullable=True),
    "per_model": _mapping(each=_mapping({"requests": COUNT, "slo_attainment": _number(0, 1, nullable=True),
                                         **{name: LATENCY for name in ("ttft_s", "tpot_s", "e2e_s", "queue_s")}}),
                          nullable=True),
    "per_slo_class": _mapping(each=_mapping(CLASS_FIGURES, required=("requests",)), nullable=True),
    "slo_unclassed": _mapping(CLASS_FIGURES, nullable=True),
    "per_instance": _list(INSTANCE, nullable=True),
    "fleet": _fleet,
    "provenance": _mapping(nullable=True),
}
"""What a report reads of a run summary, field by field; fields it does not read are not checked."""


def check_summary(summary: dict, path: Path) -> None:
    """Refuse the first figure of a run summary (already a JSON object) that is not what ``mmsim run`` writes."""
    for key, check in SUMMARY_FIELDS.items():
        if key in summary:
            check(summary[key], key, path)


# -- the run's tables --------------------------------------------------------------------------------------------
NEVER_REACHED = "a run's times are finite (NaN where a request never got there)"
MAY_BE_NAN = {"requests.parquet": {"first_scheduled_s": NEVER_REACHED, "first_token_s": NEVER_REACHED,
                                   "finish_s": NEVER_REACHED, "queue_s": NEVER_REACHED, "ttft_s": NEVER_REACHED,
                                   "e2e_s": NEVER_REACHED,
                                   "tpot_s": "a run's times are finite (NaN where a request never finished, or "
                                             "made one token)"}}
"""Per file, the number columns a run leaves NaN in some rows (a dropped request's first_token_s and finish_s),
with what they hold; every other number column is finite in every row."""
TEXT_COLUMNS = {"requests.parquet": ("model", "slo_class", "status", "drop_reason"),
                "events.parquet": ("kind", "model", "detail"), "timeseries.parquet": ("model",)}
"""The columns of text (or categories); every other column a report reads is numbers."""


def _always_finite(name: str, column: str) -> str:
    if column.endswith("_s"):
        return f"a run's times and seconds are finite, in every row of its {name.removesuffix('.parquet')}"
    return "a run writes a finite number there in every row"


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def check_table(frame: pd.DataFrame, columns: tuple[str, ...], path: Path) -> None:
    """Refuse a number column of one of a run's tables holding a value no run writes: ±inf anywhere, NaN where a
    run never leaves one, or text. One vectorised pass per column (a second only to word a refusal)."""
    name = path.name
    nan_allowed = MAY_BE_NAN.get(name, {})
    for column in columns:
        if column not in frame.columns or column in TEXT_COLUMNS.get(name, ()):
            continue
        series = frame[column]
        kind = series.dtype.kind
        if kind in "iub":
            continue  # whole numbers (or bools): nothing to refuse at this level
        if kind != "f":
            raise MmsimError(f"{column} holds {series.dtype} values, not numbers; rerun `mmsim run` for this folder",
                             source=str(path))
        values = series.to_numpy()
        if column in nan_allowed:
            if np.isinf(values).any():
                row = _first(np.isinf(values))
                raise MmsimError(f"{column} holds {values[row]} (row {row:,}); {nan_allowed[column]}",
                                 source=str(path))
        elif not np.isfinite(values).all():
            row = _first(~np.isfinite(values))
            found = "NaN or null" if math.isnan(values[row]) else str(values[row])
            raise MmsimError(f"{column} holds {found} (row {row:,}); {_always_finite(name, column)}", source=str(path))
    if name == "events.parquet" and len(frame) and frame["time_s"].dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            ends = frame["time_s"].to_numpy() + frame["duration_s"].to_numpy(float)
        if not np.isfinite(ends).all():
            row = _first(~np.isfinite(ends))
            raise MmsimError(f"time_s + duration_s overflows (row {row:,}); a run's events end at a finite time",
                             source=str(path))


def billing_fields(detail: object) -> dict[str, str]:
    """A billing event's detail, ``pool=NAME gpus=N`` (as the fleet controller writes it), as its fields."""
    return dict(part.split("=", 1) for part in str(detail).split() if "=" in part)


def check_billing(events: pd.DataFrame, summary: dict, path: Path) -> None:
    """Refuse a billing event whose detail is not ``pool=NAME gpus=N`` for one of the summary's pools (the fleet
    plot replays them)."""
    fleet = summary.get("fleet")
    if not fleet or not len(events):
        return
    pools = fleet["pools"]
    rows = np.flatnonzero((events["kind"] == "billing").to_numpy(bool))
    for row, detail in zip(rows, events["detail"].to_numpy(object)[rows]):
        parts = billing_fields(detail)
        gpus = parts.get("gpus", "")
        if parts.get("pool") not in pools or not gpus.lstrip("+-").isdigit() or len(gpus) > 18:
            raise MmsimError(f"billing event (row {row:,}) has detail {cut(repr(detail))}; expected "
                             f"'pool=NAME gpus=N' for a pool of summary.json's fleet ({cut(', '.join(pools))})",
                             source=str(path / "events.parquet"))
