"""The engine's preemption mechanisms, checked against costs computed by hand from the profile."""

from __future__ import annotations

import numpy as np
import pytest

from sim.catalogue import get_model
from sim.costs import ModelCosts
from sim.policies.base import Policy
from sim.policies.contract import PolicyContractError
from sim.profile import load_profile
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk


def model_costs(name: str, profile: str = "paper-rtx5000") -> ModelCosts:
    return ModelCosts(load_profile(profile), get_model(name))


def one_model_scenario(model: str) -> object:
    # The paper's one-request setting: a small token budget, so Qwen2.5-14B and its activation reserve fit
    # the 32 GB RTX 5000 (at vLLM's defaults, 8,192 tokens and 256 sequences, they do not).
    return parse_scenario({
        "name": "mechanism", "profile": "paper-rtx5000",
        "cluster": {"nodes": 1, "gpus_per_node": 1},
        "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 2048},
        "models": [{"name": model}],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {model: 1.0}, "prompt_tokens": {"dist": "constant", "value": 500},
                                   "output_tokens": {"dist": "constant", "value": 400}}},
    }, "test")


def single_request(model: str, arrival_s: float = 10.0, prompt: int = 500, output: int = 400):
    return [RequestChunk(np.array([arrival_s]), np.array([model]), np.array([prompt]), np.array([output]))]


class PreemptAt(Policy):
    """Test policy: the model is loaded at time 0; the running request is preempted by KV swap at each given time."""

    name = "preempt-at"

    @classmethod
    def param_defaults(cls) -> dict:
        return {"times_s": (), "mode": "swap"}

    def setup(self, view) -> None:
        self.context_tokens = []
        view.load(0, view.gpus[0])
        for time_s in self.times_s:
            view.call_at(time_s, self.preempt)

    def preempt(self, view) -> None:
        instance = view.instances_of(0, ready_only=True)[0]
        view.sync(instance.gpu)
        if instance.running:
            request = instance.running[0]
            self.context_tokens.append(request.prompt_tokens + instance.generated(request))
            view.preempt(instance, request, self.mode)


def run_with(policy: Policy, model: str):
    """Simulate one request under this policy instance (registered for the call only)."""
    from sim.policies import registry
    registry._REGISTRY[policy.name] = lambda **_: policy
    try:
        return simulate(one_model_scenario(model), policy=policy.name, chunks=single_request(model))
    finally:
        del registry._REGISTRY[policy.name]


def test_kv_swap_of_n_bytes_costs_latency_plus_bytes_over_bandwidth():
    costs = model_costs("llama-2-13b")  # no per-model override in the profile: the link fit applies
    link = costs.profile.link.device_to_host
    tokens = 1234
    n_bytes = tokens * costs.kv_bytes_per_token
    by_hand = link.latency_s + 2 * costs.num_layers * link.per_copy_latency_s + n_bytes / link.bandwidth_bytes_per_s
    assert costs.kv_transfer_s(tokens, "device_to_host") == pytest.approx(by_hand, rel=1e-12)


def test_engine_charges_one_kv_swap_out_and_in():
    policy = PreemptAt(times_s=(12.0,))
    result = run_with(policy, "qwen2.5-3b")
    costs = model_costs("qwen2.5-3b")
    tokens = policy.context_tokens[0] + 1  # the iteration running when the policy asked ends first, with its token
    row = result.requests.iloc[0]
    assert row["lost_kv_out_s"] == pytest.approx(costs.kv_transfer_s(tokens, "device_to_host"), rel=1e-12)
    assert row["lost_kv_in_s"] == pytest.approx(costs.kv_transfer_s(tokens, "host_to_device"), rel=1e-12)
    assert row["status"] == "completed"


def test_reload_of_qwen_14b_on_rtx5000_is_the_published_6_70_s():
    costs = model_costs("qwen2.5-14b")
    assert costs.reload_s() == pytest.approx(6.70, abs=1e-9)
    result = run_with(PreemptAt(), "qwen2.5-14b")
    loads = result.events[result.events["kind"] == "load"]
    assert len(loads) == 1 and loads["duration_s"].iloc[0] == pytest.approx(6.70, abs=1e-9)


def test_offloaded_decode_matches_the_papers_figure_4_and_slows_as_layers_leave_the_gpu():
    # Published (Figure 4, RTX 5000, Q4): at 80% of layers on the GPU, Llama-3-8B keeps < 60% of its decode
    # throughput and Llama-2-70B > 85%.
    for name, published_ok in (("llama-3-8b", lambda kept: kept < 0.60), ("llama-2-70b", lambda kept: kept > 0.85)):
        costs = ModelCosts(load_profile("paper-rtx5000"), get_model(name), "q4")
        kept = costs.decode_step_s(1, 500, 1.0) / costs.decode_step_s(1, 500, 0.8)
        assert published_ok(kept), (name, kept)
        steps = [costs.decode_step_s(1, 500, share / 10) for share in range(10, 0, -1)]
        assert steps == sorted(steps), name  # every layer moved to the CPU costs time


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_request_preempted_k_times_carries_k_recorded_pauses(mode):
    times = (11.0, 13.0, 15.0)
    result = run_with(PreemptAt(times_s=times, mode=mode), "qwen2.5-3b")
    row = result.requests.iloc[0]
    events = result.events
    pauses = events[events["kind"].str.startswith("preempt_") & (events["request_id"] == row["id"])]
    assert len(pauses) == len(times) == row["preemptions"]
    assert set(pauses["kind"]) == {f"preempt_{mode}"}
    assert row["status"] == "completed"


class PreemptWaiting(PreemptAt):
    """Test policy: asks to preempt a request that has arrived but not yet started."""

    name = "preempt-waiting"

    def preempt(self, view) -> None:
        instance = view.instances_of(0)[0]
        view.preempt(instance, instance.waiting[0], self.mode)


def test_preempting_a_request_that_is_not_decoding_is_refused():
    # The view refuses it; raised inside the policy's own code, that ends the run as one line naming it.
    with pytest.raises(PolicyContractError, match="policy 'preempt-waiting' .* raised ValueError: only a request "
                                                  "decoding on this instance can be preempted"):
        run_with(PreemptWaiting(times_s=(10.0,)), "qwen2.5-3b")  # the request arrives at 10 s and waits a step


def preempted_run(times_s, mode: str, chunks=None):
    """One qwen2.5-3b request preempted by the policy at ``times_s``; its row, and the context of each preemption
    (the request's tokens when the policy asked, and the one the step then running adds)."""
    policy = PreemptAt(times_s=times_s, mode=mode)
    from sim.policies import registry
    registry._REGISTRY[policy.name] = lambda **_: policy
    try:
        result = simulate(one_model_scenario("qwen2.5-3b"), policy=policy.name,
                          chunks=chunks or single_request("qwen2.5-3b"))
    finally:
        del registry._REGISTRY[policy.name]
    return result.requests.iloc[0], [tokens + 1 for tokens in policy.context_tokens]


def test_a_policys_swap_delays_its_request_by_the_swap_out_and_the_swap_in():
    # Asked at 12 s, mid-iteration: the iteration ends with its token, the KV leaves over the link (d), comes
    # back (h), and the request decodes on as before: it finishes d + h later, however the engine batches
    # its iterations. (A swap-in that did not wait for the swap-out, and a lost token, gave h + one iteration.)
    plain = preempted_run((), "swap")[0]
    row, contexts = preempted_run((12.0,), "swap")
    costs = model_costs("qwen2.5-3b")
    out_s, in_s = (costs.kv_transfer_s(contexts[0], way) for way in ("device_to_host", "host_to_device"))
    assert row["finish_s"] - plain["finish_s"] == pytest.approx(out_s + in_s, rel=1e-9)
    assert row["generated_tokens"] == plain["generated_tokens"] and row["preemptions"] == 1


def test_swapping_a_request_over_and_over_loses_no_more_than_its_time():
    # Every 50 ms for 4 s: each swap-out must end before its swap-in starts, so the pauses never overlap and
    # the time lost to them is part of the request's time (lost_kv_out_s was 2.6 times e2e_s).
    times = tuple(11.0 + 0.05 * k for k in range(80))
    plain = preempted_run((), "swap")[0]
    row, contexts = preempted_run(times, "swap")
    costs = model_costs("qwen2.5-3b")
    lost = row[["lost_kv_out_s", "lost_kv_in_s", "lost_waiting_s"]].sum()
    assert row["preemptions"] == len(times) and lost <= row["e2e_s"] - plain["e2e_s"] + 1e-9
    swaps_s = sum(costs.kv_transfer_s(tokens, way) for tokens in contexts for way in ("device_to_host", "host_to_device"))
    assert row["finish_s"] - plain["finish_s"] == pytest.approx(swaps_s, rel=1e-9)


def test_a_recompute_that_finds_its_prompt_cached_is_charged_only_what_it_computes():
    # A 1,024-token prompt named by two 512-token prefix ids: recomputed, its 64 prompt blocks are still in the
    # prefix cache, so only its generated tokens are prefilled again, over the cached prompt.
    chunks = [RequestChunk(np.array([10.0]), np.array(["qwen2.5-3b"], object), np.array([1024]), np.array([400]),
                           prefix_ids=np.array([(1, 2), None], object)[:-1])]
    row, contexts = preempted_run((12.0,), "recompute", chunks)
    generated = contexts[0] - 1024
    assert generated > 50
    costs = model_costs("qwen2.5-3b")
    assert row["lost_recompute_s"] == pytest.approx(costs.prefill_s(generated, 1.0, context_before=1024), rel=1e-12)
    assert row["lost_recompute_s"] < costs.prefill_s(contexts[0]) / 2  # what was charged before: the whole context
