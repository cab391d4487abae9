"""``mmsim run`` end to end: shipped scenarios write their files; bad input is one line, exit 2, no output."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, mmsim_in_process, scenario_dict

FILES = ("summary.json", "requests.parquet", "events.parquet", "timeseries.parquet", "scenario.json")


def mmsim(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["mmsim", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("scenario", ["scenarios/paper-preemption.yaml", "scenarios/azure-two-models.yaml",
                                      "scenarios/offload.yaml"])
def test_shipped_scenario_writes_results(tmp_path, scenario):
    out = tmp_path / "run"
    result = mmsim("run", scenario, "--out", str(out))
    assert result.returncode == 0, result.stderr
    for name in FILES:
        assert (out / name).is_file()
    summary = json.loads((out / "summary.json").read_text())
    requests = pd.read_parquet(out / "requests.parquet")
    assert summary["requests_total"] == len(requests) == summary["requests_completed"] + summary["requests_dropped"]
    for key in ("throughput_tokens_per_s", "throughput_requests_per_s", "goodput_requests_per_s", "slo_attainment",
                "preemptions", "simulated_seconds", "sim_wall_seconds", "seed", "policy"):
        assert key in summary
    assert summary["engine_build"] in ("compiled", "pure-python")
    for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    dropped = requests[requests["status"] == "dropped"]
    assert (dropped["drop_reason"] != "").all()


def test_multi_gpu_scenario_summary_table_and_json(tmp_path):
    result = mmsim("run", "scenarios/mixed.yaml", "--policy", "static", "--out", str(tmp_path / "a"), "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert "SLO attainment" in result.stdout and str(tmp_path / "a") in result.stdout
    as_json = mmsim("run", "scenarios/mixed.yaml", "--policy", "static", "--out", str(tmp_path / "b"), "--seed", "3", "--json")
    summary = json.loads(as_json.stdout)
    assert summary["seed"] == 3 and summary["policy"] == "static"
    assert len({r for r in pd.read_parquet(tmp_path / "b" / "requests.parquet")["gpu"] if r >= 0}) > 1


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, expected", [
    ("name: [unclosed", "not valid YAML at line"),
    ("- just\n- a list\n", "expected a YAML mapping"),
    (json.dumps(scenario_dict(models=[{"name": "gpt-9"}])), "models.0.name"),
    (json.dumps(scenario_dict(engine={"block_size": 0})), "engine.block_size"),
    (json.dumps(scenario_dict(slo={"nobody": {"ttft_s": 1}})), "nobody"),
    (json.dumps(scenario_dict(profile="no-such-profile")), "unknown profile"),
    (json.dumps(scenario_dict(policy={"name": "no-such-policy"})), "unknown policy"),
    (json.dumps(scenario_dict(policy={"name": "swap-aware", "params": {"bogus": 1}})), "bogus"),
])
def test_bad_scenarios_are_one_line_exit_2_and_write_nothing(tmp_path, text, expected):
    out = tmp_path / "out"
    result = mmsim("run", _write(tmp_path, text), "--out", str(out))
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 2
    assert not out.exists() or not any(out.iterdir())


def test_bad_flags_exit_2(tmp_path):
    assert mmsim("run", "scenarios/mixed.yaml", "--mode", "slow", "--out", str(tmp_path)).returncode == 2
    assert mmsim("run", "scenarios/mixed.yaml", "--seed", "abc").returncode == 2
    missing = mmsim("run", "no/such/file.yaml")
    assert missing.returncode == 2 and "scenario file not found" in missing.stderr


def test_policies_list_names_every_builtin():
    listing = mmsim("policies", "list").stdout
    for name in ("static", "fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware"):
        assert name in listing


def test_mig_slices_are_separate_gpus():
    from sim.scenario import parse_scenario
    from sim.simulation import simulate

    scenario = parse_scenario(scenario_dict(profile="a100-80gb", cluster={"nodes": 1, "gpus_per_node": 1,
                                                                         "mig": {"profile": "3g.40gb", "slices_per_gpu": 2}}), "test")
    result = simulate(scenario)
    assert result.requests["status"].eq("completed").all()
    assert set(result.requests["gpu"]) == {0, 1}


def test_mig_slice_runs_slower_by_its_compute_share():
    from sim.catalogue import get_model
    from sim.costs import ModelCosts
    from sim.profile import load_profile
    from sim.scenario import parse_scenario
    from sim.simulation import simulate
    from tests.test_engine import chunk_of

    scenario = parse_scenario(scenario_dict(profile="a100-80gb", models=[{"name": "qwen2.5-3b"}],
                                            cluster={"nodes": 1, "gpus_per_node": 1, "mig": {"profile": "3g.40gb", "slices_per_gpu": 2}}), "t")
    row = simulate(scenario, chunks=chunk_of([100.0], ["qwen2.5-3b"], [50], [20])).requests.iloc[0]
    profile = load_profile("a100-80gb")
    costs = ModelCosts(profile, get_model("qwen2.5-3b"))
    whole_gpu = costs.prefill_s(50) + costs.step_coefficients(1).steps_s(51, 1, 19)
    # 3 of the GPU's 7 compute slices: its 20 steps' GPU work takes 7/3 as long; the serving engine's CPU time per
    # step (one sequence in each) does not move.
    entry = profile.models.get("qwen2.5-3b")
    overhead = entry.step_overhead if entry is not None and entry.step_overhead else profile.step_overhead
    assert overhead is not None and overhead.fixed_s > 0
    cpu_s = 20 * (overhead.fixed_s + overhead.per_seq_s)
    assert row["e2e_s"] == pytest.approx((whole_gpu - cpu_s) * 7 / 3 + cpu_s, rel=1e-9)


def test_a_mig_slice_slows_the_gpu_layers_not_the_offloaded_ones():
    # 1g.10gb is 1/7 of an A100: only the GPU's work takes 7x as long. With half the layers on the CPU, the step
    # gains 6x its GPU part, which is less than 6x all but the engine's overhead (what 7x the whole step gave).
    from sim.catalogue import get_model
    from sim.costs import ModelCosts
    from sim.profile import load_profile

    profile = load_profile("a100-80gb")
    whole, slice_ = (ModelCosts(profile, get_model("qwen2.5-3b"), gpu_slowdown=slowdown) for slowdown in (1.0, 7.0))
    overhead_s = whole.step_overhead_s + whole.step_overhead_per_seq_s
    assert overhead_s > 0
    on_gpu = slice_.decode_step_s(1, 1000, 1.0) - whole.decode_step_s(1, 1000, 1.0)
    assert on_gpu == pytest.approx(6 * (whole.decode_step_s(1, 1000, 1.0) - overhead_s), rel=1e-12)
    offloaded_gain = slice_.decode_step_s(1, 1000, 0.5) - whole.decode_step_s(1, 1000, 0.5)
    assert 0 < offloaded_gain < 0.75 * 6 * (whole.decode_step_s(1, 1000, 0.5) - overhead_s)


def test_profile_override_from_the_command_line(tmp_path):
    result = mmsim("run", "scenarios/azure-two-models.yaml", "--profile", "h100-sxm", "--out", str(tmp_path / "o"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["profile"] == "h100-sxm"
    bad = mmsim("run", "scenarios/azure-two-models.yaml", "--profile", "nope", "--out", str(tmp_path / "p"))
    assert bad.returncode == 2 and "unknown profile" in bad.stderr and not (tmp_path / "p").exists()
    # the flag is to blame, not the scenario file, and compare says so before its progress bar starts
    assert bad.stderr.strip().startswith("error: --profile: unknown profile 'nope'"), bad.stderr
    blank = mmsim("compare", "scenarios/azure-two-models.yaml", "--policies", "static", "--profile", " ",
                  "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "r.html"))
    assert blank.returncode == 2 and blank.stderr.strip() == "error: --profile: needs a built-in profile name or a " \
        "profile JSON file", blank.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "r.html").exists()


def pool_scenario(tmp_path: Path, pools: list[dict]) -> Path:
    data = scenario_dict(cluster={"pools": pools}, models=[{"name": "qwen2.5-3b"}])
    data["workload"]["generator"]["duration_s"] = 5
    path = tmp_path / "pools.yaml"
    path.write_text(json.dumps(data))
    return path


def test_profile_override_replaces_a_lone_pools_own_profile_and_refuses_pools_of_several(tmp_path):
    # A lone pool of its own profile: --profile replaces it (the run says so, and scenario.json records it).
    lone = pool_scenario(tmp_path, [{"name": "only", "profile": "a100-80gb", "nodes": 1}])
    result = mmsim("run", str(lone), "--profile", "h100-sxm", "--out", str(tmp_path / "o"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["profile"] == "h100-sxm"
    ran = json.loads((tmp_path / "o" / "scenario.json").read_text())
    assert ran["profile"] == "h100-sxm" and ran["cluster"]["pools"][0]["profile"] == "h100-sxm"
    # Two pools of their own profiles: the flag would replace neither, so it is refused, naming them.
    two = pool_scenario(tmp_path, [{"name": "a", "profile": "a100-80gb", "nodes": 1},
                                   {"name": "h", "profile": "h100-sxm", "nodes": 1}])
    refused = mmsim("run", str(two), "--profile", "h100-sxm", "--out", str(tmp_path / "p"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and not (tmp_path / "p").exists()
    assert refused.stderr.strip() == ("error: --profile: the scenario's cluster has pools with profiles of their own "
                                      "(a: a100-80gb; h: h100-sxm), which --profile does not replace; set each pool's "
                                      "profile in the scenario (cluster.pools[].profile) instead"), refused.stderr


@pytest.mark.parametrize("command", ["run", "compare", "sweep", "capacity", "report"])
def test_help_shows_no_value_beside_an_on_off_flag(capsys, command):
    """typer listed `--force <bool>` (and `--help <bool>`), and `--force true` is refused: a flag takes no value."""
    code, out, _ = mmsim_in_process(capsys, command, "--help")
    assert code == 0 and "--help" in out
    assert "<bool>" not in out and "(0.01)" not in out
