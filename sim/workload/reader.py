"""Reading any trace format into native request chunks, streamed.

The same steps follow every format's reader: rows must be in time order; the
time origin is the first row for formats with absolute times (``rebase``),
time 0 otherwise; the ``start_s``/``end_s`` window is cut (reading stops past
its end); the window start becomes time 0 and inter-arrival times are
multiplied by ``time_scale``; model labels are mapped (and checked against a
scenario's deployments when it gives them); ``first_id``
numbers the rows that come out. Times past ``MAX_TIME_S`` after scaling are
errors (the engine's clock would lose the precision of its steps).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sim.errors import MmsimError
from sim.files import check_regular_file, cut
from sim.workload.chunk import RequestChunk
from sim.workload.columns import take
from sim.workload.config import MAX_MODEL_NAME_CHARS, MAX_TIME_S
from sim.workload.importers import get_format
from sim.workload.rows import ImportOptions, RowReport


def check_options(fmt: str, options: ImportOptions) -> None:
    """Option errors that can be found before reading (model names, map, window)."""
    spec = get_format(fmt)
    if options.model is not None and options.model_map is not None:
        raise MmsimError("give --model or --model-map, not both")
    if not spec.model_column and options.model is None:
        raise MmsimError(f"{fmt} traces have no model column; name the model (--model NAME, or model: in a scenario)")
    if not spec.model_column and options.model_map is not None:
        raise MmsimError(f"{fmt} traces have no model column to map; use --model NAME")
    if options.model is not None and not options.model.strip():
        raise MmsimError("the model name is empty; give the deployment the requests address (--model NAME)")
    for name in [options.model] if options.model else (options.model_map or {}).values():
        if len(name) > MAX_MODEL_NAME_CHARS:
            raise MmsimError(f"model name {cut(name)!r} is longer than {MAX_MODEL_NAME_CHARS} characters")
    if not (math.isfinite(options.time_scale) and 1e-6 <= options.time_scale <= 1e6):
        raise MmsimError(f"time scale must be a number from 1e-06 to 1e+06, not {options.time_scale}")
    for flag, value in (("start", options.start_s), ("end", options.end_s)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_TIME_S):
            raise MmsimError(f"the window {flag} must be a number of seconds from 0 to {MAX_TIME_S:g}, not {value}")
    if options.start_s is not None and options.end_s is not None and options.end_s <= options.start_s:
        raise MmsimError("the window end must be after its start")


def read_trace(path: Path, fmt: str = "mmsim", options: ImportOptions | None = None, *, rows: int = 65536,
               report: RowReport | None = None) -> Iterator[RequestChunk]:
    """Native chunks of up to ``rows`` requests from a trace file of format ``fmt``.

    Pass a :class:`RowReport` to learn afterwards how many rows were read,
    written, malformed (``options.skip_bad``) or dropped.
    """
    options = options or ImportOptions()
    check_options(fmt, options)
    spec = get_format(fmt)
    path = check_regular_file(Path(path), "trace file")
    report = report if report is not None else RowReport(str(path))
    origin_s = None if spec.rebase else 0.0
    latest_s = -np.inf
    start_s = options.start_s or 0.0
    end_s = np.inf if options.end_s is None else options.end_s
    emitted = 0
    only_label = None  # with ``model`` on a trace that names models: the one label its rows give
    for raw in spec.read(path, options, report, rows):
        lines = raw.extra["line"]
        earlier = raw.arrival_s < np.maximum.accumulate(np.concatenate([[latest_s], raw.arrival_s]))[:-1]
        keep = report.check(lines, [(earlier, lambda i: "earlier than the row before; traces must be sorted by time")])
        chunk = take(raw, keep)
        past_end = False
        if len(chunk):
            latest_s = max(latest_s, float(chunk.arrival_s[-1]))
            if origin_s is None:
                origin_s = float(chunk.arrival_s[0])
            relative_s = chunk.arrival_s - origin_s
            chunk = take(chunk, (relative_s >= start_s) & (relative_s < end_s))
            past_end = bool(relative_s[-1] >= end_s)
            chunk.arrival_s = (chunk.arrival_s - origin_s - start_s) * options.time_scale
            late = chunk.arrival_s > MAX_TIME_S
            chunk = take(chunk, report.check(chunk.extra["line"], [(late, lambda i: f"arrival {chunk.arrival_s[i]:.4g} "
                                                                            f"s (after the time scale) is past {MAX_TIME_S:g} s")]))
            if options.model is not None and spec.model_column and len(chunk):
                only_label = _one_label(chunk, only_label, report.unit, path)
            chunk = _map_models(chunk, spec.model_column, options, report)
        if not options.skip_bad:
            # Strict, the chunk's earliest bad row is the error, whichever stage noted it: a value check in the
            # reader must not hide an earlier row out of time order, found by a later stage.
            report.raise_first_bad()
        chunk.extra = {}
        chunk.first_id = emitted
        emitted += len(chunk)
        report.rows_out += len(chunk)
        if len(chunk):
            yield chunk
        if past_end:
            return
    if not options.skip_bad:
        report.raise_first_bad()


def _one_label(chunk: RequestChunk, label: str | None, unit: str, path: Path) -> str:
    """The one model label of a trace that ``model`` relabels (``label``: the one seen so far). A second one is an
    error, not a request sent to the wrong model: ``model`` names the model of a single-model trace, and every
    row of several models' relabelled to one was silently a different workload."""
    labels = chunk.model
    label = labels[0] if label is None else label
    other = labels != label
    if other.any():
        row = int(np.argmax(other))
        raise MmsimError(f"model {cut(labels[row])!r} is a second model in the trace's model column (the first is "
                         f"{cut(label)!r}); --model (model: in a scenario) names the model of a single-model trace: "
                         "to send several models' requests to deployments, give a model map (--model-map LABEL=NAME,"
                         "... or model_map: {LABEL: NAME})", source=str(path), field=f"{unit} {chunk.extra['line'][row]}")
    return label


def _map_models(chunk: RequestChunk, model_column: bool, options: ImportOptions, report: RowReport) -> RequestChunk:
    """Apply --model / --model-map to rows that carry model labels; unmapped or unknown labels are bad rows."""
    if not model_column or len(chunk) == 0:
        return chunk
    lines = chunk.extra["line"]
    if options.model is not None:
        chunk.model = np.full(len(chunk), options.model, dtype=object)
        return chunk
    if options.model_map is not None:
        model_map = options.model_map
        labels = chunk.model
        unmapped = _rows_with(labels, set(labels.tolist()).difference(model_map))
        keep = report.check(lines, [(unmapped, lambda i: f"model {cut(labels[i])!r} has no entry in the model map "
                                                         f"({cut(', '.join(model_map), 200)})")])
        chunk.model = np.array([model_map.get(label) for label in labels.tolist()], dtype=object)
        return take(chunk, keep)
    if options.served_models is not None:
        return _check_labels(chunk, report, options.served_models, "is not served by this scenario; map it with "
                             "model_map, drop its rows with skip_bad: true, or add it to models (served")
    labels = chunk.model
    long = _rows_with(labels, {label for label in set(labels.tolist()) if len(label) > MAX_MODEL_NAME_CHARS})
    return take(chunk, report.check(lines, [(long, lambda i: f"model {cut(labels[i])!r} is longer than "
                                                             f"{MAX_MODEL_NAME_CHARS} characters (a deployment's name)")]))


def _check_labels(chunk: RequestChunk, report: RowReport, allowed, why: str) -> RequestChunk:
    """Rows whose model label is not in ``allowed`` are bad rows, reported with ``why`` and the allowed names."""
    labels = chunk.model
    unknown = _rows_with(labels, set(labels.tolist()).difference(allowed))
    keep = report.check(chunk.extra["line"], [(unknown, lambda i: f"model {cut(labels[i])!r} {why}: "
                                                                  f"{', '.join(sorted(allowed))})")])
    return take(chunk, keep)


def _rows_with(labels: np.ndarray, wanted: set[str]) -> np.ndarray:
    """Mask of the rows whose label is in ``wanted`` (usually empty: then no row is looked at)."""
    if not wanted:
        return np.zeros(len(labels), dtype=bool)
    return np.fromiter((label in wanted for label in labels.tolist()), bool, len(labels))
