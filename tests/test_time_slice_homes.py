"""``time-slice``'s homes: a pinned model's home is among its pins, a tensor- or pipeline-parallel model's is the
first GPU of a whole aligned group, and models whose spans overlap take turns on them as one group.

On ``scenarios/large-models.yaml`` the policy once gave qwen3-8b (pinned to GPU 3) the second GPU of the
tensor-parallel 70B, where it could never load: none of its requests was served, and the 70B was unloaded and
reloaded for it every quantum.
"""

from __future__ import annotations

from pathlib import Path

from sim.policies.time_slice import home_groups
from sim.scenario import parse_scenario
from sim.simulation import build_engine

from conftest import simulate_within_memory, wall_clock_limit
from test_engine_random import chunk

LIMIT_S = 120
"""Wall seconds a test's runs may take (each takes about a second)."""


def scenario(models: list[dict], quantum_s: float = 5.0) -> object:
    """``models`` under time-slice on one node of four H100s (80 GB: any two of these models' weights fit one)."""
    names = [m["name"] for m in models]
    return parse_scenario({
        "name": "time-slice-homes", "seed": 1, "profile": "h100-sxm",
        "cluster": {"nodes": 1, "gpus_per_node": 4, "host_memory_gb": 256}, "models": models,
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {name: 1.0 for name in names}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "slo": {"default": {"ttft_s": 2.0}}, "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 2048},
        "policy": {"name": "time-slice", "params": {"quantum_s": quantum_s}}}, "time-slice-homes")


def homes_and_groups(models: list[dict]) -> tuple[dict[str, int], list[list[str]]]:
    """:func:`home_groups` of ``models``' scenario, by name: model → home GPU index, and the groups."""
    _, engine = build_engine(scenario(models), Path("."), "time-slice", {})
    homes, groups = home_groups(engine.view)
    names = [m["name"] for m in models]
    return {names[m]: gpu.index for m, gpu in homes.items()}, [[names[m] for m in group] for group in groups]


def test_pins_and_parallel_spans_decide_homes_and_overlapping_spans_share_a_group():
    # Weights (GB): qwen2.5-14b 29.5 (14.8 on each of its two GPUs), llama-3-8b 16.1, qwen2.5-7b 15.2,
    # mistral-7b 14.5, qwen2.5-3b 6.2 (3.1 a GPU). The pinned ones go first:
    #   qwen2.5-14b at TP2, pinned to GPU 1: its aligned pair is GPUs 0-1, home 0;
    #   llama-3-8b pinned to GPU 1, inside that pair: home 1, the same group;
    #   mistral-7b pinned to GPUs 2 and 3, both empty: the lower, 2.
    # Then the others, heaviest first, where the most loaded GPU of the span has least weight:
    #   qwen2.5-7b: GPU 3 (GPU 0 has 14.8 GB, GPU 1 30.9, GPU 2 14.5, GPU 3 none);
    #   qwen2.5-3b at TP2: GPUs 2-3 (at most ~15 GB there, ~31 on GPUs 0-1), which joins mistral-7b's group and
    #   qwen2.5-7b's into one.
    homes, groups = homes_and_groups([
        {"name": "qwen2.5-14b", "tensor_parallel": 2, "gpus": [1]}, {"name": "llama-3-8b", "gpus": [1]},
        {"name": "qwen2.5-7b"}, {"name": "mistral-7b", "gpus": [2, 3]}, {"name": "qwen2.5-3b", "tensor_parallel": 2}])
    assert homes == {"qwen2.5-14b": 0, "llama-3-8b": 1, "mistral-7b": 2, "qwen2.5-7b": 3, "qwen2.5-3b": 2}
    assert groups == [["qwen2.5-14b", "llama-3-8b"], ["qwen2.5-7b", "mistral-7b", "qwen2.5-3b"]]


def test_a_model_pinned_to_several_gpus_takes_the_one_with_least_weight_and_unpinned_ones_avoid_pins():
    # qwen3-8b pinned to GPU 0 goes first; llama-3-8b, pinned to GPUs 0 and 1, takes the empty 1. The unpinned
    # mistral-7b then takes GPU 2 and qwen2.5-3b GPU 3, each alone: four groups of one, nothing rotates.
    homes, groups = homes_and_groups([
        {"name": "mistral-7b"}, {"name": "llama-3-8b", "gpus": [0, 1]}, {"name": "qwen3-8b", "gpus": [0]},
        {"name": "qwen2.5-3b"}])
    assert homes == {"qwen3-8b": 0, "llama-3-8b": 1, "mistral-7b": 2, "qwen2.5-3b": 3}
    assert groups == [["qwen3-8b"], ["llama-3-8b"], ["mistral-7b"], ["qwen2.5-3b"]]


def test_pinned_models_beside_a_tensor_parallel_one_are_served_on_their_own_gpus_without_a_swap():
    # large-models.yaml in small: a TP2 model pinned to GPU 0, two one-GPU models pinned to GPUs 2 and 3. All
    # three stay resident (three loads, no unload) and each request runs on its model's pinned GPU.
    models = [{"name": "qwen2.5-7b", "tensor_parallel": 2, "gpus": [0]}, {"name": "llama-3-8b", "gpus": [2]},
              {"name": "qwen3-8b", "gpus": [3]}]
    rows = [(0.5, name, 200, 100, ()) for name in ("qwen2.5-7b", "llama-3-8b", "qwen3-8b") * 3]
    with wall_clock_limit(LIMIT_S):
        result = simulate_within_memory(scenario(models), chunk(rows), None)
    requests = result.requests
    assert (requests["status"] == "completed").all()
    assert requests.groupby("model")["gpu"].unique().map(list).to_dict() == {
        "qwen2.5-7b": [0], "llama-3-8b": [2], "qwen3-8b": [3]}
    assert (result.summary["loads"], result.summary["unloads"]) == (3, 0)


def test_a_one_gpu_model_on_a_tensor_parallel_span_takes_turns_with_it_and_a_model_elsewhere_stays():
    # qwen2.5-7b at TP2 on GPUs 0-1 and qwen2.5-3b pinned to GPU 1 form one group: a GPU holds instances of one
    # span only, so they take turns. llama-3-8b (unpinned) gets GPU 2, which neither uses.
    quantum_s = 2.0
    models = [{"name": "qwen2.5-7b", "tensor_parallel": 2, "gpus": [0]}, {"name": "qwen2.5-3b", "gpus": [1]},
              {"name": "llama-3-8b"}]
    rows = ([(0.0, "qwen2.5-7b", 100, 2000, ())] * 2 + [(0.0, "qwen2.5-3b", 100, 50, ())] * 2
            + [(0.0, "llama-3-8b", 100, 3000, ())] * 2)
    with wall_clock_limit(LIMIT_S):
        result = simulate_within_memory(scenario(models, quantum_s), chunk(rows), None)
    requests, events = result.requests, result.events
    assert (requests["status"] == "completed").all()
    assert requests.groupby("model")["gpu"].unique().map(list).to_dict() == {
        "qwen2.5-7b": [0], "qwen2.5-3b": [1], "llama-3-8b": [2]}
    moves = events[events["kind"].isin(["load", "unload"])]
    seen = [(kind, model) for kind, model in zip(moves["kind"], moves["model"])]
    assert seen[:5] == [("load", "qwen2.5-7b"), ("load", "llama-3-8b"), ("unload", "qwen2.5-7b"),
                        ("load", "qwen2.5-3b"), ("unload", "qwen2.5-3b")]
    assert seen[5:] == [("load", "qwen2.5-7b")]  # back for the rest of its 2,000 tokens once qwen2.5-3b is done
    first_load, _, unload, small_load, _ = [row for _, row in moves.head(5).iterrows()]
    # The TP2 model, busy for far longer than a quantum, is unloaded one quantum after its load ends (as the
    # decode step running then ends: a few milliseconds); the one-GPU model's load starts as that unload ends.
    quantum_end_s = first_load["duration_s"] + quantum_s
    assert quantum_end_s <= unload["time_s"] < quantum_end_s + 0.05
    assert abs(small_load["time_s"] - (unload["time_s"] + unload["duration_s"])) < 1e-9
    assert small_load["gpu"] == 1
    # llama-3-8b is loaded once and never unloaded, though its requests outlast every turn on GPUs 0-1.
    assert seen.count(("load", "llama-3-8b")) == 1 and ("unload", "llama-3-8b") not in seen
    assert requests.loc[requests["model"] == "llama-3-8b", "finish_s"].min() > moves["time_s"].max()
