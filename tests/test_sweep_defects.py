"""Sweep defects: a report of a sweep with no finished run, a resume after the base scenario changed, and runs
whose cluster cannot be built refused before any run starts."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import yaml

from conftest import mmsim_in_process, wall_clock_limit
from sim.errors import MmsimError
from sim.sweep.execute import run_sweep
from sim.sweep.index import make_row, read_index, write_index
from sim.sweep.report import cost_table
from sim.sweep.spec import expand, load_sweep

AXES = ["policy.name", "seed"]
SCENARIO = {
    "name": "tiny", "seed": 1, "profile": "paper-rtx5000",
    "cluster": {"nodes": 1, "gpus_per_node": 2},
    "models": [{"name": "qwen2.5-3b"}],
    "workload": {"generator": {"duration_s": 20, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                               "mix": {"qwen2.5-3b": 1.0},
                               "prompt_tokens": {"dist": "lognormal", "mean": 200, "cv": 1.0},
                               "output_tokens": {"dist": "lognormal", "mean": 50, "cv": 1.0}}},
    "slo": {"default": {"ttft_s": 1.0, "tpot_s": 0.08}},
    "policy": {"name": "static"},
}


def unfinished_sweep(folder: Path, rows: list[dict]) -> Path:
    """A sweep folder as `mmsim sweep` leaves it when no run finished: sweep.json, the index, an empty runs/."""
    (folder / "runs").mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"name": "t", "base": "tiny.yaml", "axes": AXES, "runs": len(rows)}))
    write_index(folder, rows, AXES)
    return folder


@pytest.mark.parametrize("failed_seeds", [[1, 2], []], ids=["every-run-failed", "no-run-ran"])
def test_report_of_a_sweep_with_no_finished_run_says_so(tmp_path, capsys, failed_seeds):
    """Was an IndexError traceback from the cost section (``part.iloc[0]`` of no finished runs). No row at all is
    what `sweep --ray` without Ray leaves: it exits 2 after writing an empty index."""
    rows = [make_row(f"static_{seed}", {"policy.name": "static", "seed": seed}, "failed", f"ValueError: boom {seed}")
            for seed in failed_seeds]
    sweep_dir = unfinished_sweep(tmp_path / "out", rows)
    with wall_clock_limit(60):
        code, _, err = mmsim_in_process(capsys, "report", sweep_dir, "--out", tmp_path / "sweep.html")
    assert code == 0 and "Traceback" not in err, err
    page = html.unescape((tmp_path / "sweep.html").read_text())
    assert "No run of this sweep finished" in page and "<svg" not in page
    assert all(f"ValueError: boom {seed}" in page for seed in failed_seeds)
    assert cost_table(read_index(sweep_dir), AXES) == []


def write_sweep(folder: Path, scenario: dict) -> Path:
    (folder / "base.yaml").write_text(yaml.safe_dump(scenario))
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml", "axes": {"policy.name": ["static"], "seed": [1, 2]}},
                                   sort_keys=False))
    return path


def sweep(path: Path, out: Path) -> dict:
    spec = load_sweep(path)
    return run_sweep(expand(spec, path), out, axes=list(spec.axes), workers=1, show_progress=False,
                     meta={"name": spec.name})


def test_resume_refuses_runs_of_a_changed_base_scenario(tmp_path, capsys):
    """Was "0 run(s), 2 already done": the old runs (scenario.json of the old base) kept under the new base."""
    out = tmp_path / "out"
    path = write_sweep(tmp_path, SCENARIO)
    with wall_clock_limit(120):
        assert sweep(path, out)["ran"] == 2
    before = {p: p.read_bytes() for p in [out / "sweep.json", out / "index.csv", *out.glob("runs/*/scenario.json")]}
    changed = json.loads(json.dumps(SCENARIO))
    changed["workload"]["generator"]["arrivals"]["rate_per_s"] = 3.0
    write_sweep(tmp_path, changed)
    with wall_clock_limit(60):
        code, _, err = mmsim_in_process(capsys, "sweep", path, "--out", out, "--workers", "1", "-q")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(out) in err and "another scenario" in err and "--out" in err
    assert {p: p.read_bytes() for p in before} == before  # refused before writing anything
    with pytest.raises(MmsimError, match="another scenario"):
        sweep(path, out)
    write_sweep(tmp_path, SCENARIO)  # the same base again: its runs are this sweep's, and are kept
    with wall_clock_limit(60):
        assert sweep(path, out)["skipped"] == 2


@pytest.mark.parametrize("axis, values, message", [
    ("cluster.host_memory_gb", [256, 4], "more than the 4.0 GiB of a node's host memory"),
    ("models.0.max_model_len", [4096, 100_000_000], "max_model_len 100,000,000 is more than the"),
], ids=["offloaded-layers-beyond-host-ram", "max-model-len-beyond-kv-room"])
def test_a_run_whose_cluster_cannot_be_built_is_refused_up_front(tmp_path, capsys, axis, values, message):
    """Was found only when that run ran (status failed in the index, exit 1, after the other runs): what the engine
    refuses as it is built (sim.engine.limits) is now checked for every run before any starts, as a bad axis
    value is."""
    scenario = {**SCENARIO, "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 16},
                "models": [{"name": "qwen3-32b", "dtype": "q4", "gpu_share": 0.6}],
                "workload": {"generator": {**SCENARIO["workload"]["generator"], "mix": {"qwen3-32b": 1.0}}}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(scenario))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml", "axes": {axis: values}}, sort_keys=False))
    with wall_clock_limit(60):
        code, _, err = mmsim_in_process(capsys, "sweep", path, "--out", tmp_path / "out")
    assert code == 2 and "Traceback" not in err, err
    assert f"run {values[1]}-" in err and message in err, err
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_a_pool_sweep_without_starting_the_runs_it_had_queued(tmp_path):
    """A pool worker carried on after its run's KeyboardInterrupt and took the task queued to it: a sweep
    interrupted in its second run of six ran the rest before exiting, and their folders were missing from the
    index. Now every folder on disk is an indexed run, and the sweep exits within seconds of the interrupt."""
    import os
    import signal
    import subprocess
    import time

    from conftest import MMSIM_CLI, REPO

    base = yaml.safe_load((REPO / "scenarios" / "mixed.yaml").read_text())
    base["workload"]["generator"]["duration_s"] = 4000  # a few seconds a run
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "sweep.yaml").write_text("name: ctrl-c\nbase: base.yaml\naxes:\n  seed: [1, 2, 3, 4, 5, 6]\n")
    out = tmp_path / "out"
    # A process group of its own, which a terminal's Ctrl-C signals whole; SIGINT at its default, as a shell has it.
    sweep = subprocess.Popen([*MMSIM_CLI, "sweep", str(tmp_path / "sweep.yaml"), "--out", str(out), "--workers", "2"],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not (out / "runs").is_dir() or not any(p.name[0] != "." for p in (out / "runs").iterdir()):
            assert sweep.poll() is None and time.monotonic() < deadline, "the sweep ended before its first run did"
            time.sleep(0.2)
        os.killpg(sweep.pid, signal.SIGINT)
        signalled = time.monotonic()
        sweep.wait(timeout=60)
        stopped_s = time.monotonic() - signalled
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    assert sweep.returncode == 130, sweep.stderr.read() if sweep.stderr else ""
    folders = {p.name for p in (out / "runs").iterdir()}
    index = read_index(out)
    indexed = set(index.loc[index["status"] == "ok", "run_id"])
    assert folders == indexed and len(folders) < 6, (folders, indexed)
    assert stopped_s < 20, f"the sweep took {stopped_s:.0f} s to stop"
