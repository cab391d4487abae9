"""What `mmsim run` prints: explained labels, drops per model and reason, warnings when the profile or load cannot
serve the scenario, and the next command last."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console

from sim.cli.run_summary import drops_by_model, next_command, print_run_summary, warnings

from conftest import MMSIM_CLI


def summary(**changes) -> dict:
    base = {
        "scenario": "mixed", "policy": "static", "seed": 7, "profile": "cpu-host",
        "requests_total": 2393, "requests_completed": 1960, "requests_dropped": 433,
        "drop_reasons": {"exceeds_max_model_len": 364, "not_scheduled": 69},
        "throughput_tokens_per_s": 300.0, "throughput_requests_per_s": 1.2, "goodput_requests_per_s": 0.4,
        "slo_attainment": 0.3, "ttft_s": {"p50": 0.5, "p90": 2.0, "p99": 9.0},
        "tpot_s": {"p50": 0.05, "p90": 0.06, "p99": 0.08}, "e2e_s": {"p50": 4.0, "p90": 9.0, "p99": 20.0},
        "preemptions": 12, "lost_seconds": {"reload": 8.7, "unload": 0.8, "kv_out": 0.03, "kv_in": 0.02,
                                            "recompute": 21.2, "waiting": 50.0},
        "loads": 9, "unloads": 5, "gpu_busy_share": 0.8, "simulated_seconds": 600.0, "sim_wall_seconds": 1.5,
        "per_model": {
            "qwen2.5-14b": {"requests": 400, "completed": 36, "max_model_len": 7040,
                            "drop_reasons": {"exceeds_max_model_len": 364}},
            "qwen3-8b": {"requests": 1993, "completed": 1924, "max_model_len": 32768,
                         "drop_reasons": {"not_scheduled": 69}},
        },
    }
    base.update(changes)
    return base


def printed(data: dict, requests: pd.DataFrame | None = None) -> str:
    console = Console(record=True, width=200)
    print_run_summary(console, data, requests, Path("scenarios/mixed.yaml"), Path("reports/runs/x"))
    return console.export_text()


def test_labels_explain_each_figure():
    text = printed(summary())
    assert "seconds paused" in text and "reload 8.7, unload 0.8, KV 0.05, recompute 21.2" in text
    assert "1,960 completed, 433 dropped" in text
    assert "goodput: req/s meeting every SLO" in text and "(drops are misses)" in text


def test_an_elastic_fleet_shows_the_busy_share_of_what_was_billed():
    """The GPU busy share counts every GPU an elastic pool may have, idle while its node is down (1.3% beside 4.1%
    of the time billed, in a reported queue-depth run): the billed share is printed beside it."""
    fleet = {"autoscaler": "queue-depth", "gpu_hours": 2.0, "cost_usd": 8.0, "cost_per_1k_requests_usd": 4.0,
             "scale_up": 3, "scale_down": 2, "cold_starts": 3, "nodes_provisioned": 2, "nodes_released": 1,
             "busy_share_of_billed": 0.0411}
    text = printed(summary(gpu_busy_share=0.0134, fleet=fleet))
    assert "time the GPUs were computing (all the cluster may have)" in text and "1.3%" in text
    row = next(line for line in text.splitlines() if "GPU busy share of the GPU time billed" in line)
    assert "4.1%" in row
    assert "GPU time billed" not in printed(summary(fleet={**fleet, "autoscaler": "none"}))


def test_drops_are_listed_per_model_with_reasons():
    text = printed(summary())
    row = next(line for line in text.splitlines() if "qwen2.5-14b" in line and "364" in line)
    assert "400" in row and "36" in row and "exceeds_max_model_len 364" in row
    assert "exceeds_max_model_len: prompt + output longer than max_model_len" in text


def test_an_unservable_profile_is_flagged():
    found = warnings(summary(), drops_by_model(summary()))
    assert found[0].startswith("qwen2.5-14b: 91% of requests exceed max_model_len 7,040 tokens")
    assert any(w.startswith("SLO attainment is 30.0%: profile cpu-host cannot meet") for w in found)
    assert not any("still waiting" in w for w in found)  # 69 of 2,393 is under the 5% backlog flag


def test_a_model_that_never_ran_is_named():
    data = summary(per_model={"llama-2-7b": {"requests": 64, "completed": 0, "drop_reasons": {"not_scheduled": 64}}},
                   slo_attainment=0.9)
    found = warnings(data, drops_by_model(data))
    assert found == ["llama-2-7b: no request ever ran under policy static (64 waited to the end): its instance never "
                     "had the KV room or the GPU time to start one, e.g. beside another deployment on its GPUs (a "
                     "swapping policy such as swap-aware serves every model)"]


def test_a_model_the_policy_never_placed_is_named():
    data = summary(per_model={"qwen2.5-7b": {"requests": 133, "completed": 0, "drop_reasons": {"not_placed": 133}}},
                   slo_attainment=0.9)
    assert warnings(data, drops_by_model(data)) == [
        "qwen2.5-7b: policy static gave it no GPU; 133 requests dropped (a swapping policy such as swap-aware "
        "serves every model)"]


def test_a_model_an_autoscaler_could_not_give_a_gpu_is_not_blamed_on_the_policy():
    """A fleet of six GPUs all given to one model's replicas: the other's 308 requests were said to be dropped by
    "policy static", which never decided anything there."""
    data = summary(per_model={"llama-3-8b": {"requests": 308, "completed": 0, "drop_reasons": {"not_placed": 308}}},
                   slo_attainment=0.9, fleet={"autoscaler": "queue-depth", "scale_blocked": 22})
    assert warnings(data, drops_by_model(data)) == [
        "llama-3-8b: never given a GPU, 308 requests dropped; the autoscaler queue-depth was blocked 22 times (no "
        "free GPU and every pool at max_nodes): raise max_nodes, or see the events' scale_blocked rows"]


def test_a_request_too_long_for_its_instances_gpu_is_explained():
    data = summary(per_model={"qwen3-8b": {"requests": 3, "completed": 2,
                                           "drop_reasons": {"exceeds_instance_max_model_len": 1}}}, slo_attainment=0.9)
    assert warnings(data, drops_by_model(data)) == [
        "qwen3-8b: 1 request within the deployment's max_model_len (sized on the largest GPU) but not the KV room of "
        "the instance given them, on a smaller GPU; route them to the larger GPUs (e.g. a policy file's route hook) "
        "or place the model there"]


def test_drop_reasons_come_from_requests_when_the_summary_lacks_them():
    data = summary(per_model={"a": {"requests": 3, "completed": 1}, "b": {"requests": 1, "completed": 1}})
    requests = pd.DataFrame({"model": ["a", "a", "a", "b"], "status": ["dropped", "dropped", "completed", "completed"],
                             "drop_reason": ["not_scheduled", "model_not_served", "", ""]})
    assert drops_by_model(data, requests) == {"a": {"not_scheduled": 1, "model_not_served": 1}}


def test_the_next_command_comes_last():
    text = printed(summary()).rstrip().splitlines()
    assert text[-1] == "next: mmsim compare scenarios/mixed.yaml --policies static,swap-aware,slo-aware --seeds 3"
    assert text[-2] == "results: reports/runs/x"
    assert next_command(summary(policy="swap-aware"), Path("s.yaml")).startswith(
        "mmsim compare s.yaml --policies swap-aware,slo-aware,static")
    # A trace's requests are the same whatever the seed: more seeds would only repeat the run.
    assert next_command(summary(policy="swap-aware", trace_rows={"rows_read": 3}), Path("s.yaml")) == \
        "mmsim compare s.yaml --policies swap-aware,slo-aware,static"


def test_mmsim_run_prints_the_summary_and_ends_with_the_next_command(tmp_path):
    scenario = tmp_path / "one.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "one", "seed": 1, "profile": "paper-rtx5000", "cluster": {"nodes": 1, "gpus_per_node": 1},
        "models": [{"name": "qwen2.5-3b"}],
        "workload": {"generator": {"duration_s": 5, "arrivals": {"process": "poisson", "rate_per_s": 2.0},
                                   "mix": {"qwen2.5-3b": 1.0}, "prompt_tokens": {"dist": "constant", "value": 100},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "slo": {"default": {"ttft_s": 2.0}}}))
    result = subprocess.run([*MMSIM_CLI, "run", str(scenario),
                             "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.rstrip().splitlines()
    assert "seconds paused" in result.stdout and lines[-2] == f"results: {tmp_path / 'run'}"
    assert lines[-1] == f"next: mmsim compare {scenario} --policies static,swap-aware,slo-aware --seeds 3"


def test_an_autoscaler_under_a_swapping_policy_is_warned_of():
    # Both place models: with --autoscaler on swap-aware the run made no decision of either's kind and said nothing.
    fleet = {"autoscaler": "queue-depth", "gpu_hours": 1.0, "cost_usd": 3.0, "scale_up": 0, "scale_down": 0}
    found = warnings(summary(policy="swap-aware", fleet=fleet), {})
    assert any("policy swap-aware loads and unloads models on its own: they fight over the GPUs" in w for w in found)
    assert not any("fight" in w for w in warnings(summary(policy="static", fleet=fleet), {}))
