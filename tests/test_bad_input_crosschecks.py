"""Bad input found only by checking one part of the input against another: a model pinned to GPUs the cluster
lacks, a policy a scenario names, the runs a comparison would repeat. Helpers are test_bad_input.py's."""

from __future__ import annotations

import pytest

from tests.test_bad_input import refused, tiny_scenario, write_yaml


@pytest.mark.parametrize("policy", ["static", "swap-aware"])
@pytest.mark.parametrize("cluster, gpus, expected", [
    ({"nodes": 1, "gpus_per_node": 1}, [5], "GPU 5 is not in the cluster, whose GPUs are 0 to 0"),
    ({"pools": [{"name": "a", "nodes": 1, "min_nodes": 1, "max_nodes": 2, "gpus_per_node": 1}]}, [1],
     "GPU 1 is on node 1, which is down at the start"),
])
def test_pinned_gpus_must_serve_from_the_start(tmp_path, policy, cluster, gpus, expected):
    """A pin past the cluster was a KeyError traceback under static and silently ignored under swap-aware."""
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(cluster=cluster, policy={"name": policy},
                                                             models=[{"name": "qwen2.5-3b", "gpus": gpus}]))
    refused(["run", scenario, "--out", tmp_path / "o"], "models.qwen2.5-3b.gpus", expected, out=tmp_path / "o")


def test_a_gpu_pinned_twice_is_refused(tmp_path):
    """``gpus: [0, 0]`` loaded two instances of the model on GPU 0 without a word."""
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(cluster={"nodes": 1, "gpus_per_node": 2},
                                                             models=[{"name": "qwen2.5-3b", "gpus": [0, 1, 0]}]))
    refused(["run", scenario, "--out", tmp_path / "o"], "gpus", "GPU 0 is listed twice", out=tmp_path / "o")


def test_a_field_checked_as_the_run_builds_its_cluster_names_the_scenario_file(tmp_path):
    """``max_model_len`` beyond the KV room is found only once the cluster is built: the message named the field alone."""
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(models=[{"name": "qwen2.5-3b", "max_model_len": 10**8}]))
    refused(["run", scenario, "--out", tmp_path / "o"], f"{scenario}: models.qwen2.5-3b: max_model_len 100,000,000 is more",
            out=tmp_path / "o")


def test_a_misspelt_policy_in_a_sweep_axis_is_refused_before_any_run(tmp_path):
    """The sweep ran, recorded a failed run for the misspelt name and exited 1, leaving a sweep folder."""
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    sweep = write_yaml(tmp_path / "sw.yaml", {"base": "s.yaml", "axes": {"policy.name": ["static", "statc"]}})
    refused(["sweep", sweep, "--out", tmp_path / "o", "-q"], "run statc-", "policy: unknown policy 'statc'",
            out=tmp_path / "o")


@pytest.mark.parametrize("policy, expected", [
    ({"name": "statik"}, "policy: unknown policy 'statik'"),
    ({"name": "static", "params": {"benefit_ratio": 2.0}}, "policy: bad parameters for policy 'static'"),
])
def test_the_scenarios_policy_is_checked_when_it_is_read(tmp_path, policy, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(policy=policy))
    refused(["run", scenario, "--out", tmp_path / "o"], f"{scenario}: {expected}", out=tmp_path / "o")


def test_a_policy_compared_twice_is_refused_before_any_run(tmp_path):
    """compare ran `static` into its folder, ran it again, then refused the pair, leaving the runs behind."""
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["compare", scenario, "--policies", "static,swap-aware,static", "--out", tmp_path / "r.html",
             "--runs-dir", tmp_path / "runs"], "'static' and 'static'", "give each policy once", out=tmp_path / "runs")


@pytest.mark.parametrize("seed, seeds, expected", [
    (1, "99999999999999999999", "--seeds must be from 1 to 1000"),  # built a list of 1e20 runs: a hang
    (2**63 - 1, "2", "passes the largest seed"),
])
def test_compare_seeds_are_bounded(tmp_path, seed, seeds, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(seed=seed))
    refused(["compare", scenario, "--policies", "static", "--seeds", seeds, "--out", tmp_path / "r.html",
             "--runs-dir", tmp_path / "runs"], expected, out=tmp_path / "runs", timeout_s=20)


@pytest.mark.parametrize("flags, expected", [
    (["--policies", ""], "--policies must name at least one policy"),  # searched the scenario's policy instead
    (["--policies", "static,static"], "'static' is there twice"),  # searched and answered twice
    (["--seed-list", "1", "--seeds", "2"], "give --seeds or --seed-list, not both"),  # --seeds was ignored
])
def test_capacity_flags_that_contradict_or_repeat(tmp_path, flags, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["capacity", scenario, *flags, "--out", tmp_path / "o"], expected, out=tmp_path / "o")


@pytest.mark.parametrize("axes, expected", [
    ({"load": [1, 1.0]}, "axis 'load' lists a value twice (1 and 1.0 are one value)"),
    ({"gpus": [2.0, 2]}, "axis 'gpus' lists a value twice"),
    ({"workload.generator.duration_s": [5, 5.0]}, "lists a value twice"),
    ({"gpus": [1, 1.5]}, "axis 'gpus' needs whole numbers of GPUs, not 1.5"),
])
def test_a_sweep_axis_value_given_twice_as_equal_numbers_is_refused(tmp_path, axes, expected):
    """``load: [1, 1.0]`` ran the same scenario twice under two run ids."""
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    sweep = write_yaml(tmp_path / "sw.yaml", {"base": "s.yaml", "axes": axes})
    refused(["sweep", sweep, "--out", tmp_path / "o", "-q"], expected, out=tmp_path / "o")


@pytest.mark.parametrize("changes, field, expected", [
    # Each was taken: a blank name named the runs " ", an alias with a comma could not be given in --mix, and an
    # empty pin list placed the model as if unpinned.
    ({"name": "   "}, "name", "must not be empty or blank"),
    ({"models": [{"name": "qwen2.5-3b", "alias": "a,b"}]}, "models.0.alias", "'a,b' cannot name a deployment"),
    ({"models": [{"name": "qwen2.5-3b", "gpus": []}]}, "models.0.gpus", "lists no GPU"),
])
def test_a_scenario_name_alias_or_pin_list_that_names_nothing_is_refused(tmp_path, changes, field, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(**changes))
    refused(["run", scenario, "--out", tmp_path / "o"], f"{field}: {expected}", out=tmp_path / "o")
