"""HTML comparison reports: the page is valid, offline, small, complete, and renders in headless Chromium."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import html5lib
import pytest
import yaml
from typer.testing import CliRunner

from sim.cli import app
from sim.errors import MmsimError
from sim.reports import build_report, load_run
from sim.reports.compare import compare
from sim.reports.verdict import verdict
from sim.reports.data import by_policy

POLICIES = ("static", "fcfs-swap")
SECTIONS = ("verdict", "summary", "plots", "reproduce")
PLOT_TITLES = ("Latency CDFs", "SLO attainment per model", "Throughput and queue depth over time",
               "GPU memory by model", "Model residency per GPU", "Where the overhead goes")
SCENARIO = {
    "name": "tiny", "seed": 3, "profile": "paper-rtx5000",
    "cluster": {"nodes": 1, "gpus_per_node": 2, "host_memory_gb": 64},
    "models": [{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}, {"name": "qwen2.5-14b"}],
    "workload": {"generator": {"duration_s": 40, "arrivals": {"process": "poisson", "rate_per_s": 3.0},
                               "mix": {"qwen2.5-3b": 0.5, "qwen3-8b": 0.3, "qwen2.5-14b": 0.2},
                               "prompt_tokens": {"dist": "lognormal", "mean": 600, "cv": 1.0, "max": 3000},
                               "output_tokens": {"dist": "lognormal", "mean": 120, "cv": 1.0, "max": 800}}},
    "slo": {"default": {"ttft_s": 2.0, "tpot_s": 0.1}},
    "engine": {"max_num_seqs": 32},
}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Two policies × two seeds of a small scenario, run through ``compare`` (run folders kept)."""
    root = tmp_path_factory.mktemp("compare")
    scenario = root / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    report, runs = compare(scenario, list(POLICIES), seeds=2, out=root / "out" / "tiny.html",
                           runs_dir=root / "runs", show_progress=False)
    return report, runs, root


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium) — cannot render the report headless")
    return path


def test_compare_keeps_every_run_folder(compared):
    report, runs, root = compared
    assert report.is_file()
    assert sorted(p.name for p in (root / "runs").iterdir()) == sorted(
        f"tiny-{p}-paper-rtx5000-s{s}" for p in POLICIES for s in (3, 4))
    assert {(r.policy, r.seed) for r in runs} == {(p, s) for p in POLICIES for s in (3, 4)}


def test_html_is_valid_offline_and_small(compared):
    report = compared[0]
    text = report.read_text(encoding="utf-8")
    html5lib.HTMLParser(strict=True).parse(text)
    assert report.stat().st_size < 3_000_000
    # xmlns declarations name namespaces; they are not fetched. Anything that would be fetched is refused.
    assert not re.search(r'(?:src|href)\s*=\s*["\']?(?:https?:)?//', text)
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//|@import", text)
    assert "<link" not in text and "<script src" not in text


def test_every_policy_section_and_plot_is_present(compared):
    text = compared[0].read_text(encoding="utf-8")
    for policy in POLICIES:
        assert f">{policy} <small>(2 seeds)" in text
    for section in SECTIONS:
        assert f'<section id="{section}">' in text
    for title in PLOT_TITLES:
        assert f"<h3>{title}</h3>" in text
    assert text.count("<svg") >= len(PLOT_TITLES)
    assert "±" not in text and "2 seeds: no interval" in text  # two seeds are too few for an interval
    assert "one seed" not in text and "mean over 2 seeds" in text  # captions match the number of seeds
    assert "mmsim compare scenarios/tiny.yaml --policies static,fcfs-swap --seeds 2" in text


def test_report_from_run_folders_matches_compare(compared, tmp_path):
    _, _, root = compared
    out = tmp_path / "again.html"
    result = CliRunner().invoke(app, ["report", str(root / "runs"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "report:" in result.output and out.is_file()
    text = out.read_text(encoding="utf-8")
    assert all(f">{policy} <small>" in text for policy in POLICIES)


def test_report_refuses_a_folder_without_runs(tmp_path):
    with pytest.raises(MmsimError, match="holds no run"):
        CliRunner().invoke(app, ["report", str(tmp_path)], catch_exceptions=False)


def test_compare_never_replaces_a_finished_run_of_another_scenario_without_force(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    short = {**SCENARIO, "workload": {"generator": {**SCENARIO["workload"]["generator"], "duration_s": 5}}}
    scenario.write_text(yaml.safe_dump(short))
    compare(scenario, ["static"], out=tmp_path / "first.html", runs_dir=tmp_path / "runs", show_progress=False)
    scenario.write_text(yaml.safe_dump({**short, "engine": {"max_num_seqs": 16}}))  # same name, another scenario
    with pytest.raises(MmsimError, match="already holds a finished run of another scenario"):
        compare(scenario, ["static"], out=tmp_path / "again.html", runs_dir=tmp_path / "runs", show_progress=False)
    assert not (tmp_path / "again.html").exists()
    compare(scenario, ["static"], out=tmp_path / "again.html", runs_dir=tmp_path / "runs", show_progress=False,
            force=True)
    assert (tmp_path / "again.html").is_file()


def test_compare_with_force_never_writes_its_page_over_a_file_the_runs_read(tmp_path):
    # --force lets the page replace a file mmsim did not write; it wrote HTML over the scenario's profile, its trace
    # and the policy file, and every later run on them failed.
    profile = tmp_path / "prof.json"
    profile.write_text(Path("sim/data/profiles/paper-rtx5000.json").read_text())
    policy = tmp_path / "mine.py"
    policy.write_text("from sim.policies.static import StaticPolicy\n\nclass Mine(StaticPolicy):\n    name = 'mine'\n")
    scenario = tmp_path / "tiny.yaml"
    short = {**SCENARIO, "profile": "prof.json",
             "workload": {"generator": {**SCENARIO["workload"]["generator"], "duration_s": 5}}}
    scenario.write_text(yaml.safe_dump(short))
    for target in (profile, policy, scenario):
        before = target.read_bytes()
        with pytest.raises(MmsimError, match="the output is also an input of this command"):
            compare(scenario, ["static", f"{policy}:Mine"], out=target, runs_dir=tmp_path / "runs",
                    show_progress=False, force=True)
        assert target.read_bytes() == before
    assert not (tmp_path / "runs").exists()


def test_the_next_command_a_run_prints_runs_beside_it(tmp_path, monkeypatch):
    """`mmsim run` prints a `compare` to try next; it runs the same (scenario, policy, seed) again into the run's
    own folder, which is the same run made again, not a folder to refuse. The same run twice is also allowed."""
    monkeypatch.chdir(tmp_path)
    short = {**SCENARIO, "workload": {"generator": {**SCENARIO["workload"]["generator"], "duration_s": 5}}}
    Path("tiny.yaml").write_text(yaml.safe_dump(short))
    runner = CliRunner()
    first = runner.invoke(app, ["run", "tiny.yaml", "--policy", "static"], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    folder = Path("reports/runs/tiny-static-paper-rtx5000-s3")
    requests = (folder / "requests.parquet").read_bytes()
    hint = next(line for line in first.output.splitlines() if line.startswith("next: mmsim compare "))
    again = runner.invoke(app, hint.removeprefix("next: mmsim ").split(), env={"COLUMNS": "200"})
    assert again.exit_code == 0, again.output
    assert (folder / "requests.parquet").read_bytes() == requests  # deterministic for its seed
    assert runner.invoke(app, ["run", "tiny.yaml", "--policy", "static"]).exit_code == 0


def test_the_next_command_keeps_the_runs_profile_seed_and_autoscaler(tmp_path, monkeypatch):
    """A run on another profile (a calibrated one, say) and seed suggests a comparison on that profile from that
    seed, which remakes the run itself in place; a path with a space in it comes back quoted for a shell."""
    monkeypatch.chdir(tmp_path)
    short = {**SCENARIO, "workload": {"generator": {**SCENARIO["workload"]["generator"], "duration_s": 5}}}
    Path("my scenarios").mkdir()
    Path("my scenarios/tiny.yaml").write_text(yaml.safe_dump(short))
    runner = CliRunner()
    first = runner.invoke(app, ["run", "my scenarios/tiny.yaml", "--policy", "static", "--profile", "paper-a6000",
                                "--seed", "9", "--autoscaler", "none"], env={"COLUMNS": "300"})
    assert first.exit_code == 0, first.output
    hint = next(line for line in first.output.splitlines() if line.startswith("next: mmsim compare "))
    words = shlex.split(hint.removeprefix("next: "))
    assert words[2] == "my scenarios/tiny.yaml"
    assert words[words.index("--profile") + 1] == "paper-a6000" and words[words.index("--seed") + 1] == "9"
    folder = Path("reports/runs/tiny-static-paper-a6000-s9")
    made = (folder / "requests.parquet").read_bytes()
    again = runner.invoke(app, words[1:], env={"COLUMNS": "300"})
    assert again.exit_code == 0, again.output
    assert (folder / "requests.parquet").read_bytes() == made
    assert sorted(p.name for p in Path("reports/runs").iterdir() if p.name.startswith("tiny-static")) == [
        "tiny-static-paper-a6000-s10", "tiny-static-paper-a6000-s11", "tiny-static-paper-a6000-s9"]


def test_compare_prints_the_verdict_and_ranking_before_the_path(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "workload": {"generator": {
        **SCENARIO["workload"]["generator"], "duration_s": 10}}}))
    result = CliRunner().invoke(app, ["compare", str(scenario), "--policies", "static,swap-aware", "--out",
                                      str(tmp_path / "r.html"), "--runs-dir", str(tmp_path / "runs")],
                                env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    text, flat = result.output, " ".join(result.output.split())  # the console may wrap at 80 columns
    assert flat.index("dropped ones as misses") < flat.index("ranking (goodput") < flat.index("report:")
    assert "TTFT" in text and "completed" in text
    ranked = [line for line in text.splitlines() if line.startswith("│ 1 ") or line.startswith("│ 2 ")]
    assert len(ranked) == 2 and text.rstrip().splitlines()[-1].startswith("report:")


def test_unknown_policy_fails_before_running(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    with pytest.raises(MmsimError, match="unknown policy"):
        compare(scenario, ["static", "no-such-policy"], out=tmp_path / "r.html", runs_dir=tmp_path, show_progress=False)
    assert not (tmp_path / "r.html").exists()


def test_verdict_names_the_winner_and_margin(compared):
    runs = compared[1]
    sentence = verdict(by_policy(runs))
    assert "goodput" in sentence and "SLO attainment" in sentence
    assert any(f"<b>{p}</b>" in sentence for p in POLICIES)
    assert "over <b>" in sentence or "tied with <b>" in sentence
    assert "dropped ones as misses" in sentence


def test_single_run_report(compared, tmp_path):
    run = load_run(compared[1][0].path)
    out = build_report([run], tmp_path / "one.html")
    text = out.read_text(encoding="utf-8")
    assert "Only one policy" in text and "1 seed: no interval" in text
    assert "one seed" in text and "mean over" not in text and "whiskers: 95%" not in text
    html5lib.HTMLParser(strict=True).parse(text)


def test_renders_in_headless_chromium(compared, tmp_path):
    browser = chromium()
    report = compared[0]
    shot = tmp_path / "shot.png"
    common = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    logged = subprocess.run([*common, "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
                             "--window-size=1400,3000", report.as_uri()], capture_output=True, text=True, timeout=120)
    log = logged.stdout + logged.stderr
    assert "Uncaught" not in log, log
    console_errors = [line for line in log.splitlines() if "CONSOLE" in line and report.name in line]
    assert not console_errors, console_errors
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    dom = subprocess.run([*common, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-sortable="ready"' in dom  # the sorting script ran to its end
    for policy in POLICIES:
        assert f">{policy} <small>" in dom
