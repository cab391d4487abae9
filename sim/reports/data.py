"""The runs a report compares: each run's summary and tables, loaded from a run folder or taken from memory."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.errors import MmsimError
from sim.files import cut
from sim.reports.validate import check_billing, check_summary, check_table

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
    """A JSON file of a run folder, or one error naming it. Not :func:`sim.files.load_json`: its caps, made for
    files people write (16 MiB, a million values), would refuse the summary of a run with 100,000 SLO classes."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise MmsimError(f"cannot read it ({error.strerror or error})", source=str(path)) from None
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise MmsimError(f"not UTF-8 text (byte 0x{data[error.start]:02x}); truncated or damaged?",
                         source=str(path)) from None
    except json.JSONDecodeError as error:
        raise MmsimError(f"not valid JSON (truncated or damaged?) at line {error.lineno} column {error.colno}",
                         source=str(path)) from None
    except RecursionError:
        raise MmsimError("not valid JSON (nested too deeply: damaged?)", source=str(path)) from None
    except ValueError as error:  # a whole number of more digits than Python converts (4,300)
        reason = (f"a number of more than {sys.get_int_max_str_digits():,} digits" if "digits" in str(error)
                  else cut(str(error)))
        raise MmsimError(f"not valid JSON of a run ({reason}; damaged?)", source=str(path)) from None
    try:  # a lone surrogate (an invalid \\ud800 escape) cannot be drawn or written into the page
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        raise MmsimError("text in it holds a lone surrogate (an invalid \\ud800-\\udfff escape); damaged?",
                         source=str(path)) from None
    return value


def _read_summary(path: Path) -> dict:
    summary = _read_json(path)
    if not isinstance(summary, dict):
        raise MmsimError(f"expected a JSON object (a run summary), found a {type(summary).__name__}", source=str(path))
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        raise MmsimError(f"not a run summary: lacks {', '.join(missing)}; rerun `mmsim run` for this folder",
                         source=str(path))
    check_summary(summary, path)
    return summary


def _read_parquet(path: Path) -> pd.DataFrame:
    """One of a run's tables, with the columns ``mmsim run`` writes (a report would fail on a missing one)."""
    try:
        frame = pd.read_parquet(path)
    except Exception as error:  # pyarrow raises several types for a damaged file; each is the same user problem
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise MmsimError(f"unreadable Parquet (truncated or damaged?): {reason}; rerun `mmsim run` for this folder",
                         source=str(path)) from None
    required = _required_columns(path.name)
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise MmsimError(f"not a run's table: lacks column(s) {', '.join(missing)}; rerun `mmsim run` for this folder",
                         source=str(path))
    check_table(frame, (*required, *OPTIONAL_REQUEST_COLUMNS) if path.name == "requests.parquet" else required, path)
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
    _check_models(scenario, scenario_file)
    run = RunData(
        summary=summary,
        requests=_read_parquet(path / "requests.parquet"),
        events=_read_parquet(path / "events.parquet"),
        timeseries=_read_parquet(path / "timeseries.parquet"),
        scenario=scenario,
        path=path,
    )
    check_billing(run.events, summary, path)
    return run


def _check_models(scenario: dict | None, path: Path) -> None:
    """The scenario's ``models``, which name the report's models in order: a list of objects with a text name."""
    models = (scenario or {}).get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, dict) and isinstance(m.get("name"), str) for m in models):
        raise MmsimError(f"expected a list of models, each with a name, found {cut(repr(models))}", source=str(path),
                         field="models")


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
