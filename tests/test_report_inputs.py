"""`mmsim report` on damaged or incomparable run folders: one line naming the folder, file or field; exit 2; no
report written."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import yaml

from sim.cli import main
from sim.reports.compare import compare

SCENARIO = {
    "name": "inputs", "seed": 2, "profile": "paper-rtx5000",
    "cluster": {"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 32},
    "models": [{"name": "qwen2.5-3b"}],
    "workload": {"generator": {"duration_s": 10, "arrivals": {"process": "poisson", "rate_per_s": 2.0},
                               "mix": {"qwen2.5-3b": 1.0},
                               "prompt_tokens": {"dist": "constant", "value": 200},
                               "output_tokens": {"dist": "constant", "value": 20}}},
    "slo": {"default": {"ttft_s": 2.0}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished run folders (static and swap-aware, one seed) of a tiny scenario."""
    root = tmp_path_factory.mktemp("inputs")
    scenario = root / "inputs.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    _, done = compare(scenario, ["static", "swap-aware"], out=root / "r.html", runs_dir=root / "runs",
                      show_progress=False)
    return [run.path for run in done]


def report(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `mmsim report ARGS` in this process; its exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "argv", ["mmsim", "report", *args])
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def copies(runs, tmp_path):
    out = []
    for folder in runs:
        shutil.copytree(folder, tmp_path / folder.name)
        out.append(tmp_path / folder.name)
    return out


def assert_refused(result, out, *fragments):
    code, _, err = result
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not out.exists()


@pytest.mark.parametrize("content, expected", [
    ("{}", "not a run summary: lacks policy"),
    ("[1, 2]", "expected a JSON object (a run summary), found a list"),
    (None, "not valid JSON (truncated or damaged?)"),
    ("SEED", "summary.json: seed: expected a number, found 'seven'"),
])
def test_damaged_summary_names_the_folder_and_file(runs, tmp_path, monkeypatch, capsys, content, expected):
    first, second = copies(runs, tmp_path)
    summary = first / "summary.json"
    text = summary.read_text()
    if content == "SEED":
        content = json.dumps({**json.loads(text), "seed": "seven"})
    summary.write_text(content if content is not None else text[: len(text) // 2])
    out = tmp_path / "r.html"
    assert_refused(report(monkeypatch, capsys, str(first), str(second), "--out", str(out)), out,
                   str(summary), expected)


def test_truncated_requests_parquet_names_the_file(runs, tmp_path, monkeypatch, capsys):
    first, second = copies(runs, tmp_path)
    table = second / "requests.parquet"
    table.write_bytes(table.read_bytes()[:100])
    out = tmp_path / "r.html"
    assert_refused(report(monkeypatch, capsys, str(first), str(second), "--out", str(out)), out,
                   str(table), "unreadable Parquet")


@pytest.mark.parametrize("name", ["requests.parquet", "events.parquet", "timeseries.parquet"])
def test_a_table_without_a_runs_columns_names_the_file(runs, tmp_path, monkeypatch, capsys, name):
    """A readable Parquet file of other columns was a KeyError traceback from deep in the report."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first, second = copies(runs, tmp_path)
    pq.write_table(pa.table({"x": [1]}), second / name)
    out = tmp_path / "r.html"
    assert_refused(report(monkeypatch, capsys, str(first), str(second), "--out", str(out)), out,
                   str(second / name), "lacks column(s)")


def test_runs_of_another_load_are_refused_naming_the_field(runs, tmp_path, monkeypatch, capsys):
    first, second = copies(runs, tmp_path)
    scenario = json.loads((second / "scenario.json").read_text())
    scenario["workload"]["generator"]["arrivals"]["rate_per_s"] = 4.0
    (second / "scenario.json").write_text(json.dumps(scenario))
    out = tmp_path / "r.html"
    assert_refused(report(monkeypatch, capsys, str(first), str(second), "--out", str(out)), out,
                   "scenario.workload.generator.arrivals.rate_per_s is 2.0", "but 4.0", "--allow-mixed")
    code, stdout, err = report(monkeypatch, capsys, str(first), str(second), "--allow-mixed", "--out", str(out))
    assert code == 0, err
    page = out.read_text(encoding="utf-8")
    assert "Group 1: scenario.workload.generator.arrivals.rate_per_s 2.0" in page
    assert "Group 2: scenario.workload.generator.arrivals.rate_per_s 4.0" in page


def test_runs_of_another_engine_build_are_refused(runs, tmp_path, monkeypatch, capsys):
    first, second = copies(runs, tmp_path)
    summary = json.loads((second / "summary.json").read_text())
    summary["engine_build"] = "compiled" if summary["engine_build"] != "compiled" else "pure-python"
    (second / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "r.html"
    assert_refused(report(monkeypatch, capsys, str(first), str(second), "--out", str(out)), out, "engine_build is")


def test_a_run_given_twice_is_refused(runs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.html"
    assert_refused(report(monkeypatch, capsys, str(runs[0]), str(runs[1]), str(runs[0]), "--out", str(out)), out,
                   "appears twice")


def test_a_bad_drop_threshold_is_refused(runs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.html"
    assert_refused(report(monkeypatch, capsys, str(runs[0]), "--drop-threshold", "5", "--out", str(out)), out,
                   "--drop-threshold")
