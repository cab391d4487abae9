"""The runs a report compares: each run's summary and tables, loaded from a run folder or taken from memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.errors import MmsimError

RUN_FILES = ("requests.parquet", "events.parquet", "timeseries.parquet")


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
        return str(self.summary.get("policy", "?"))

    @property
    def seed(self) -> int:
        return int(self.summary.get("seed", 0))


def load_run(path: Path) -> RunData:
    """Read a run folder written by ``sim.results.write_run``."""
    path = Path(path)
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        raise MmsimError(f"{path} is not a run folder (no summary.json); expected the output of `mmsim run`")
    missing = [name for name in RUN_FILES if not (path / name).is_file()]
    if missing:
        raise MmsimError(f"run folder {path} lacks {', '.join(missing)}")
    scenario_file = path / "scenario.json"
    return RunData(
        summary=json.loads(summary_file.read_text()),
        requests=pd.read_parquet(path / "requests.parquet"),
        events=pd.read_parquet(path / "events.parquet"),
        timeseries=pd.read_parquet(path / "timeseries.parquet"),
        scenario=json.loads(scenario_file.read_text()) if scenario_file.is_file() else None,
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
