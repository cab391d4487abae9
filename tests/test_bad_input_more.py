"""More bad input a new user found: a mix share that is no share, a profile grid naming a point twice or out of
order, and list flags with an empty or repeated entry. Each is refused in one line naming the file, field or flag,
with exit code 2, no traceback and no output. Helpers are test_bad_input.py's."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import MMSIM_CLI, scenario_dict
from tests.test_bad_input import PROFILE, refused, tiny_scenario, write, write_yaml


def refused_leaving_nothing(args, *expected: str, outputs=()) -> str:
    """``refused``, and none of ``outputs`` (report file, runs folder, results folder) was written."""
    text = refused(args, *expected)
    for path in outputs:
        assert not path.exists(), f"{path} was left behind"
    return text


# --- workload.generator.mix: each share a number >= 0 ----------------------------------------------------------

def _with_mix(tmp_path, mix):
    data = scenario_dict()
    data["workload"]["generator"]["mix"] = mix
    return write_yaml(tmp_path / "s.yaml", data)


@pytest.mark.parametrize("share, expected", [
    (-0.5, "workload.generator.mix.qwen3-8b: expected a share >= 0 (a number), not -0.5"),
    (float("nan"), "workload.generator.mix.qwen3-8b: expected a share >= 0 (a number), not nan"),
    ("abc", "workload.generator.mix.qwen3-8b: expected a share >= 0 (a number), not 'abc'"),
    ("0.5", "workload.generator.mix.qwen3-8b: expected a share >= 0 (a number), not '0.5'"),  # quoted in YAML
    (True, "workload.generator.mix.qwen3-8b: expected a share >= 0 (a number), not True"),
    (None, "workload.generator.mix.qwen3-8b: expected a share >= 0 (a number), not None"),
    (float("inf"), "workload.generator.mix.qwen3-8b: expected a share of at most 1e+12, not inf"),
])
def test_a_bad_share_is_named_by_its_model(tmp_path, share, expected):
    """A negative share was a pydantic union error naming ZipfMix.zipf and '4 more problem(s)'."""
    scenario = _with_mix(tmp_path, {"qwen2.5-3b": 0.5, "qwen3-8b": share})
    text = refused(["run", scenario, "--out", tmp_path / "o"], f"{scenario}: {expected}", out=tmp_path / "o")
    assert "ZipfMix" not in text and "more problem" not in text


@pytest.mark.parametrize("mix, expected", [
    ({"qwen2.5-3b": 0, "qwen3-8b": 0.0}, "workload.generator.mix: has only shares of 0: expected {model: share, ...} "
                                         "with at least one share above 0"),
    ({}, "workload.generator.mix: is empty: expected {model: share, ...} with at least one share above 0"),
    ([0.5, 0.5], "workload.generator.mix: expected {model: share, ...} or {zipf: exponent, models: [...]}"),
    ({"zipf": -1, "models": ["qwen3-8b"]}, "workload.generator.mix.zipf: Input should be greater than or equal to 0"),
    ({"zipf": 1.0, "models": []}, "workload.generator.mix.models"),
])
def test_a_mix_that_is_no_mix_gets_one_clear_message(tmp_path, mix, expected):
    scenario = _with_mix(tmp_path, mix)
    text = refused(["run", scenario, "--out", tmp_path / "o"], f"{scenario}: {expected}", out=tmp_path / "o")
    assert "ZipfMix" not in text and "more problem" not in text


def test_good_mixes_still_load(tmp_path):
    from sim.scenario import load_scenario

    shares = load_scenario(_with_mix(tmp_path, {"qwen2.5-3b": 1, "qwen3-8b": 0})).workload.generator.mix
    assert shares == {"qwen2.5-3b": 1.0, "qwen3-8b": 0.0}
    zipf = load_scenario(_with_mix(tmp_path, {"zipf": 1, "models": ["qwen3-8b", "qwen2.5-3b"]})).workload.generator
    assert zipf.model_names() == ["qwen3-8b", "qwen2.5-3b"]


def test_a_negative_share_through_the_mmsim_command(tmp_path):
    """The same line from the installed entry point, in a process of its own."""
    scenario = _with_mix(tmp_path, {"qwen2.5-3b": 0.5, "qwen3-8b": -0.5})
    done = subprocess.run([*MMSIM_CLI, "run", str(scenario), "--out", str(tmp_path / "o")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"error: {scenario}: workload.generator.mix.qwen3-8b: expected a share >= 0 "
                                   "(a number), not -0.5")
    assert not (tmp_path / "o").exists()


# --- profile grids: each point once, in increasing order --------------------------------------------------------

def _decode_grid(batches):
    return [{"batch": b, "base_s": 1e-4 * (1 + i), "per_context_token_s": 1e-9 * (1 + i)}
            for i, b in enumerate(batches)]


def _head_grid(batches):
    return [{"batch": b, "seconds": 1e-3 * (1 + i)} for i, b in enumerate(batches)]


def _offload(shares):
    return {"source": "measured", "points": [{"gpu_share": s, "normalized_throughput": 0.5} for s in shares]}


def _cpu_costs(entry, batches):
    entry["cpu"] = {**entry["gpu"], "source": "estimated", "decode_grid": _decode_grid(batches)}


GRID_CASES = [
    (lambda m: m["gpu"].update(decode_grid=_decode_grid([1, 8, 8, 16])), "models.qwen2.5-3b.gpu.decode_grid",
     "batch 8 appears twice"),
    (lambda m: m["gpu"].update(decode_grid=_decode_grid([1, 8, 4, 8])), "models.qwen2.5-3b.gpu.decode_grid",
     "batch 8 appears twice"),  # a repeat is named before the order
    (lambda m: m["gpu"].update(decode_grid=_decode_grid([1, 16, 8])), "models.qwen2.5-3b.gpu.decode_grid",
     "batch 8 comes after batch 16 (expected the points in increasing batch order)"),
    (lambda m: _cpu_costs(m, [2, 2]), "models.qwen2.5-3b.cpu.decode_grid", "batch 2 appears twice"),
    (lambda m: m.update(head_gpu_grid=_head_grid([1, 4, 4])), "models.qwen2.5-3b.head_gpu_grid",
     "batch 4 appears twice"),
    (lambda m: m.update(head_cpu_grid=_head_grid([4, 2])), "models.qwen2.5-3b.head_cpu_grid",
     "batch 2 comes after batch 4"),
    (lambda m: m.update(offload_curve=_offload([0.5, 1.0, 0.5])), "models.qwen2.5-3b.offload_curve.points",
     "gpu_share 0.5 appears twice"),
    (lambda m: m.update(offload_curve=_offload([1.0, 0.5])), "models.qwen2.5-3b.offload_curve.points",
     "gpu_share 0.5 comes after gpu_share 1"),
]


def _grid_profile(tmp_path, edit):
    data = json.loads(PROFILE.read_text())
    edit(data["models"]["qwen2.5-3b"])
    return write(tmp_path / "p.json", json.dumps(data))


@pytest.mark.parametrize("edit, field, expected", GRID_CASES)
def test_a_grid_point_twice_or_out_of_order_is_refused(tmp_path, edit, field, expected):
    """A batch given twice was accepted and one of its two costs silently dropped."""
    profile = _grid_profile(tmp_path, edit)
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", scenario, "--profile", profile, "--out", tmp_path / "o"], f"{profile}: {field}: {expected}",
            out=tmp_path / "o")


def test_a_grid_point_twice_in_the_scenarios_profile(tmp_path):
    profile = _grid_profile(tmp_path, GRID_CASES[0][0])
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(profile=str(profile)))
    refused(["run", scenario, "--out", tmp_path / "o"], f"{profile}: models.qwen2.5-3b.gpu.decode_grid: batch 8 "
            "appears twice (expected each batch once)", out=tmp_path / "o")


def test_an_increasing_grid_is_accepted(tmp_path):
    from sim.profile import load_profile_file

    def edit(entry):
        entry["gpu"]["decode_grid"] = _decode_grid([1, 8, 16])
        entry["head_gpu_grid"] = _head_grid([1, 8, 16])
        entry["offload_curve"] = _offload([0.25, 0.5, 1.0])

    costs = load_profile_file(_grid_profile(tmp_path, edit)).models["qwen2.5-3b"]
    assert [p.batch for p in costs.gpu.decode_grid] == [1, 8, 16]


# --- list flags: no empty entry, no entry twice; single names not blank ----------------------------------------

@pytest.mark.parametrize("policies, expected", [
    ("static,", "--policies: empty entry in 'static,' (expected comma-separated policy names"),
    (",", "--policies must name at least one policy, not ','"),
    ("", "--policies must name at least one policy, not ''"),
    ("static,,swap-aware", "--policies: empty entry in 'static,,swap-aware'"),
    (" , static", "--policies: empty entry in ' , static'"),
    ("static,static", "--policies names 'static' and 'static'"),  # compare's own check: it knows the run folders
])
def test_compare_policies(tmp_path, policies, expected):
    """`--policies static,` ran static alone and `static,,swap-aware` the two, dropping the empty name unsaid."""
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    runs, report = tmp_path / "runs", tmp_path / "r.html"
    refused_leaving_nothing(["compare", scenario, "--policies", policies, "--out", report, "--runs-dir", runs],
                            expected, outputs=(runs, report))


@pytest.mark.parametrize("flags, expected", [
    (["--policy", ""], "--policy: needs a policy name or path/to/file.py:Class"),  # ran the scenario's policy
    (["--policy", "  "], "--policy: needs a policy name or path/to/file.py:Class"),
    (["--policy", "statik"], "--policy: unknown policy 'statik'"),
    (["--autoscaler", ""], "--autoscaler: needs an autoscaler name"),  # was blamed on autoscaler.name
    (["--autoscaler", "nope"], "--autoscaler: unknown autoscaler 'nope'"),
    (["--profile", ""], "--profile: needs a built-in profile name or a profile JSON file"),
])
def test_run_single_name_flags(tmp_path, flags, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused_leaving_nothing(["run", scenario, *flags, "--out", tmp_path / "o"], expected, outputs=(tmp_path / "o",))


@pytest.mark.parametrize("flags, expected", [
    (["--autoscaler", ""], "--autoscaler: needs an autoscaler name"),
    (["--profile", " "], "--profile: needs a built-in profile name"),
])
def test_compare_single_name_flags(tmp_path, flags, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    runs, report = tmp_path / "runs", tmp_path / "r.html"
    refused_leaving_nothing(["compare", scenario, "--policies", "static", *flags, "--out", report, "--runs-dir", runs],
                            expected, outputs=(runs, report))


@pytest.mark.parametrize("flags, expected", [
    (["--policies", "static,"], "--policies: empty entry in 'static,'"),
    (["--policies", "static,,swap-aware"], "--policies: empty entry in 'static,,swap-aware'"),
    (["--policies", "static,static"], "--policies: 'static' is there twice in 'static,static' (give each policy once)"),
    (["--seed-list", "1,,2"], "--seed-list: empty entry in '1,,2' (expected comma-separated whole numbers"),
    (["--seed-list", "1,"], "--seed-list: empty entry in '1,'"),
    (["--seed-list", ""], "--seed-list must name at least one seed, not ''"),  # ran seeds 1..3 instead
    (["--seed-list", "1,1"], "--seed-list: 1 is there twice in '1,1' (give each seed once)"),
    (["--seed-list", "1,01"], "--seed-list: 1 is there twice in '1,01'"),
    (["--seed-list", "1,x"], "--seed-list: expected comma-separated whole numbers from 0 to"),
    (["--seed-list", "1,-1"], "not '-1'"),
    (["--pareto", "--autoscalers", "none,"], "--autoscalers: empty entry in 'none,'"),
    (["--pareto", "--autoscalers", ",none"], "--autoscalers: empty entry in ',none'"),
    (["--pareto", "--autoscalers", ""], "--autoscalers must name at least one autoscaler, not ''"),
    (["--pareto", "--autoscalers", "none,none"], "--autoscalers: 'none' is there twice"),
])
def test_capacity_list_flags(tmp_path, flags, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused_leaving_nothing(["capacity", scenario, *flags, "--out", tmp_path / "o"], expected,
                            outputs=(tmp_path / "o",))


def test_comma_list_keeps_good_entries_in_order():
    from sim.cli.common import comma_list

    assert comma_list(" static , swap-aware", "--policies", str, "policy", "names") == ["static", "swap-aware"]
    assert comma_list("3,1,2", "--seed-list", int, "seed", "seeds") == [3, 1, 2]
    assert comma_list("a,a", "--policies", str, "policy", "names", unique=False) == ["a", "a"]


TRACE_GENERATE = ["trace", "generate", "--duration", "10", "--rate", "1"]


@pytest.mark.parametrize("flags, expected", [
    ([*TRACE_GENERATE, "--mix", "qwen3-8b=1,"], "--mix: empty entry in 'qwen3-8b=1,' (expected NAME=VALUE"),
    ([*TRACE_GENERATE, "--mix", "qwen3-8b=1,qwen3-8b=2"], "--mix: 'qwen3-8b' is given twice"),
    ([*TRACE_GENERATE, "--mix", "qwen3-8b"], "--mix: expected NAME=VALUE[,NAME=VALUE...], not 'qwen3-8b'"),
    ([*TRACE_GENERATE, "--zipf", "1", "--models", "qwen3-8b,,qwen2.5-3b"], "--models: empty entry in"),
    ([*TRACE_GENERATE, "--zipf", "1", "--models", "qwen3-8b,qwen3-8b"], "'qwen3-8b' is listed twice"),
    (["validate", "vllm", "scenarios/mixed.yaml", "--profile", "paper-rtx5000", "--loads", "1,,2"],
     "--loads: empty entry in '1,,2'"),
    (["validate", "vllm", "scenarios/mixed.yaml", "--profile", "paper-rtx5000", "--loads", "1,-2"],
     "--loads: expected comma-separated positive numbers, e.g. 0.5,1,2, not '-2'"),
])
def test_trace_and_validate_list_flags(tmp_path, flags, expected):
    out = tmp_path / "t.csv"
    refused_leaving_nothing([*flags, "--out", out], expected, outputs=(out,))


def test_trace_windows_refuse_an_empty_window(tmp_path):
    from sim.cli.trace_flags import parse_windows
    from sim.errors import MmsimError

    assert parse_windows("0:2,60:8:2") == [[0.0, 2.0], [60.0, 8.0, 2.0]]
    with pytest.raises(MmsimError, match="--windows: empty entry in '0:2,'"):
        parse_windows("0:2,")


# --- messages a walkthrough found unclear ------------------------------------------------------------------------

def _trace_scenario(tmp_path, trace: dict):
    return write_yaml(tmp_path / "s.yaml", tiny_scenario(workload={"trace": trace}))


@pytest.mark.parametrize("trace, expected", [
    ({"path": "t.csv", "format": "azure-2023"},
     "s.yaml: workload.trace: azure-2023 traces have no model column; name the model their requests are for"),
    ({"path": "t.csv", "format": "mooncake", "model_map": {"a": "qwen2.5-3b"}},
     "workload.trace: mooncake traces have no model column to map"),
    ({"path": ""}, "s.yaml: workload.trace.path: is empty; name a file"),
    ({"path": "."}, "is a folder, not an input file"),
])
def test_a_scenario_trace_that_cannot_be_read_names_the_field(tmp_path, trace, expected):
    write(tmp_path / "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n")
    refused(["run", _trace_scenario(tmp_path, trace), "--out", tmp_path / "o"], expected, out=tmp_path / "o")


def test_a_fifo_named_as_a_scenario_trace_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "t.csv")
    refused(["run", _trace_scenario(tmp_path, {"path": "t.csv"}), "--out", tmp_path / "o"],
            "workload.trace.path: ", "not a regular file (a device, FIFO or socket); expected an input file")


@pytest.mark.parametrize("flags, expected", [
    (["--process", "gamma", "--rate", "2"], "error: --cv is needed with --process gamma"),
    (["--process", "rate-series"], "error: --windows is needed with --process rate-series"),
    (["--process", "poisson"], "error: --rate is needed with --process poisson"),
    (["--process", "poisson", "--rate", "-1"], "error: --rate: "),
])
def test_trace_generate_names_the_flag_not_the_field(tmp_path, flags, expected):
    refused(["trace", "generate", *flags, "--mix", "a=1", "--duration", "5", "--out", tmp_path / "g.csv"], expected,
            out=tmp_path / "g.csv")


def test_trace_generate_from_a_trace_scenario_says_it_needs_a_generator(tmp_path):
    scenario = _trace_scenario(tmp_path, {"path": "t.csv"})
    refused(["trace", "generate", "--config", scenario, "--out", tmp_path / "g.csv"],
            "s.yaml: workload.trace: this workload replays a trace; trace generate needs a generator",
            out=tmp_path / "g.csv")


def test_a_scenario_given_to_sweep_is_named_as_one(tmp_path):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["sweep", scenario, "--out", tmp_path / "o"], "s.yaml: is a scenario, not a sweep file", out=tmp_path / "o")


@pytest.mark.parametrize("written", ["1e-3", "2E0", "5e+0"])
def test_a_yaml_number_in_exponent_form_without_a_dot_is_a_number(tmp_path, capsys, written):
    """PyYAML (YAML 1.1) reads ``1e-3`` as a string: a number field then said only "Input should be a valid number"."""
    from conftest import mmsim_in_process

    data = tiny_scenario()
    yaml_text = write_yaml(tmp_path / "s.yaml", data).read_text()
    text = yaml_text.replace("ttft_s: 2.0", f"ttft_s: {written}")
    assert text != yaml_text
    write(tmp_path / "s.yaml", text)
    code, out, err = mmsim_in_process(capsys, "run", tmp_path / "s.yaml", "--out", tmp_path / "o", "--json")
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "scenario.json").read_text())["slo"]["default"]["ttft_s"] == float(written)
