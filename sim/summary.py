"""A run's summary figures, computed from its typed tables with numpy: counts, drop reasons, rates, latency
percentiles, SLO attainment, preemption and prefix-cache figures, per run and per model (and per SLO class, for a
trace whose requests have classes)."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import numpy as np

from sim.engine import build as engine_build
from sim.engine.recorder import DROP_REASONS
from sim.engine.request import LOSS_CAUSES
from sim.results import LATENCIES, ColumnTable, RequestTable


QUANTILES = (0.5, 0.9, 0.99)
"""The summary's percentiles (p50, p90, p99) as fractions."""


def percentiles(values: np.ndarray) -> dict:
    """Mean and percentiles of the values that are not NaN; ``values`` is the caller's to discard (reordered)."""
    missing = np.isnan(values)
    data = values[~missing] if missing.any() else values
    if data.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    mean = float(data.mean())  # before the percentiles reorder the data: a sum's last bits depend on its order
    p50, p90, p99 = _linear_percentiles(data)
    return {"mean": mean, "p50": p50, "p90": p90, "p99": p99}


def _linear_percentiles(data: np.ndarray) -> list[float]:
    """``np.percentile(data, [50, 90, 99], overwrite_input=True)``, bit for bit, in a tenth of its time: numpy's
    own steps (the same partition, neighbours and interpolation) without its generic machinery, which cost a
    small run's summary more than all its other figures (32 calls at ~50 us each)."""
    n = data.size
    neighbours = []
    for quantile in QUANTILES:
        virtual = (n - 1) * quantile
        below = math.floor(virtual)
        # numpy's "linear" method: from the last value on, both neighbours are the last one (index -1, which its
        # gamma subtracts as it is).
        neighbours.append((below, below + 1, virtual - below) if virtual < n - 1 else (n - 1, n - 1, virtual + 1))
    data.partition(sorted({0, n - 1, *(i for low, high, _ in neighbours for i in (low, high))}))
    values = []
    for low, high, gamma in neighbours:
        a, b = float(data[low]), float(data[high])
        step = b - a
        # numpy's _lerp: from the upper neighbour when nearer to it, for a result monotone in gamma.
        values.append(b - step * (1 - gamma) if gamma >= 0.5 else a + step * gamma)
    return values


def slo_met(table: RequestTable, completed: np.ndarray, models: np.ndarray, scenario) -> np.ndarray:
    """True for completed requests within every limit of their own SLO: their class's where they have one (its
    unset limits their model's), else their model's."""
    met = completed.copy()
    slos, groups = _slo_groups(table, models, scenario)
    for field in ("ttft_s", "tpot_s", "e2e_s"):
        limits = np.array([np.inf if getattr(slo, field) is None else getattr(slo, field) for slo in slos])
        if np.isinf(limits).all():
            continue
        values = table.column(field)
        # A completed one-token output has no TPOT (NaN): nothing of it can miss a TPOT limit.
        values[np.isnan(values)] = 0.0 if field == "tpot_s" else np.inf
        met &= values <= limits[groups]  # no limit is an infinite one: even an infinite value is within it
    return met


def _slo_groups(table: RequestTable, models: np.ndarray, scenario) -> tuple[list, np.ndarray]:
    """The SLOs requests are held to, and each request's index into them. Without classes, one per model (the
    model codes index them); else one per (model, class or none): model × (classes + 1) + class code + 1."""
    model_slos = [scenario.slo_for(model) for model in table.model_names]
    labels = table.slo_class_names
    if not labels:
        return model_slos, models
    slos = [slo.for_class(label) for slo in model_slos for label in (None, *labels)]
    groups = models.astype(np.int64) * (len(labels) + 1)
    groups += table.column("slo_class")
    groups += 1
    return slos, groups


def _total(values: np.ndarray) -> int:
    return int(values.sum())


def _max_s(values: np.ndarray) -> float:
    """The largest value, NaN left out (as pandas' ``max``); NaN when there is none."""
    finite = values[~np.isnan(values)]
    return float(finite.max()) if finite.size else float("nan")


def _rates(start: float, end: float, completed: int, tokens: int, met: int) -> dict:
    span = max(end - start, 1e-12)
    return {
        "throughput_tokens_per_s": float(tokens) / span,
        "throughput_requests_per_s": completed / span,
        "goodput_requests_per_s": float(met) / span,
        "makespan_s": end - start,
    }


def _drop_reasons(codes: np.ndarray) -> dict[str, int]:
    """Drop reason → count, most frequent first (ties in DROP_REASONS order), over dropped requests' codes."""
    counts = np.bincount(codes, minlength=len(DROP_REASONS))
    ranked = sorted(((DROP_REASONS[code], int(count)) for code, count in enumerate(counts) if code),
                    key=lambda kv: -kv[1])
    return {reason: count for reason, count in ranked if count}


def rows_by_code(codes: np.ndarray, count: int) -> list[np.ndarray]:
    """For each code 0..count-1, the positions holding it, ascending (negative codes belong to none): one stable
    sort for every code, where a scan per code cost codes × requests (100,000 SLO classes took a minute)."""
    order = np.argsort(codes, kind="stable")
    if len(codes) < 2**31:
        order = order.astype(np.int32)
    edges = np.searchsorted(codes[order], np.arange(count + 1))
    return [order[edges[code]:edges[code + 1]] for code in range(count)]


class _Groups:
    """The whole run and each model's requests (positions in id order), for figures computed one column at a
    time: ten million requests' columns are 80 MB each, so no more than a few exist at once."""

    def __init__(self, table: RequestTable, completed: np.ndarray):
        models = table.column("model")
        self.completed = completed
        self.models: list[tuple[str, np.ndarray]] = [
            (name, rows) for name, rows in zip(table.model_names, rows_by_code(models, len(table.model_names)))
            if len(rows)]
        # The model that holds every request, if one does: its figures are the run's, computed once.
        self.sole_model = self.models[0][0] if len(self.models) == 1 and len(self.models[0][1]) == len(models) else None

    def each(self, values: np.ndarray, completed_only: bool = False):
        """(None for the whole run, else the model's name; its values), in id order."""
        yield None, values[self.completed] if completed_only else values
        for name, rows in self.models:
            part = values[rows]
            yield name, part[self.completed[rows]] if completed_only else part

    def figures(self, values: np.ndarray, figure: Callable[[np.ndarray], Any], completed_only: bool = False) -> dict:
        """``figure`` of the values of the whole run (key None) and of each model's requests (key: its name)."""
        if self.sole_model is not None:
            whole = figure(values[self.completed] if completed_only else values)
            return {None: whole, self.sole_model: copy.copy(whole)}
        return {group: figure(part) for group, part in self.each(values, completed_only)}


def summarize(table: RequestTable, samples: ColumnTable, events: ColumnTable, scenario, engine, profile, policy: str,
              seed: int, mode: str, wall_s: float) -> dict:
    drops = table.column("drop_reason")
    completed = drops == 0
    met = slo_met(table, completed, table.column("model"), scenario)
    groups = _Groups(table, completed)
    rates = _group_rates(table, groups, met)
    latencies = {name: groups.figures(table.column(name), percentiles, True) for name in LATENCIES}
    preemptions = groups.figures(table.column("preemptions"), _total)
    per_model = {}
    for name, rows in groups.models:
        done = completed[rows]
        per_model[name] = {
            "requests": len(rows), "completed": int(done.sum()), "dropped": int((~done).sum()),
            "drop_reasons": _drop_reasons(drops[rows][~done]),
            "max_model_len": engine.max_model_len[engine.model_index[name]] if name in engine.model_index else None,
            "slo_attainment": float(met[rows].mean()),
            **rates[name],
            **{latency: latencies[latency][name] for latency in ("ttft_s", "tpot_s", "e2e_s")},
            "preemptions": preemptions[name],
            **_prefix_cache(engine, name),
        }
    per_class, unclassed = _per_slo_class(table, completed, met)
    kinds = events.text("kind")
    return {
        "scenario": scenario.name, "policy": policy, "seed": seed, "mode": mode, "profile": profile.name,
        "requests_total": len(table),
        "requests_completed": int(completed.sum()),
        "requests_dropped": int((~completed).sum()),
        "drop_reasons": _drop_reasons(drops[~completed]),
        **rates[None],
        "slo_attainment": float(met.mean()) if len(table) else 0.0,
        **{name: latencies[name][None] for name in LATENCIES},
        "preemptions": preemptions[None],
        "lost_seconds": {cause: float(table.column(f"lost_{cause}_s").sum()) for cause in LOSS_CAUSES},
        "simulated_seconds": float(engine.env.now),
        "sim_wall_seconds": wall_s,
        "requests_per_wall_second": len(table) / wall_s if wall_s > 0 else None,
        "engine_build": engine_build(),  # compiled or pure-python: the wall figures depend on it
        "gpu_busy_share": _busy_share(engine),
        "loads": int((kinds == "load").sum()),
        "unloads": int((kinds == "unload").sum()),
        "mean_resident_models_per_gpu": _mean_resident(samples, engine),
        "prefix_cache": _prefix_cache(engine, None),
        "per_instance": _per_instance_prefix(engine),
        "per_model": per_model,
        **({"per_slo_class": per_class} if per_class else {}),
        **({"slo_unclassed": unclassed} if unclassed else {}),  # with per_slo_class, every request's figures
        "fleet": _fleet(engine, events, completed, table),
        "provenance": profile.provenance(),
    }


def _per_slo_class(table: RequestTable, completed: np.ndarray, met: np.ndarray) -> tuple[dict, dict | None]:
    """Each SLO class's requests (by label, in label order): counts, SLO attainment and latency percentiles of its
    completed ones; then the same figures of the requests without a class (None when every request has one). Both
    empty (``{}``, None) when no request has a class.

    Every figure comes from one grouping of the requests by class code (a sort), never a scan per class: a trace
    with a label per request has as many classes as requests."""
    if not table.slo_class_names:
        return {}, None
    names = table.slo_class_names
    groups = table.column("slo_class").astype(np.int64)
    groups += 1  # 0: no class, else the class code + 1
    count = len(names) + 1
    requests = np.bincount(groups, minlength=count).tolist()
    done = np.bincount(groups[completed], minlength=count).tolist()
    good = np.bincount(groups[met], minlength=count).tolist()
    # As the mean of the requests' True/False: the share is count / requests, exactly (both below 2**53).
    figures: list[dict[str, Any]] = [
        {"requests": n, "completed": d, "dropped": n - d, "slo_attainment": g / n if n else None}
        for n, d, g in zip(requests, done, good)]
    completed_groups = groups[completed]
    for name in ("ttft_s", "tpot_s", "e2e_s"):  # one latency column at a time: 10M requests' are 80 MB each
        values = table.column(name)
        for group, stat in enumerate(grouped_percentiles(values[completed], completed_groups, count)):
            figures[group][name] = stat
    # Each label is some recorded request's, so no class is empty.
    per_class = {label: figures[code + 1] for code, label in sorted(enumerate(names), key=lambda pair: pair[1])}
    return per_class, figures[0] if requests[0] else None


GROUPED_SIZES = 128
"""Groups of at most this many values get their means and percentiles from one matrix per group size; numpy gives
each row of it what :func:`percentiles` gives the row alone, bit for bit (tests/test_slo_class_views.py checks it)."""


def grouped_percentiles(values: np.ndarray, groups: np.ndarray, count: int) -> list[dict]:
    """:func:`percentiles` of the values of each group 0..count-1 (``groups`` holds each value's, values in the
    order a group's figures take them), NaN left out; O(n log n) whatever the number of groups."""
    present = ~np.isnan(values)
    order = np.argsort(groups[present], kind="stable")  # each group's values together, in their own order
    ordered = values[present][order]
    sizes = np.bincount(groups[present], minlength=count)
    starts = np.zeros(count, np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    found: list[dict | None] = [None] * count
    by_size = np.argsort(sizes, kind="stable")  # the groups of each size together, not a scan of them per size
    distinct, firsts = np.unique(sizes[by_size], return_index=True)
    for size, first, end in zip(distinct.tolist(), firsts.tolist(), [*firsts[1:].tolist(), count]):
        members = by_size[first:end]
        if size == 0:
            for group in members.tolist():
                found[group] = {"mean": None, "p50": None, "p90": None, "p99": None}
            continue
        if size > GROUPED_SIZES:
            for group in members.tolist():
                found[group] = percentiles(ordered[starts[group]:starts[group] + size].copy())
            continue
        matrix = ordered[starts[members, None] + np.arange(size)]  # one row per group of this size
        means = matrix.mean(axis=1).tolist()  # before the percentiles reorder the rows, as percentiles() does
        p50, p90, p99 = np.percentile(matrix, [50, 90, 99], axis=1, overwrite_input=True).tolist()
        for group, mean, low, high, top in zip(members.tolist(), means, p50, p90, p99):
            found[group] = {"mean": mean, "p50": low, "p90": high, "p99": top}
    return found  # type: ignore[return-value]  # every group was given its figures


def _fleet(engine, events: ColumnTable, completed: np.ndarray, table: RequestTable) -> dict | None:
    """GPU-hours and cost (see :mod:`sim.fleet.cost`); None for an engine built without pools."""
    if not engine.pools:
        return None
    from sim.fleet.cost import fleet_summary

    controller = getattr(engine, "fleet", None)
    tokens = int(table.column("output_tokens")[completed].sum())
    return fleet_summary(engine, engine.pools, events, int(completed.sum()), tokens,
                         controller.autoscaler.name if controller else "none",
                         controller.peak_nodes if controller else None)


def _prefix_cache(engine, name: str | None) -> dict:
    """Prompt tokens looked up in prefix caches at every admission, those found, and their share (vLLM's
    prefix-cache hit rate), for one model or (``name`` None) all; the found ones are prefill tokens saved."""
    models = range(len(engine.model_names)) if name is None else \
        ([engine.model_index[name]] if name in engine.model_index else [])
    queried = sum(engine.prefix_query_tokens[m] for m in models)
    found = sum(engine.prefix_hit_tokens[m] for m in models)
    return {"prefix_queried_tokens": queried, "prefix_hit_tokens": found,
            "prefix_hit_rate": found / queried if queried else 0.0}


def _per_instance_prefix(engine) -> list[dict]:
    """Each instance's prefix-cache figures, in load order: its GPUs, prompt tokens looked up at every admission,
    those found (= prefill tokens saved) and their share. An unloaded instance leaves the engine with its
    counters, so what the model's unloaded instances counted is one row per model (``instance`` None), the
    model's total less its live instances'."""
    rows, live = [], [[0, 0] for _ in engine.model_names]
    for instance in engine.instances:
        gpus = [g.index for g in instance.shards] if instance.shards else [instance.gpu.index]
        rows.append((instance.uid, instance.name, gpus, instance.prefix_query_tokens, instance.prefix_hit_tokens))
        live[instance.model][0] += instance.prefix_query_tokens
        live[instance.model][1] += instance.prefix_hit_tokens
    for model, name in enumerate(engine.model_names):
        gone = engine.prefix_query_tokens[model] - live[model][0]
        if gone:
            rows.append((None, name, [], gone, engine.prefix_hit_tokens[model] - live[model][1]))
    return [{"instance": uid, "model": name, "gpus": gpus, "prefix_queried_tokens": queried, "prefix_hit_tokens": found,
             "prefix_hit_rate": found / queried if queried else 0.0, "prefill_tokens_saved": found}
            for uid, name, gpus, queried, found in rows]


def _group_rates(table: RequestTable, groups: _Groups, met: np.ndarray) -> dict:
    """Throughput, goodput and makespan of the run (key None) and of each model."""
    starts = groups.figures(table.column("arrival_s"), lambda values: float(values.min()) if len(values) else 0.0)
    ends = groups.figures(table.column("finish_s"), lambda values: _max_s(values) if len(values) else None, True)
    tokens = groups.figures(table.column("output_tokens"), _total, True)
    done = groups.figures(groups.completed, _total)
    good = groups.figures(met, _total)
    return {group: _rates(starts[group], starts[group] if ends[group] is None else ends[group], done[group],
                          tokens[group], good[group]) for group in starts}


def _busy_share(engine) -> float:
    now = engine.env.now
    if now <= 0 or not engine.gpus:
        return 0.0
    return float(np.mean([min(1.0, g.busy_s / now) for g in engine.gpus]))


def _mean_resident(samples: ColumnTable, engine) -> float:
    """Models resident per GPU, averaged over the run's time (a GPU with none counts as 0).

    Each sample stands for the time until the next one (the last: until the run's end): the grid's interval, or
    the still stretch the sampler passed over after it (nothing changed in it)."""
    on_gpu = samples.column("gpu") >= 0
    resident = on_gpu & (samples.column("model") != samples.texts["model"].index(""))
    if not resident.any():
        return float(np.mean([len(g.instances) for g in engine.gpus]))
    times, per_time = np.unique(samples.column("time_s")[on_gpu], return_inverse=True)
    weights = np.diff(times, append=max(times[-1], engine.env.now))
    if not weights.any():
        weights = np.ones(len(times))  # one sample, at the run's very end
    rows = np.bincount(per_time, weights=resident[on_gpu].astype(np.float64), minlength=len(times))
    return float(np.dot(rows, weights) / (weights.sum() * len(engine.gpus)))


# -- files -------------------------------------------------------------------------------------------------
