"""The runs a report compares: each run's summary and tables, loaded from a run folder or taken from memory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.errors import MmsimError

RUN_FILES = ("requests.parquet", "events.parquet", "timeseries.parquet")
OPTIONAL_REQUEST_COLUMNS = ("cached_prompt_tokens", "slo_class")
"""Columns a report does without: runs written before prefix caching, or before SLO classes, lack them."""


def _required_columns(name: str) -> tuple[str, ...]:
    """The columns ``mmsim run`` writes into run file ``name``, that a report reads."""
    from sim.engine.recorder import EVENT_COLUMNS, SAMPLE_COLUMNS
    from sim.results import REQUEST_COLUMNS

    return {"requests.parquet": tuple(c for c in REQUEST_COLUMNS if c not in OPTIONAL_REQUEST_COLUMNS),
            "events.parquet": EVENT_COLUMNS, "timeseries.parquet": SAMPLE_COLUMNS}[name]


@dataclass
class RunData:
    """One simulation run as a report sees it."""

    summary: dict
    requests: pd.DataFrame
    events: pd.DataFrame
    timeseries: pd.DataFrame
    scenario: dict | None = None
    path: Path | None = None

    @property
    def policy(self) -> str:
        """What the run is compared by: its policy, and its autoscaler when it has one."""
        policy = str(self.summary.get("policy", "?"))
        autoscaler = (self.summary.get("fleet") or {}).get("autoscaler", "none")
        return policy if autoscaler == "none" else f"{policy} + {autoscaler}"

    @property
    def seed(self) -> int:
        return int(self.summary.get("seed", 0))


SUMMARY_KEYS = ("policy", "seed", "requests_total", "requests_completed", "requests_dropped", "goodput_requests_per_s",
                "slo_attainment")
"""What a report cannot do without: a summary lacking any of these is not one ``mmsim run`` wrote."""


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise MmsimError(f"cannot read it ({error})", source=str(path)) from None
    except json.JSONDecodeError as error:
        raise MmsimError(f"not valid JSON (truncated or damaged?) at line {error.lineno} column {error.colno}",
                         source=str(path)) from None


def _read_summary(path: Path) -> dict:
    summary = _read_json(path)
    if not isinstance(summary, dict):
        raise MmsimError(f"expected a JSON object (a run summary), found a {type(summary).__name__}", source=str(path))
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        raise MmsimError(f"not a run summary: lacks {', '.join(missing)}; rerun `mmsim run` for this folder",
                         source=str(path))
    for key in SUMMARY_KEYS[1:]:
        value = summary[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MmsimError(f"expected a number, found {value!r}", source=str(path), field=key)
    return summary


def _read_parquet(path: Path) -> pd.DataFrame:
    """One of a run's tables, with the columns ``mmsim run`` writes (a report would fail on a missing one)."""
    try:
        frame = pd.read_parquet(path)
    except Exception as error:  # pyarrow raises several types for a damaged file; each is the same user problem
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise MmsimError(f"unreadable Parquet (truncated or damaged?): {reason}; rerun `mmsim run` for this folder",
                         source=str(path)) from None
    missing = [column for column in _required_columns(path.name) if column not in frame.columns]
    if missing:
        raise MmsimError(f"not a run's table: lacks column(s) {', '.join(missing)}; rerun `mmsim run` for this folder",
                         source=str(path))
    return frame


def load_run(path: Path) -> RunData:
    """Read a run folder written by ``sim.results.write_run``; a damaged file is one MmsimError naming it."""
    path = Path(path)
    summary_file = path / "summary.json"
    if not os.path.isfile(summary_file):
        raise MmsimError(f"{path} is not a run folder (no summary.json); expected the output of `mmsim run`")
    missing = [name for name in RUN_FILES if not os.path.isfile(path / name)]
    if missing:
        raise MmsimError(f"run folder {path} lacks {', '.join(missing)}")
    summary = _read_summary(summary_file)
    scenario_file = path / "scenario.json"
    scenario = _read_json(scenario_file) if os.path.isfile(scenario_file) else None
    if scenario is not None and not isinstance(scenario, dict):
        raise MmsimError(f"expected a JSON object (the scenario as run), found a {type(scenario).__name__}",
                         source=str(scenario_file))
    return RunData(
        summary=summary,
        requests=_read_parquet(path / "requests.parquet"),
        events=_read_parquet(path / "events.parquet"),
        timeseries=_read_parquet(path / "timeseries.parquet"),
        scenario=scenario,
        path=path,
    )


def by_policy(runs: list[RunData]) -> dict[str, list[RunData]]:
    """Runs grouped by policy, in the order policies first appear, each group sorted by seed."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run.policy, []).append(run)
    return {policy: sorted(group, key=lambda r: r.seed) for policy, group in groups.items()}


def model_names(runs: list[RunData]) -> list[str]:
    """Models of the compared runs, in scenario order where known."""
    names: list[str] = []
    for run in runs:
        listed = [m["name"] for m in (run.scenario or {}).get("models", [])] or list(run.summary.get("per_model", {}))
        names += [n for n in listed if n not in names]
    return names
