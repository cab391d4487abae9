"""A report's output path never replaces the command's own inputs (a scenario, a run's files) nor a file mmsim
did not write: ``compare --out``, ``report --out`` and ``reproduce paper --html`` refuse it before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_bad_input import cli, refused, tiny_scenario, write, write_yaml

RUN = "tiny-static-paper-rtx5000-s1"
"""The folder ``compare`` keeps the tiny scenario's static run in, seed 1."""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """One finished run of the tiny scenario."""
    root = tmp_path_factory.mktemp("runs")
    code, text = cli("run", write_yaml(root / "s.yaml", tiny_scenario()), "--out", root / "run", timeout_s=60)
    assert code == 0, text
    return root / "run"


def refused_unchanged(args, victim: Path, *expected: str, timeout_s: float = 30.0) -> None:
    """The command exits 2 with one line naming ``victim`` and why, and ``victim`` keeps every byte."""
    before = victim.read_bytes()
    refused(args, str(victim), *expected, timeout_s=timeout_s)
    assert victim.read_bytes() == before


def test_compare_refuses_its_scenario_as_out(tmp_path):
    scenario = write_yaml(tmp_path / "victim.yaml", tiny_scenario())
    args = ["compare", scenario, "--policies", "static", "--seeds", "1", "--runs-dir", tmp_path / "runs"]
    refused_unchanged([*args, "--out", scenario], scenario, "also an input")
    refused_unchanged([*args, "--out", scenario, "--force"], scenario, "also an input")
    link = tmp_path / "link.html"
    link.symlink_to(scenario)
    refused_unchanged([*args, "--out", link], link, "also an input")
    assert not (tmp_path / "runs").exists(), "the refusal came after the runs"


def test_compare_refuses_out_inside_a_run_folder_it_writes(tmp_path):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    out = tmp_path / "runs" / RUN / "summary.json"
    refused(["compare", scenario, "--policies", "static", "--runs-dir", tmp_path / "runs", "--out", out],
            str(out), "inside the input folder", out=out)


def test_report_refuses_out_inside_its_run_folder(run_dir):
    summary = run_dir / "summary.json"
    refused_unchanged(["report", run_dir, "--out", summary], summary, "inside the input folder")
    refused(["report", run_dir.parent, "--out", run_dir / "page.html"], "inside the input folder",
            out=run_dir / "page.html")
    code, text = cli("report", run_dir, "--out", run_dir.parent / "after.html", timeout_s=60)
    assert code == 0, text


def test_existing_files_mmsim_did_not_write_are_kept(tmp_path, run_dir):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    other = write(tmp_path / "other.yaml", "name: not a report\n")
    refused_unchanged(["report", run_dir, "--out", other], other, "not an HTML page written by mmsim")
    compare = ["compare", scenario, "--policies", "static", "--runs-dir", tmp_path / "runs", "--out", other]
    refused_unchanged(compare, other, "not an HTML page written by mmsim", "--force")
    assert not (tmp_path / "runs").exists()
    code, text = cli(*compare, "--force", timeout_s=60)
    assert code == 0, text
    assert other.read_bytes().startswith(b"<!DOCTYPE html")


def test_reproduce_html_refuses_a_file_it_did_not_write(tmp_path):
    victim = write_yaml(tmp_path / "victim.yaml", tiny_scenario())
    refused_unchanged(["reproduce", "paper", "--platform", "rtx5000", "--html", victim], victim,
                      "not an HTML page written by mmsim", timeout_s=10)
    profile = write(tmp_path / "p.json", "{}")
    refused_unchanged(["reproduce", "paper", "--platform", "rtx5000", "--profile", f"rtx5000={profile}",
                       "--html", profile], profile, "also an input", timeout_s=10)


def test_a_command_rewrites_its_own_previous_page(tmp_path, run_dir):
    page = tmp_path / "report.html"
    for _ in range(2):
        code, text = cli("report", run_dir, "--out", page, timeout_s=60)
        assert code == 0, text
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    compared = tmp_path / "compare.html"
    for _ in range(2):
        code, text = cli("compare", scenario, "--policies", "static", "--runs-dir", tmp_path / "runs",
                         "--out", compared, timeout_s=60)
        assert code == 0, text
    assert page.read_bytes().startswith(b"<!DOCTYPE html") and compared.read_bytes().startswith(b"<!DOCTYPE html")
