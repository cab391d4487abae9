"""Points of a search: one scenario variant run under several seeds, summed up as means over the seeds.

A run that fails (e.g. the models fit no GPU of the fleet) attains 0; its cost is unknown, so the cost
figures average the runs that finished (None when none did). Every point's seeds go to the backend in
one batch with the other points', so a search step fills the pool.
"""

from __future__ import annotations

import copy
from pathlib import Path

from sim.sweep.execute import Backend
from sim.sweep.index import COST_FIGURES, summary_figures
from sim.sweep.spec import RunTask, apply_axes, run_id

MEAN_FIGURES = ("goodput_requests_per_s", *COST_FIGURES)


def make_task(base_data: dict, base_dir: Path, axes: dict, edit=None, **labels) -> RunTask:
    """The base scenario with ``axes`` applied, then ``edit(data)`` when given (a change no axis can say,
    which ``labels`` name in the run's id)."""
    data = copy.deepcopy(base_data)
    apply_axes(data, axes, base_dir)
    if edit is not None:
        edit(data)
    named = {**labels, **axes}
    return RunTask(run_id(named), named, data, str(base_dir))


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def mean_figures(outcomes: list[dict]) -> dict:
    """Mean SLO attainment (failed runs 0), the other figures' means over finished runs, and the errors."""
    ok = [summary_figures(o["summary"]) for o in outcomes if o["status"] == "ok"]
    attained = [f["slo_attainment"] or 0.0 for f in ok] + [0.0] * (len(outcomes) - len(ok))
    return {"slo_attainment": sum(attained) / len(attained), **{name: _mean([f[name] for f in ok]) for name in MEAN_FIGURES},
            "runs": len(outcomes), "failed": len(outcomes) - len(ok),
            "errors": sorted({o["error"] for o in outcomes if o["status"] != "ok"})}


def run_points(backend: Backend, points: dict) -> dict:
    """``{key: [task per seed]}`` run in one batch; ``{key: mean_figures(...)}`` in the same order."""
    tasks = [task for seeds in points.values() for task in seeds]
    if len({task.run_id for task in tasks}) != len(tasks):
        raise ValueError("two tasks of one batch share a run id")  # a caller's bug: outcomes would be mixed up
    outcomes = {outcome["run_id"]: outcome for outcome in backend.map(tasks)}
    # In seed order whatever order runs end in: the same sums, bit for bit.
    return {key: mean_figures([outcomes[task.run_id] for task in seeds]) for key, seeds in points.items()}
