"""`mmsim report` on run and sweep folders holding what no run writes, given to the real ``mmsim`` in a subprocess:
±inf or all-NaN times in a run's tables, a summary.json figure of the wrong type or more digits than Python
converts, a billing event the fleet plot cannot replay, and a sweep.json whose ``axes`` name no column of the
index. Each was a traceback (matplotlib's "Axis limits cannot be NaN or Inf", ValueError, KeyError, TypeError);
now one ``error:`` line naming the file (and column or field), exit 2, no page written. Every command runs under
a timeout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import wall_clock_limit
from sim.reports.compare import compare
from tests.test_bad_input_traces_round47 import mmsim, one_error_line
from tests.test_report_inputs import SCENARIO
from tests.test_sweep import sweep, write_sweep

TEST_TIMEOUT_S = 150


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """One finished run folder (static, one seed) of a tiny scenario."""
    root = tmp_path_factory.mktemp("round47")
    scenario = root / "inputs.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    _, done = compare(scenario, ["static"], out=root / "r.html", runs_dir=root / "runs", show_progress=False)
    assert done[0].path is not None
    return done[0].path


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory) -> Path:
    """A finished sweep folder over two seeds."""
    root = tmp_path_factory.mktemp("round47-sweep")
    sweep(write_sweep(root, {"seed": [1, 2]}), root / "out", workers=1)
    return root / "out"


def refused(folder: Path, tmp_path: Path, *expected: str) -> str:
    """`mmsim report FOLDER`: exit 2, one ``error:`` line holding each of ``expected``, no traceback, no page (nor
    the writer's temporary file)."""
    out = tmp_path / "report.html"
    with wall_clock_limit(TEST_TIMEOUT_S):
        line = one_error_line(*mmsim(["report", folder, "--out", out], tmp_path), expected)
    assert not out.exists() and not list(tmp_path.glob(".report.html.*")), "a page was left behind"
    return line


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def edit_table(folder: Path, name: str, edit) -> None:
    frame = pd.read_parquet(folder / name)
    edit(frame)
    frame.to_parquet(folder / name)


def edit_summary(folder: Path, edit) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    edit(summary)
    (folder / "summary.json").write_text(json.dumps(summary))


# --- 1. a run's times are finite (NaN only where a request never got there) -----------------------------------------

def _first_row(column: str, value: float):
    def edit(frame: pd.DataFrame) -> None:
        frame[column] = frame[column].astype(float)
        frame.loc[0, column] = value
    return edit


def _every_row(column: str, value: float):
    def edit(frame: pd.DataFrame) -> None:
        frame[column] = np.full(len(frame), value)
    return edit


@pytest.mark.parametrize("name, edit, expected", [
    ("requests.parquet", _first_row("finish_s", np.inf),
     "requests.parquet: finish_s holds inf (row 0); a run's times are finite (NaN where a request never got there)"),
    ("events.parquet", _first_row("duration_s", np.inf), "events.parquet: duration_s holds inf (row 0)"),
    ("timeseries.parquet", _first_row("time_s", np.inf), "timeseries.parquet: time_s holds inf (row 0)"),
    ("timeseries.parquet", _first_row("time_s", -np.inf), "timeseries.parquet: time_s holds -inf (row 0)"),
    ("timeseries.parquet", _every_row("time_s", np.nan), "timeseries.parquet: time_s holds NaN or null (row 0)"),
])
def test_a_time_no_run_writes_is_refused_naming_the_file_and_column(run_folder, tmp_path, name, edit, expected):
    """Were matplotlib's "Axis limits cannot be NaN or Inf", or "cannot convert float NaN to integer"."""
    folder = copy_of(run_folder, tmp_path)
    edit_table(folder, name, edit)
    refused(folder, tmp_path, f"{folder}/{expected}")


def test_nan_where_a_run_leaves_it_is_still_reported(run_folder, tmp_path):
    """A dropped request's first_token_s and finish_s are NaN in every run: not a damaged file."""
    folder = copy_of(run_folder, tmp_path)

    def drop_first(frame: pd.DataFrame) -> None:
        for column in ("first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s"):
            frame.loc[0, column] = np.nan
    edit_table(folder, "requests.parquet", drop_first)
    with wall_clock_limit(TEST_TIMEOUT_S):
        code, text = mmsim(["report", folder, "--out", tmp_path / "ok.html"], tmp_path)
    assert code == 0 and (tmp_path / "ok.html").is_file(), text[-3000:]


def test_a_billing_event_for_no_pool_is_refused(run_folder, tmp_path):
    """Was KeyError: the fleet plot replays billing events onto the summary's pools."""
    folder = copy_of(run_folder, tmp_path)
    events = pd.read_parquet(folder / "events.parquet")
    row = events.iloc[[0]].copy()
    row["kind"], row["detail"] = "billing", "pool=nowhere gpus=+1"
    pd.concat([events, row], ignore_index=True).to_parquet(folder / "events.parquet")
    refused(folder, tmp_path, f"{folder}/events.parquet: billing event (row {len(events)}) has detail "
                              "'pool=nowhere gpus=+1'; expected 'pool=NAME gpus=N'")


# --- 2. summary.json: every figure the report reads has the type a run writes ------------------------------------

def _huge_digits(folder: Path) -> None:
    path = folder / "summary.json"
    text = path.read_text()
    summary = json.loads(text)
    path.write_text(text.replace(f'"requests_total": {summary["requests_total"]}', '"requests_total": ' + "9" * 5000))


@pytest.mark.parametrize("damage, expected", [
    (_huge_digits, "summary.json: not valid JSON of a run (a number of more than 4,300 digits; damaged?)"),
    (lambda f: edit_summary(f, lambda s: s.update(seed=float("inf"))),
     "summary.json: seed: expected a finite whole number, found inf"),
    (lambda f: edit_summary(f, lambda s: s.update(lost_seconds=[1])),
     "summary.json: lost_seconds: expected a JSON object or null, found [1]"),
    (lambda f: edit_summary(f, lambda s: s["ttft_s"].update(p90="slow")),
     "summary.json: ttft_s.p90: expected a number or null, found 'slow'"),
    (lambda f: edit_summary(f, lambda s: s.update(drop_reasons={"not_placed": "many"})),
     "summary.json: drop_reasons.not_placed: expected a number, found 'many'"),
    (lambda f: edit_summary(f, lambda s: s["fleet"]["pools"]["default"].pop("price_per_gpu_hour")),
     "summary.json: fleet.pools.default: lacks price_per_gpu_hour"),
    (lambda f: edit_summary(f, lambda s: s.update(per_slo_class={"gold": "x"})),
     "summary.json: per_slo_class.gold: expected a JSON object, found 'x'"),
    (lambda f: edit_summary(f, lambda s: s.update(provenance="x")),
     "summary.json: provenance: expected a JSON object or null, found 'x'"),
    (lambda f: edit_summary(f, lambda s: s.update(simulated_seconds=float("inf"))),
     "summary.json: simulated_seconds: expected a finite number, found inf"),
    (lambda f: edit_summary(f, lambda s: s.update(policy="static\ud800")),
     "summary.json: text in it holds a lone surrogate"),
])
def test_a_damaged_summary_figure_is_refused_naming_the_field(run_folder, tmp_path, damage, expected):
    """Were ValueError (digits past Python's limit, float("slow")), OverflowError, AttributeError, KeyError,
    UnicodeEncodeError in matplotlib."""
    folder = copy_of(run_folder, tmp_path)
    damage(folder)
    refused(folder, tmp_path, f"{folder}/{expected}")


# --- 3. sweep.json: axes are columns of the index ----------------------------------------------------------------

@pytest.mark.parametrize("axes", [["nope"], 5, "seed"])
def test_sweep_axes_naming_no_index_column_are_refused(sweep_folder, tmp_path, axes):
    """Were KeyError 'nope', TypeError (5 is not iterable) and KeyError 's' (a text iterated letter by letter)."""
    folder = copy_of(sweep_folder, tmp_path)
    meta = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**meta, "axes": axes}))
    refused(folder, tmp_path, f"{folder}/sweep.json: axes: expected a list of the index's axis columns "
                              f"(index.parquet has: seed), each once, found {axes!r}")
