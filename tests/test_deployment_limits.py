"""What a deployment's copies can hold, against what its scenario asks: MIG slices that must fit one GPU, an
instance's own ``max_model_len`` on a smaller GPU of a mixed fleet, and a deployment kept partly on the CPU
(``gpu_share``) under the policies that load and unload whole copies."""

from __future__ import annotations


import numpy as np
import pytest

from sim.errors import MmsimError
from sim.scenario import load_scenario, parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import REPO, assert_same_times, mmsim_in_process, wall_clock_limit

SWAPPING = ("fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware", "prefix-swap-aware")


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):
        yield


def one_gpu(mig: dict | None) -> dict:
    cluster = {"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64, **({"mig": mig} if mig else {})}
    return {"name": "mig", "seed": 1, "profile": "a100-80gb", "cluster": cluster, "models": [{"name": "qwen2.5-3b"}],
            "workload": {"generator": {"max_requests": 20, "arrivals": {"process": "poisson", "rate_per_s": 10.0},
                                       "mix": {"qwen2.5-3b": 1.0}, "prompt_tokens": {"dist": "constant", "value": 500},
                                       "output_tokens": {"dist": "constant", "value": 20}}},
            "slo": {"default": {"ttft_s": 2.0}}, "policy": {"name": "static"}}


@pytest.mark.parametrize("profile, slices", [("3g.40gb", 3), ("3g.40gb", 7), ("2g.20gb", 4), ("7g.80gb", 2)])
def test_more_mig_slices_than_one_gpu_holds_are_refused(profile, slices):
    """An A100-80GB has 7 compute slices and 80 GB: 2 of 3g.40gb, 3 of 2g.20gb, 7 of 1g.10gb (NVIDIA's MIG user
    guide). Seven 3g.40gb slices would be three GPUs' compute and 280 GB on one card."""
    with pytest.raises(MmsimError, match=r"do not fit one .*A100.*at most (1|2|3) fit") as refused:
        simulate(parse_scenario(one_gpu({"profile": profile, "slices_per_gpu": slices}), "mig"))
    assert refused.value.field == "cluster.mig.slices_per_gpu"


@pytest.mark.parametrize("profile, slices", [("3g.40gb", 2), ("2g.20gb", 3), ("1g.10gb", 7), ("7g.80gb", 1)])
def test_the_most_mig_slices_a_gpu_holds_serve_no_faster_than_the_whole_gpu(profile, slices):
    whole = simulate(parse_scenario(one_gpu(None), "whole")).summary
    split = simulate(parse_scenario(one_gpu({"profile": profile, "slices_per_gpu": slices}), "mig")).summary
    assert split["requests_completed"] == whole["requests_completed"] == 20
    # Slices share the GPU's SMs: their makespan is never shorter (equal for the one slice that is the whole GPU).
    assert split["makespan_s"] >= whole["makespan_s"] * (1 - 1e-9)


def test_mig_oversubscription_is_one_cli_message(tmp_path, capsys):
    import yaml

    path = tmp_path / "mig.yaml"
    path.write_text(yaml.safe_dump(one_gpu({"profile": "3g.40gb", "slices_per_gpu": 7})))
    code, out, err = mmsim_in_process(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and "Traceback" not in err
    assert "cluster.mig.slices_per_gpu" in err and "at most 2 fit" in err
    assert not (tmp_path / "out").exists()


def mixed_fleet(rows: list[tuple[float, str, int, int]], placement: str = "blind"):
    """One RTX 5000 (32 GB) and one H100 (80 GB): Qwen3-8B's KV room beside its weights is ~88,000 tokens on the
    first and ~400,000 on the second, so its deployment's max_model_len (the largest GPU's) is ~400,000."""
    scenario = parse_scenario({
        "name": "fleet-long", "seed": 1, "profile": "h100-sxm",
        "cluster": {"placement": placement, "pools": [
            {"name": "small", "profile": "paper-rtx5000", "nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64},
            {"name": "big", "profile": "h100-sxm", "nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64}]},
        "models": [{"name": "qwen3-8b"}, {"name": "llama-3-8b"}],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {"qwen3-8b": 1.0}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}},
        "slo": {"default": {"ttft_s": 2.0}}, "policy": {"name": "static"}}, "fleet-long")
    arrivals, models, prompts, outputs = zip(*rows)
    chunk = RequestChunk(np.array(arrivals), np.array(models), np.array(prompts), np.array(outputs))
    return scenario, chunk


LONG_ON_SMALL = [(100.0, "qwen3-8b", 150_000, 10), (100.5, "qwen3-8b", 100, 10), (101.0, "qwen3-8b", 100, 10)]


@pytest.mark.parametrize("policy", ["static", "fcfs-swap"])
def test_a_request_too_long_for_its_instances_gpu_is_dropped_there_not_left_blocking_the_queue(policy):
    """Blind placement puts Qwen3-8B on the RTX 5000. The 150,010-token request is within the deployment's limit
    (sized on the H100) but can never get its KV blocks there: before, it sat at the head of the queue and the two
    100-token requests behind it waited to the end (all three `not_scheduled`)."""
    scenario, chunk = mixed_fleet(LONG_ON_SMALL)
    runs = [simulate(scenario, chunks=[chunk], policy=policy, mode=mode) for mode in ("fast", "exact")]
    fast = runs[0].requests.set_index("id").sort_index()
    assert list(fast["status"]) == ["dropped", "completed", "completed"]
    assert fast["drop_reason"].iloc[0] == "exceeds_instance_max_model_len"
    assert (fast["gpu"].iloc[1:] == 0).all()  # served on the small GPU, where the long one could not be
    assert (fast["e2e_s"].iloc[1:] < 1.0).all()  # ten tokens of an 8B model on an idle GPU
    assert_same_times(fast.iloc[1:], runs[1].requests.set_index("id").sort_index().iloc[1:], label=policy)
    assert runs[0].summary["per_model"]["qwen3-8b"]["drop_reasons"] == {"exceeds_instance_max_model_len": 1}


def test_a_request_too_long_for_every_gpu_is_still_refused_at_arrival():
    scenario, chunk = mixed_fleet([(1.0, "qwen3-8b", 600_000, 10), (2.0, "qwen3-8b", 100, 10)])
    frame = simulate(scenario, chunks=[chunk]).requests.set_index("id").sort_index()
    assert list(frame["drop_reason"]) == ["exceeds_max_model_len", ""]
    assert frame["status"].iloc[1] == "completed"


@pytest.mark.parametrize("policy", ["static", *SWAPPING])
@pytest.mark.parametrize("placement", ["blind", "hardware-aware"])
def test_no_policy_leaves_a_request_that_its_instance_cannot_hold_in_a_queue(policy, placement):
    scenario, chunk = mixed_fleet(LONG_ON_SMALL + [(102.0, "llama-3-8b", 120_000, 5), (103.0, "llama-3-8b", 50, 5)],
                                  placement)
    frame = simulate(scenario, chunks=[chunk], policy=policy).requests.set_index("id").sort_index()
    short = frame["prompt_tokens"] < 1000
    assert (frame.loc[short, "status"] == "completed").all(), frame
    # A long request runs where its instance holds it, or is dropped there with that reason: never left waiting.
    assert set(frame.loc[frame["status"] == "dropped", "drop_reason"]) <= {"exceeds_instance_max_model_len"}


@pytest.mark.parametrize("policy", SWAPPING)
def test_swapping_policies_load_a_deployment_that_fits_only_partly_offloaded(policy):
    """`offload.yaml`'s Qwen3-32B (17.2 GiB in 4-bit) fits no 16 GB GPU whole; its deployment keeps 40% of its
    layers on the CPU. The policies that load and unload models used to load whole copies only, so every one of
    its requests ended `not_placed` (and, before the scenario said `gpu_share`, `model_exceeds_gpu`)."""
    path = REPO / "scenarios" / "offload.yaml"
    scenario = load_scenario(path)
    result = simulate(scenario, base_dir=path.parent, policy=policy)
    assert result.summary["requests_dropped"] == 0
    per_model = result.summary["per_model"]["qwen3-32b"]
    assert per_model["completed"] == per_model["requests"] > 0
    loads = result.events[(result.events["kind"] == "load") & (result.events["model"] == "qwen3-32b")]
    shares = loads["detail"].str.extract(r"share=([0-9.]+)")[0].astype(float)
    assert len(shares)
    # Whole copies at the deployment's share; offload-aware's partial copies below it.
    assert (shares <= 0.6).all() if policy == "offload-aware" else (shares == 0.6).all()
