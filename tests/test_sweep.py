"""Sweeps: expansion and validation, local pool vs Ray giving identical runs, resume after a kill, failed runs, report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import MMSIM_CLI, wall_clock_limit
from sim.errors import MmsimError
from sim.sweep.execute import Backend, run_sweep
from sim.sweep.index import read_index
from sim.sweep.report import cost_table, sweep_report
from sim.sweep.spec import expand, gpu_layout, load_sweep, run_id

WALL_FIELDS = ("sim_wall_seconds", "requests_per_wall_second")

SCENARIO = {
    "name": "tiny", "seed": 1, "profile": "paper-rtx5000",
    "cluster": {"nodes": 1, "gpus_per_node": 2},
    "models": [{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}],
    "workload": {"generator": {"duration_s": 60, "arrivals": {"process": "poisson", "rate_per_s": 2.0},
                               "mix": {"qwen2.5-3b": 0.6, "qwen3-8b": 0.4},
                               "prompt_tokens": {"dist": "lognormal", "mean": 400, "cv": 1.0},
                               "output_tokens": {"dist": "lognormal", "mean": 120, "cv": 1.0}}},
    "slo": {"default": {"ttft_s": 1.0, "tpot_s": 0.08}},
    "policy": {"name": "static"},
}
AXES = {"policy.name": ["static", "swap-aware"], "seed": [1, 2], "load": [1, 2]}


def write_sweep(folder: Path, axes: dict = AXES, scenario: dict = SCENARIO) -> Path:
    (folder / "tiny.yaml").write_text(yaml.safe_dump(scenario))
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "tiny.yaml", "axes": axes}, sort_keys=False))
    return path


def sweep(path: Path, out: Path, **options) -> dict:
    spec = load_sweep(path)
    return run_sweep(expand(spec, path), out, axes=list(spec.axes), show_progress=False, **options)


def comparable(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    summary = json.loads((run_dir / "summary.json").read_text())
    for name in WALL_FIELDS:
        summary.pop(name)
    return summary, pd.read_parquet(run_dir / "requests.parquet")


def test_expansion_applies_axes_and_ids_are_stable(tmp_path):
    tasks = expand(load_sweep(write_sweep(tmp_path)), tmp_path / "sweep.yaml")
    assert len(tasks) == 8 and len({t.run_id for t in tasks}) == 8
    loaded = {(t.axes["load"], t.scenario_data["workload"]["time_scale"]) for t in tasks}
    assert loaded == {(1, 1.0), (2, 0.5)}
    first = tasks[0]
    assert first.scenario_data["policy"]["name"] == first.axes["policy.name"]
    assert first.run_id == run_id(dict(first.axes)) and first.run_id.startswith("static_1_1-")


@pytest.mark.parametrize("axes, message", [
    ({"workload.generator.arrivals.rate": [1.0]}, "axes.workload.generator.arrivals.rate"),
    ({"seed": ["x"]}, "run x-"),
    ({"load": [0]}, "axes"),
    ({"gpus": [3]}, "cannot be laid out"),
    ({"models.5.dtype": ["fp16"]}, "axes.models.5.dtype"),  # was an IndexError traceback: the base has 2 models
    ({"seed": list(range(100)), "engine.max_num_seqs": list(range(1, 101)), "engine.block_size": list(range(1, 101))},
     "1,000,000 runs"),  # was minutes of validating combinations before the first word
    # Two axes on one field: the later one won, and the index recorded the other's value.
    ({"load": [2], "workload.time_scale": [0.5]}, "axes 'load' and 'workload.time_scale' both set workload.time_scale"),
    ({"gpus": [4], "cluster.nodes": [1]}, "axes 'gpus' and 'cluster.nodes' both set cluster.nodes"),
    ({"cluster": [{"nodes": 1}], "cluster.nodes": [2]}, "axes 'cluster' and 'cluster.nodes' both set cluster"),
])
def test_bad_axes_name_the_field_or_run(tmp_path, axes, message):
    path = write_sweep(tmp_path, axes)
    with pytest.raises(MmsimError, match=message.replace(".", r"\.")):
        expand(load_sweep(path), path)


def test_known_optional_fields_and_gpu_axis(tmp_path):
    axes = {"cluster.gpu_memory_gb": [16.0], "slo.qwen3-8b.ttft_s": [3.0], "gpus": [1, 4]}
    tasks = expand(load_sweep(write_sweep(tmp_path, axes)), tmp_path / "sweep.yaml")
    assert [(t.scenario_data["cluster"]["nodes"], t.scenario_data["cluster"]["gpus_per_node"]) for t in tasks] == [(1, 1), (2, 2)]
    assert gpu_layout(6, 4) == (2, 3) and gpu_layout(5, 4) is None


def test_pool_and_ray_give_identical_runs(tmp_path):
    path = write_sweep(tmp_path)
    pool = sweep(path, tmp_path / "pool", workers=2)
    assert pool["ran"] == 8 and pool["failed"] == 0
    index = read_index(tmp_path / "pool")
    assert list(index["status"]) == ["ok"] * 8
    assert {"run_id", "policy.name", "seed", "load", "slo_attainment", "ttft_p99_s", "reload_s", "cost_usd",
            "cost_per_1k_requests_usd", "cost_per_million_output_tokens_usd", "gpu_hours"} <= set(index.columns)
    # Two RTX 5000s at the profile's default $0.80 per GPU-hour, billed for the whole run.
    assert (index["cost_usd"] == index["gpu_hours"] * 0.80).all() and (index["gpu_hours"] > 0).all()
    assert (tmp_path / "pool" / "index.csv").is_file()
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[cluster]'); the Ray half needs it")
    ray_out = sweep(path, tmp_path / "ray", workers=2, use_ray=True)
    assert ray_out["ran"] == 8 and ray_out["failed"] == 0
    for run_dir in sorted((tmp_path / "pool" / "runs").iterdir()):
        summary_pool, requests_pool = comparable(run_dir)
        summary_ray, requests_ray = comparable(tmp_path / "ray" / "runs" / run_dir.name)
        assert summary_pool == summary_ray
        pd.testing.assert_frame_equal(requests_pool, requests_ray)


def test_resume_after_kill_skips_finished_runs(tmp_path):
    scenario = json.loads(json.dumps(SCENARIO))
    scenario["workload"]["generator"]["duration_s"] = 300
    path = write_sweep(tmp_path, {"seed": list(range(1, 13))}, scenario)
    out = tmp_path / "out"
    command = [*MMSIM_CLI, "sweep", str(path), "--workers", "1", "--out", str(out), "-q"]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("runs/*/summary.json"))) < 2 and process.poll() is None:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)  # the sweep's own process group: the CLI and its pool worker
    process.wait()
    done = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    assert 2 <= len(done) < 12, "the sweep should have been killed midway"
    resumed = sweep(path, out, workers=2)
    assert resumed["skipped"] == len(done) and resumed["ran"] == 12 - len(done)
    assert {name: (out / "runs" / name / "summary.json").stat().st_mtime_ns for name in done} == done
    assert list(read_index(out)["status"]) == ["ok"] * 12


BOOM = """
from sim.policies.static import StaticPolicy


class Boom(StaticPolicy):
    name = "boom"

    def on_arrival(self, request, view):
        raise ValueError("boom at an arrival")
"""


def test_failed_run_is_recorded_and_others_go_on(tmp_path):
    (tmp_path / "boom.py").write_text(BOOM)
    boom = f"{tmp_path}/boom.py:Boom"
    path = write_sweep(tmp_path, {"policy.name": ["static", boom]})
    outcome = sweep(path, tmp_path / "out", workers=2)
    assert outcome["failed"] == 1 and outcome["ran"] == 2
    index = read_index(tmp_path / "out").set_index("policy.name")
    assert index.loc["static", "status"] == "ok"
    assert index.loc[boom, "status"] == "failed"
    assert "boom at an arrival" in index.loc[boom, "error"]
    error = (tmp_path / "out" / "runs" / index.loc[boom, "run_id"] / "error.txt").read_text()
    assert "boom at an arrival" in error and "Traceback" not in error  # a user policy's error: its line
    again = sweep(path, tmp_path / "out", workers=1)
    assert again["skipped"] == 1 and again["ran"] == 1  # a failed run is retried, a finished one is not


def test_a_missing_profile_is_refused_before_any_run(tmp_path):
    """Was a failed run found as it ran (the others ran first): a run's cluster is now built up front."""
    path = write_sweep(tmp_path, {"profile": ["paper-rtx5000", "missing-profile.json"]})
    with pytest.raises(MmsimError, match="missing-profile.json") as refused:
        expand(load_sweep(path), path)
    assert "run missing-profile.json-" in str(refused.value)


def test_ray_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MmsimError, match="pip install"):
        with Backend(1, use_ray=True):
            pass


def test_sweep_report_is_self_contained_html(tmp_path):
    path = write_sweep(tmp_path, {"policy.name": ["static", "swap-aware"], "seed": [1, 2], "load": [0.5, 1]})
    sweep(path, tmp_path / "out", workers=2)
    (tmp_path / "out" / "capacity.json").write_text(json.dumps({"query": {"target": 0.9, "seeds": [1, 2]}, "policies": [
        {"policy": "static", "max_load": 1.5, "max_load_bound": "exact", "attainment_at_max": 0.91}]}))
    page = sweep_report(tmp_path / "out", tmp_path / "sweep.html").read_text()
    assert page.count("<svg") == 3 and "Capacity at SLO attainment" in page and 'href="runs/static_1_0.5-' in page
    assert "Cost and SLO attainment" in page and "$ / 1k req" in page
    assert "<script" not in page and 'src="http' not in page and "<link" not in page  # nothing fetched from outside


@pytest.mark.parametrize("name, damage, expected", [
    ("index.parquet", lambda data: data[:100], "unreadable sweep index"),
    ("sweep.json", lambda data: data[:5], "not valid JSON"),
    ("sweep.json", lambda data: b"[]", "expected a JSON object"),
])
def test_sweep_report_of_a_damaged_folder_names_the_file(tmp_path, name, damage, expected):
    """Each was a traceback (ArrowInvalid, JSONDecodeError, AttributeError) instead of one line."""
    out = tmp_path / "out"
    sweep(write_sweep(tmp_path, {"seed": [1]}), out, workers=1)
    path = out / name
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(MmsimError, match=expected) as error:
        sweep_report(out, tmp_path / "sweep.html")
    assert str(path) in str(error.value) and not (tmp_path / "sweep.html").exists()


def test_autoscaler_and_pool_axes(tmp_path):
    scenario = json.loads(json.dumps(SCENARIO))
    scenario["cluster"] = {"pools": [{"name": "p", "nodes": 1, "max_nodes": 2, "gpus_per_node": 2}]}
    scenario["autoscaler"] = {"name": "predictive", "params": {"target_in_flight": 24}}
    axes = {"autoscaler.params.target": [3], "autoscaler.name": ["queue-depth"], "cluster.pools.0.nodes": [2]}
    [task] = expand(load_sweep(write_sweep(tmp_path, axes, scenario)), tmp_path / "sweep.yaml")
    # The predictive autoscaler's parameters are dropped with its name; the params axis outlives them.
    assert task.scenario_data["autoscaler"] == {"name": "queue-depth", "params": {"target": 3}}
    assert task.scenario_data["cluster"]["pools"][0]["nodes"] == 2
    tasks = expand(load_sweep(write_sweep(tmp_path, {"autoscaler.name": ["none", "predictive"]}, scenario)),
                   tmp_path / "sweep.yaml")
    assert [t.scenario_data["autoscaler"].get("params") for t in tasks] == [None, {"target_in_flight": 24}]
    with pytest.raises(MmsimError, match="cluster.pools.N.nodes"):
        expand(load_sweep(write_sweep(tmp_path, {"gpus": [2]}, scenario)), tmp_path / "sweep.yaml")
    with pytest.raises(MmsimError, match="unknown autoscaler 'bogus'"):
        expand(load_sweep(write_sweep(tmp_path, {"autoscaler.name": ["bogus"]}, scenario)), tmp_path / "sweep.yaml")


def test_mixed_fleet_sweep_carries_cost_and_placement_pays(repo, tmp_path):
    path = repo / "scenarios" / "sweep-mixed-fleet.yaml"
    with wall_clock_limit(120):
        outcome = sweep(path, tmp_path / "out", workers=2)
    assert outcome["ran"] == 4 and outcome["failed"] == 0
    index = read_index(tmp_path / "out")
    # Four A100s at $1.80 and four H100s at $3.00 billed alike: $2.40 per GPU-hour on average.
    assert index["cost_usd"].to_numpy() == pytest.approx(index["gpu_hours"].to_numpy() * 2.40, rel=1e-12)
    per_1k = index["cost_usd"] / index["requests_completed"] * 1000
    assert index["cost_per_1k_requests_usd"].to_numpy() == pytest.approx(per_1k.to_numpy(), rel=1e-12)
    means = index.groupby("cluster.placement")[["slo_attainment", "cost_per_1k_requests_usd"]].mean()
    assert means.loc["hardware-aware", "slo_attainment"] > means.loc["blind", "slo_attainment"] + 0.05
    assert means.loc["hardware-aware", "cost_per_1k_requests_usd"] < means.loc["blind", "cost_per_1k_requests_usd"]
    rows = {r["series"]: r for r in cost_table(index, ["cluster.placement", "seed", "workload.generator.duration_s"])}
    assert rows["cluster.placement=hardware-aware"]["pareto"] and not rows["cluster.placement=blind"]["pareto"]
    page = sweep_report(tmp_path / "out", tmp_path / "sweep.html").read_text()
    assert "SLO attainment per series" in page and "Cost and SLO attainment" in page


def test_a_sweep_runs_only_into_a_new_folder_or_its_own(tmp_path):
    """Into another sweep's folder it rewrote that sweep's index without its runs; into a folder of other files it
    mixed its own with them."""
    cli = lambda path, out: subprocess.run([*MMSIM_CLI, "sweep", str(path), "--workers", "1", "--out", str(out), "-q"],
                                           capture_output=True, text=True, timeout=300)
    path = write_sweep(tmp_path, {"seed": [1]})
    out = tmp_path / "out"
    assert cli(path, out).returncode == 0 and cli(path, out).returncode == 0  # its own folder: resumed
    other = tmp_path / "other"
    other.mkdir()
    (other / "sweep.yaml").write_text(yaml.safe_dump({"name": "u", "base": "../tiny.yaml", "axes": {"load": [1]}}))
    refused = cli(other / "sweep.yaml", out)
    assert refused.returncode == 2 and "holds sweep 't' over ['seed'], not sweep 'u' over ['load']" in refused.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    refused = cli(path, tmp_path / "mine")
    assert refused.returncode == 2 and "holds other files and no sweep" in refused.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("base, message", [
    (".", r"base scenario '\.' is a folder"),
    ("sweep.yaml", "names this sweep file itself"),
    ("missing.yaml", r"not found \(looked in [^,]*missing.yaml, missing.yaml\)"),
])
def test_a_base_that_is_no_scenario_file_is_named_as_what_it_is(tmp_path, monkeypatch, base, message):
    # "." said "not found (looked in ., .)", and the sweep file itself said "models: Field required".
    path = write_sweep(tmp_path)
    path.write_text(yaml.safe_dump({"name": "t", "base": base, "axes": AXES}, sort_keys=False))
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(MmsimError, match=message):
        expand(load_sweep(path), path)
